"""Offline tests: the generated copy is in sync with gen/python, the
package's imports, and the decoding of status details into exceptions."""

import asyncio
import os
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from google.protobuf import duration_pb2

import lockbroker
from lockbroker import _rpc, aio, errors
from lockbroker._gen.lockbroker.v1 import lock_pb2, lock_pb2_grpc, types_pb2


PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gen_copy_in_sync_with_gen_python():
    r = subprocess.run([sys.executable, os.path.join(PKG, "tools", "sync_gen.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_package_imports_nothing_from_gen_python():
    """The package works with only client/python on the path."""
    code = ("import sys, lockbroker, lockbroker.aio, lockbroker.conformance; "
            "assert not any(m == 'lockbroker.v1' or m.startswith('buf.') for m in sys.modules), sorted(sys.modules)")
    env = dict(os.environ, PYTHONPATH=PKG)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


def status_bin(code, message, *details):
    st = _rpc.Status(code=code.value[0], message=message)
    for type_name, msg in details:
        d = st.details.add()
        d.type_url = f"type.googleapis.com/{type_name}"
        d.value = msg.SerializeToString()
    return (("grpc-status-details-bin", st.SerializeToString()),)


def test_lock_held_carries_holders():
    state = types_pb2.LockState(key="k", kind=types_pb2.LOCK_KIND_LOCK, limit=1,
                                holders=[types_pb2.Holder(session_id="s1", value=b"a", token=7, session_name="n")])
    info = _rpc.ErrorInfo(reason="LOCK_HELD", domain="lockbroker.v1", metadata={"key": "k"})
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.ABORTED, "busy", status_bin(
        grpc.StatusCode.ABORTED, "busy", ("google.rpc.ErrorInfo", info), ("lockbroker.v1.LockState", state))))
    assert isinstance(e, lockbroker.LockHeld) and isinstance(e, lockbroker.Busy)
    assert e.reason == "LOCK_HELD" and e.metadata == {"key": "k"} and e.code == grpc.StatusCode.ABORTED
    assert [(h.session_id, h.value, h.token, h.session_name) for h in e.holders] == [("s1", b"a", 7, "n")]
    assert e.state.kind == "lock"
    assert "LOCK_HELD" in str(e)


@pytest.mark.parametrize("code,reason,cls", [
    (grpc.StatusCode.FAILED_PRECONDITION, "NOT_HOLDER", lockbroker.NotHolder),
    (grpc.StatusCode.FAILED_PRECONDITION, "RESUME_REFUSED", lockbroker.ResumeRefused),
    (grpc.StatusCode.ABORTED, "SESSION_LOST", lockbroker.SessionLost),
    (grpc.StatusCode.ABORTED, "LOCK_DELAY", lockbroker.LockDelay),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "WAIT_TIMEOUT", lockbroker.WaitTimeout),
    (grpc.StatusCode.UNAVAILABLE, "BROKER_SHUTTING_DOWN", lockbroker.Unavailable),
    (grpc.StatusCode.UNAVAILABLE, "REPLICA_CUT_OFF", lockbroker.Unavailable),
    (grpc.StatusCode.PERMISSION_DENIED, "CONSUL_PERMISSION_DENIED", lockbroker.PermissionDenied),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", lockbroker.QuotaExceeded),
    (grpc.StatusCode.FAILED_PRECONDITION, "CONSUL_REJECTED", lockbroker.Rejected),
])
def test_reason_decides_the_class(code, reason, cls):
    info = _rpc.ErrorInfo(reason=reason, domain="lockbroker.v1")
    e = errors.from_rpc_error(FakeRpcError(code, "m", status_bin(code, "m", ("google.rpc.ErrorInfo", info))))
    assert type(e) is cls


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.ABORTED, lockbroker.LockHeld),
    (grpc.StatusCode.DEADLINE_EXCEEDED, lockbroker.WaitTimeout),
    (grpc.StatusCode.FAILED_PRECONDITION, lockbroker.Conflict),
    (grpc.StatusCode.NOT_FOUND, lockbroker.SessionNotFound),
    (grpc.StatusCode.UNAVAILABLE, lockbroker.Unavailable),
    (grpc.StatusCode.UNIMPLEMENTED, lockbroker.Unimplemented),
    (grpc.StatusCode.INTERNAL, lockbroker.Internal),
    (grpc.StatusCode.UNKNOWN, lockbroker.Internal),
])
def test_code_without_details(code, cls):
    assert type(errors.from_rpc_error(FakeRpcError(code, "m"))) is cls


def test_retry_and_field_violations():
    retry = _rpc.RetryInfo()
    retry.retry_delay.seconds, retry.retry_delay.nanos = 1, 500_000_000
    bad = _rpc.BadRequest(field_violations=[{"field": "key", "description": "empty"}])
    info = _rpc.ErrorInfo(reason="INVALID_ARGUMENT", domain="lockbroker.v1")
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad", status_bin(
        grpc.StatusCode.INVALID_ARGUMENT, "bad", ("google.rpc.ErrorInfo", info), ("google.rpc.BadRequest", bad),
        ("google.rpc.RetryInfo", retry))))
    assert isinstance(e, lockbroker.InvalidArgument) and isinstance(e, ValueError)
    assert e.field_violations == [("key", "empty")]
    assert e.retry_after == 1.5


