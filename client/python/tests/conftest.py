"""Fixtures of the Python library's own tests.

Run from the repo root:

    /usr/bin/python3 -m pytest client/python/tests -q

The live tests use the conformance runner's process harness
(test/conformance/python/cluster.py): a real Consul dev agent and broker
replicas.
"""

import os
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
sys.path.insert(0, PKG)
sys.path.insert(0, os.path.join(REPO, "test", "conformance", "python"))

import pytest  # noqa: E402

import lockbroker  # noqa: E402

assert os.path.dirname(lockbroker.__file__) == os.path.join(PKG, "lockbroker"), lockbroker.__file__


@pytest.fixture(scope="session")
def cluster():
    import cluster as cluster_mod
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
    return cluster.broker("shared")


@pytest.fixture
def client(broker):
    with lockbroker.Client(broker.addr) as c:
        yield c


@pytest.fixture
def key(request):
    name = request.node.name.replace("[", "-").replace("]", "")
    return f"py-lib/{name}/{uuid.uuid4().hex[:8]}"
