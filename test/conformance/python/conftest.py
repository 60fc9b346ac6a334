"""Fixtures of the Python conformance runner (test/conformance/scenarios.md).

Run from the repo root:

    /usr/bin/python3 -m pytest test/conformance/python -q

The library comes from client/python (put first on sys.path here, so the
generated top-level package in gen/python cannot shadow it).
"""

import os
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, HERE)

import pytest  # noqa: E402

import cluster as cluster_mod  # noqa: E402
import lockbroker  # noqa: E402

assert os.path.dirname(lockbroker.__file__).startswith(os.path.join(REPO, "client", "python")), lockbroker.__file__

_FIGURES = []


@pytest.fixture(scope="session")
def figure():
    """figure(name, value, unit="s") records a measured figure for the
    summary at the end of the run."""
    def record(name, value, unit="s"):
        _FIGURES.append((name, value, unit))
    return record


@pytest.fixture(scope="session")
def cluster():
    try:
        c = cluster_mod.Cluster()
    except cluster_mod.SetupError as e:
        pytest.fail(str(e))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def broker(cluster):
    """The shared replica; scenarios that stop or kill one start their own."""
    return cluster.broker("shared")


@pytest.fixture
def client(broker):
    with lockbroker.Client(broker.addr) as c:
        yield c


@pytest.fixture
def other(broker):
    """A second, independent client (its own connection)."""
    with lockbroker.Client(broker.addr) as c:
        yield c


@pytest.fixture
def key(request):
    name = request.node.name.replace("[", "-").replace("]", "")
    return f"conformance/py/{name}/{uuid.uuid4().hex[:8]}"


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("conformance figures (Python)")
    for name, value, unit in _FIGURES:
        terminalreporter.write_line(f"{name}: {value:.3f} {unit}" if isinstance(value, float) else f"{name}: {value}")