def test_other_domain_and_garbage_details():
    info = _rpc.ErrorInfo(reason="LOCK_HELD", domain="elsewhere")
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "m", status_bin(
        grpc.StatusCode.UNAVAILABLE, "m", ("google.rpc.ErrorInfo", info))))
    assert type(e) is lockbroker.Unavailable
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.ABORTED, "m", (("grpc-status-details-bin", b"\xff\x00"),)))
    assert type(e) is lockbroker.LockHeld and e.reason is None


def test_options_validated_before_any_call():
    c = lockbroker.Client("127.0.0.1:1")
    try:
        with pytest.raises(lockbroker.InvalidArgument):
            c.lock("k", ttl=-1)
        with pytest.raises(lockbroker.InvalidArgument):
            c.lock("k", behavior="keep")
        with pytest.raises(lockbroker.InvalidArgument):
            c.semaphore("p", 0)
        with pytest.raises(TypeError):
            lockbroker.Client("x", tls=42)
    finally:
        c.close()


def test_unreachable_broker_is_unavailable():
    with lockbroker.Client("127.0.0.1:1", timeout=2) as c:
        with pytest.raises(lockbroker.Unavailable):
            c.get_lock("k")
        with pytest.raises(lockbroker.Unavailable):
            c.lock("k", wait=0)


def test_every_error_reason_has_a_class():
    from lockbroker._gen.lockbroker.v1 import errors_pb2
    names = [n[len("ERROR_REASON_"):] for n in errors_pb2.ErrorReason.keys() if n != "ERROR_REASON_UNSPECIFIED"]
    assert names
    assert [n for n in names if n not in errors._BY_REASON] == []


class LostBeforeGrant(lock_pb2_grpc.LockServiceServicer):
    """Says `queued`, then `lost`, as a broker does for a grant that came
    after its session's safe deadline (a path only a stopped broker process
    reaches)."""

    def Acquire(self, request, context):
        yield lock_pb2.AcquireResponse(queued=lock_pb2.AcquireQueued())
        yield lock_pb2.AcquireResponse(lost=lock_pb2.AcquireLost(
            reason=lock_pb2.LOST_REASON_RENEWAL_FAILED, detail="the grant came after the session's safe deadline"))


@pytest.fixture
def lost_before_grant():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    lock_pb2_grpc.add_LockServiceServicer_to_server(LostBeforeGrant(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


LOST_BEFORE_GRANT = ("the stream ended with lost before the grant: RENEWAL_FAILED: "
                     "the grant came after the session's safe deadline")


def test_lost_before_grant_is_session_lost(lost_before_grant):
    with lockbroker.Client(lost_before_grant, timeout=5) as c:
        with pytest.raises(lockbroker.SessionLost) as e:
            c.lock("k", wait=5)
    assert LOST_BEFORE_GRANT in str(e.value)
    assert e.value.reason == "SESSION_LOST"


def test_lost_before_grant_is_session_lost_aio(lost_before_grant):
    async def main():
        async with aio.Client(lost_before_grant, timeout=5) as c:
            with pytest.raises(lockbroker.SessionLost) as e:
                await c.lock("k", wait=5)
        return e.value

    err = asyncio.run(asyncio.wait_for(main(), 30))
    assert LOST_BEFORE_GRANT in str(err)


class QuietThenGrant(lock_pb2_grpc.LockServiceServicer):
    """Says `queued` (announcing a heartbeat of `heartbeat` seconds unless
    None), then nothing for `quiet` seconds, then grants to session `name`;
    the stream stays open until the client ends it."""

    def __init__(self, name, heartbeat, quiet):
        self.name, self.heartbeat, self.quiet = name, heartbeat, quiet

    def Acquire(self, request, context):
        queued = lock_pb2.AcquireQueued()
        if self.heartbeat is not None:
            queued.heartbeat.FromNanoseconds(int(self.heartbeat * 1e9))
        yield lock_pb2.AcquireResponse(queued=queued)
        end = time.monotonic() + self.quiet
        while context.is_active() and time.monotonic() < end:
            time.sleep(0.01)
        if not context.is_active():  # the client moved on
            return
        yield lock_pb2.AcquireResponse(acquired=lock_pb2.AcquireAcquired(
            sequencer=types_pb2.Sequencer(key=request.key, session_id=self.name, token=1,
                                          kind=types_pb2.LOCK_KIND_LOCK),
            guaranteed_for=duration_pb2.Duration(seconds=10)))
        while context.is_active():
            time.sleep(0.05)


@pytest.fixture
def serve():
    """serve(servicer) starts a fake broker and returns its address."""
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        lock_pb2_grpc.add_LockServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def granted_session(api, targets):
    """The session of the lease lock() gets with `targets`."""
    if api == "sync":
        with lockbroker.Client(targets[0], targets=targets[1:], timeout=5) as c:
            return c.lock("k", wait=5).session_id

    async def main():
        async with aio.Client(targets[0], targets=targets[1:], timeout=5) as c:
            return (await c.lock("k", wait=5)).session_id

    return asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("heartbeat,replicas,granted_by", [
    (0.1, 2, "next"),    # silent for 3 heartbeats: the wait moves on
    (0.1, 1, "quiet"),   # nowhere else to go: it waits
    (None, 2, "quiet"),  # no heartbeat announced: silence tells nothing
])
def test_silent_waiting_stream_moves_to_the_next_replica(serve, api, heartbeat, replicas, granted_by):
    quiet = serve(QuietThenGrant("quiet", heartbeat, quiet=1.0))
    following = [serve(QuietThenGrant("next", heartbeat, quiet=0))] if replicas == 2 else []
    assert granted_session(api, [quiet, *following]) == granted_by
