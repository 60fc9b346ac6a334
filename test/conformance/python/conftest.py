"""Fixtures of the Python conformance runner (test/conformance/scenarios.md).

Run from the repo root:

    /usr/bin/python3 -m pytest test/conformance/python -q

The library comes from client/python (put first on sys.path here, so the
generated top-level package in gen/python cannot shadow it).
"""

import hashlib
import os
import re
import secrets
import shutil
import sys
import tempfile
import types
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, HERE)

import pytest  # noqa: E402

import cluster as cluster_mod  # noqa: E402
import lockbroker  # noqa: E402
import pki as pki_mod  # noqa: E402

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


@pytest.fixture(scope="session")
def secure(cluster):
    """S7's brokers, on the shared Consul: `tls` serves TLS with a server
    certificate of a CA made here; `mtls` also requires a client certificate
    of that CA. Both read one tenants file: tenant `payments` (prefix
    `payments/`) is the bearer `token` and `cn:payments-api`, the client
    certificate's Common Name. Also `pki` (the PEM paths, `other_ca` a CA
    that signed nothing here)."""
    d = tempfile.mkdtemp(prefix="lockbroker-conformance-s7-")
    try:
        pki = pki_mod.PKI(d, client_cn="payments-api")
        token = secrets.token_hex(32)
        tenants = os.path.join(d, "tenants.yaml")
        with open(tenants, "w", encoding="utf-8") as f:
            f.write("tenants:\n"
                    "  - name: payments\n"
                    f'    identities: ["token-sha256:{hashlib.sha256(token.encode()).hexdigest()}", '
                    f'"cn:{pki.client_cn}"]\n'
                    '    prefixes: ["payments/"]\n')
        flags = ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tenants", tenants]
        tls = cluster.broker("s7-tls", args=flags)
        mtls = cluster.broker("s7-mtls", args=flags + ["--tls-client-ca", pki.ca])
    except (RuntimeError, cluster_mod.SetupError) as e:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail(f"S7 setup: {e}")
    try:
        yield types.SimpleNamespace(pki=pki, token=token, tls=tls, mtls=mtls)
    finally:
        tls.stop()
        mtls.stop()
        shutil.rmtree(d, ignore_errors=True)


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


_SCENARIO_TEST = re.compile(r"^test_(aio_)?s\d+_")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Every scenario runs: a scenario test that skips (an id scenarios.md
    lists, S7 included) is reported as failed, with the skip's reason."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and _SCENARIO_TEST.match(item.name) and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"scenario tests must run, not skip: {reason}"


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("conformance figures (Python)")
    for name, value, unit in _FIGURES:
        terminalreporter.write_line(f"{name}: {value:.3f} {unit}" if isinstance(value, float) else f"{name}: {value}")
