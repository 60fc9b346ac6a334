"""Read-write and multi-key leases against fake brokers (grpc servers in
this process): what the library sends, how it reads the grants, losses
and refusals, and what it carries to another replica. The live behaviour
(the broker's own) is in test/conformance/python, scenarios S8 and S9."""

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from google.protobuf import duration_pb2

import lockbroker
from lockbroker import _core, _rpc, aio, errors
from lockbroker._gen.lockbroker.v1 import lock_pb2, lock_pb2_grpc, types_pb2

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSION = "11111111-2222-3333-4444-555555555555"


def sequencer(key, token, kind=types_pb2.LOCK_KIND_LOCK, read=False):
    return types_pb2.Sequencer(key=key, session_id=SESSION, lock_index=1, token=token, kind=kind, read=read)


def honest_grant(req):
    """The `acquired` a broker that serves kind and keys sends for req."""
    kind = {lock_pb2.ACQUIRE_KIND_READ: types_pb2.LOCK_KIND_RWLOCK,
            lock_pb2.ACQUIRE_KIND_WRITE: types_pb2.LOCK_KIND_RWLOCK}.get(req.kind, types_pb2.LOCK_KIND_LOCK)
    read = req.kind == lock_pb2.ACQUIRE_KIND_READ
    keys = [req.key, *req.keys]
    seqs = [sequencer(k, 100 + n, kind, read) for n, k in enumerate(keys)]
    acq = lock_pb2.AcquireAcquired(sequencer=seqs[0], guaranteed_for=duration_pb2.Duration(seconds=10))
    if req.keys:
        acq.sequencers.extend(seqs)
    return acq


class FakeBroker(lock_pb2_grpc.LockServiceServicer):
    """Grants with grant(req) (None: refuses nothing, sends nothing), then
    sends `then` (AcquireResponse list) and, if `abort`, breaks the stream
    with UNAVAILABLE, else keeps it open until the client ends it. Every
    request lands in `requests`; `cancelled` counts streams the client
    ended."""

    def __init__(self, grant=honest_grant, then=(), abort=False, keepalive=None):
        self.grant, self.then, self.abort, self.keepalive = grant, list(then), abort, keepalive
        self.requests = queue.Queue()
        self.cancelled = threading.Event()
        self.released = threading.Event()

    def Acquire(self, request, context):
        self.requests.put(request)
        context.add_callback(self.cancelled.set)  # the RPC ended: by the client, as this one never ends it
        acq = self.grant(request)
        if acq is not None:
            yield lock_pb2.AcquireResponse(acquired=acq)
        for msg in self.then:
            yield msg
        if self.abort:
            context.abort(grpc.StatusCode.UNAVAILABLE, "replica going away")
        end = time.monotonic() + 30
        while context.is_active() and time.monotonic() < end:
            time.sleep(0.02)
            if self.released.is_set():
                yield lock_pb2.AcquireResponse(released=lock_pb2.AcquireReleased())
                return
            if self.keepalive is not None:
                yield lock_pb2.AcquireResponse(keepalive=lock_pb2.AcquireKeepalive(
                    guaranteed_for=duration_pb2.Duration(seconds=self.keepalive)))

    def Release(self, request, context):
        self.released.set()
        return lock_pb2.ReleaseResponse(released=True)


@pytest.fixture
def serve():
    servers = []

    def start(servicer):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        lock_pb2_grpc.add_LockServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def take(api, targets, method, arg, **kw):
    """Calls client.<method>(arg, **kw) with the sync or the aio client and
    returns (lease facts, lease.error, lost_key) after `settle`, a callable
    that receives the lease and returns when it is done with it."""
    settle = kw.pop("settle", lambda lease: None)
    facts = lambda lease: dict(mode=lease.mode, keys=lease.keys, tokens=lease.tokens, key=lease.key,
                               token=lease.token, seq_kinds=[s.kind for s in lease.sequencers],
                               reads=[s.read for s in lease.sequencers], repr=repr(lease), resumes=lease.resumes)
    if api == "sync":
        with lockbroker.Client(targets[0], targets=targets[1:], timeout=5) as c:
            lease = getattr(c, method)(arg, **kw)
            settle(lease)
            return facts(lease), lease.error, lease.lost_key

    async def main():
        async with aio.Client(targets[0], targets=targets[1:], timeout=5) as c:
            lease = await getattr(c, method)(arg, **kw)
            r = settle(lease)
            if asyncio.iscoroutine(r):
                await r
            return facts(lease), lease.error, lease.lost_key

    return run(main())


# -- requests --------------------------------------------------------------


def test_requests_carry_kind_and_keys():
    r = _core.acquire_request("k", mode="read")
    assert r.kind == lock_pb2.ACQUIRE_KIND_READ and list(r.keys) == []
    assert _core.acquire_request("k", mode="write").kind == lock_pb2.ACQUIRE_KIND_WRITE
    assert _core.acquire_request("k").kind == lock_pb2.ACQUIRE_KIND_LOCK
    r = _core.acquire_request("a", keys=["b", "c"])
    assert r.key == "a" and list(r.keys) == ["b", "c"] and r.kind == lock_pb2.ACQUIRE_KIND_LOCK
    with pytest.raises(lockbroker.InvalidArgument):
        _core.acquire_request("k", mode="exclusive")
    with pytest.raises(lockbroker.InvalidArgument):
        _core.acquire_request("k", semaphore=True, limit=2, mode="read")
    assert _core.acquire_kind(mode="read") == lock_pb2.ACQUIRE_KIND_READ
    assert [_core.lease_mode(_core.acquire_request("k", mode=m)) for m in (None, "read", "write")] == \
        ["lock", "read", "write"]
    assert _core.lease_mode(_core.acquire_request("p", limit=2, semaphore=True)) == "semaphore"


@pytest.mark.parametrize("keys,why", [
    ("a", "a list of keys, not a string"),
    (b"a", "a list of keys, not a string"),
    ([], "empty"),
    (["a", "b", "a"], "'a' given twice"),
    (["a", 3], "not a string"),
    ([f"k{i}" for i in range(65)], "more than 64 keys"),
    (42, "not a list"),
])
def test_lock_all_keys_checked_before_any_call(keys, why):
    """A bad key list is InvalidArgument naming `keys`, raised before the
    client talks to anyone (the target does not exist)."""
    with lockbroker.Client("127.0.0.1:1", timeout=1) as c:
        t0 = time.monotonic()
        with pytest.raises(lockbroker.InvalidArgument) as e:
            c.lock_all(keys)
        assert time.monotonic() - t0 < 0.5
    assert e.value.field_violations == [("keys", why)]

    async def main():
        async with aio.Client("127.0.0.1:1", timeout=1) as c:
            with pytest.raises(lockbroker.InvalidArgument):
                await c.lock_all(keys)
    run(main())


def test_lock_all_accepts_any_iterable_and_64_keys():
    assert _core.lock_keys(k for k in ("a", "b")) == ["a", "b"]
    assert len(_core.lock_keys([f"k{i}" for i in range(64)])) == 64


# -- grants ------------------------------------------------------------------


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("method,arg,want", [
    ("read_lock", "rw", dict(mode="read", keys=("rw",), tokens=(100,), seq_kinds=["rwlock"], reads=[True])),
    ("write_lock", "rw", dict(mode="write", keys=("rw",), tokens=(100,), seq_kinds=["rwlock"], reads=[False])),
    ("lock_all", ["a", "b", "c"], dict(mode="lock", keys=("a", "b", "c"), tokens=(100, 101, 102),
                                       seq_kinds=["lock"] * 3, reads=[False] * 3)),
    ("lock_all", ["solo"], dict(mode="lock", keys=("solo",), tokens=(100,), seq_kinds=["lock"], reads=[False])),
    ("lock", "plain", dict(mode="lock", keys=("plain",), tokens=(100,), seq_kinds=["lock"], reads=[False])),
])
def test_grant_is_read_into_the_lease(serve, api, method, arg, want):
    fake = FakeBroker()
    addr = serve(fake)
    facts, err, lost_key = take(api, [addr], method, arg, settle=lambda lease: lease.check())
    assert {k: facts[k] for k in want} == want
    assert facts["key"] == want["keys"][0] and facts["token"] == 100
    assert err is None and lost_key is None
    req = fake.requests.get(timeout=1)
    expect_kind = {"read_lock": lock_pb2.ACQUIRE_KIND_READ,
                   "write_lock": lock_pb2.ACQUIRE_KIND_WRITE}.get(method, lock_pb2.ACQUIRE_KIND_LOCK)
    assert req.kind == expect_kind
    assert [req.key, *req.keys] == list(want["keys"])
    if method == "lock_all" and len(want["keys"]) > 1:
        assert "['a', 'b', 'c']" in facts["repr"]
    if method in ("read_lock", "write_lock"):
        assert want["mode"] in facts["repr"]


def older_broker_multi(req):
    """A broker that does not know `keys`: it grants the first key alone."""
    return lock_pb2.AcquireAcquired(sequencer=sequencer(req.key, 7), guaranteed_for=duration_pb2.Duration(seconds=10))


def older_broker_rw(req):
    """A broker that takes READ for a plain lock."""
    return lock_pb2.AcquireAcquired(sequencer=sequencer(req.key, 7), guaranteed_for=duration_pb2.Duration(seconds=10))


def wrong_order(req):
    acq = honest_grant(req)
    seqs = list(acq.sequencers)
    del acq.sequencers[:]
    acq.sequencers.extend(seqs[:1] + seqs[1:][::-1])
    return acq


def writer_for_reader(req):
    acq = honest_grant(req)
    acq.sequencer.read = not acq.sequencer.read
    return acq


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("grant,method,arg,says", [
    (older_broker_multi, "lock_all", ["a", "b"], "does not support multi-key locks"),
    (wrong_order, "lock_all", ["a", "b", "c"], "does not support multi-key locks"),
    (older_broker_rw, "read_lock", "rw", "granted a lock for a read request"),
    (older_broker_rw, "write_lock", "rw", "granted a lock for a write request"),
    (writer_for_reader, "read_lock", "rw", "granted a write hold for a read request"),
])
def test_grant_that_is_not_what_was_asked_is_refused(serve, api, grant, method, arg, says):
    """A broker that ignored `keys` or `kind` would hand out a subset of
    the keys, or a plain lock as a shared one: the library refuses with
    Unimplemented and ends the stream, which lets the grant go."""
    fake = FakeBroker(grant=grant)
    addr = serve(fake)
    with pytest.raises(lockbroker.Unimplemented) as e:
        take(api, [addr], method, arg)
    assert says in str(e.value)
    assert fake.cancelled.wait(5), "the stream of the refused grant stayed open"


# -- losses ------------------------------------------------------------------


def lost(reason, key="", detail="gone"):
    return lock_pb2.AcquireResponse(lost=lock_pb2.AcquireLost(reason=reason, key=key, detail=detail))


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("method,arg,key", [
    ("lock_all", ["a", "b", "c"], "b"),
    ("read_lock", "rw", "rw"),
    ("write_lock", "rw", ""),  # a broker that names no key
])
def test_loss_names_the_key(serve, api, method, arg, key):
    then = [lost(lock_pb2.LOST_REASON_DELETED_BY_OTHER, key=key)]
    addr = serve(FakeBroker(then=then))
    got = []

    def settle(lease):
        lease.on_lost(got.append)
        if api == "sync":
            assert lease.lost.wait(5)
            return None
        return lease.wait_lost(5)

    facts, err, lost_key = take(api, [addr], method, arg, settle=settle)
    assert err is not None and err.reason == "DELETED_BY_OTHER"
    assert err.key == (key or None) and lost_key == (key or None)
    assert (repr(key) in str(err)) == bool(key)
    assert got and got[0] is err


def test_lost_key_is_none_for_client_losses():
    e = errors.LockLost("KEEPALIVE_TIMEOUT", "no keepalive")
    assert e.key is None and str(e) == "lock lost: KEEPALIVE_TIMEOUT: no keepalive"


# -- moving to another replica ---------------------------------------------


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("method,arg", [("read_lock", "rw"), ("write_lock", "rw"), ("lock_all", ["a", "b", "c"])])
def test_resume_carries_kind_and_keys(serve, api, method, arg):
    """Replica A grants, then goes away: the lease resumes on B with the
    same request (kind, keys) and its first key's sequencer, and B's grant
    of the same tokens keeps the lease."""
    a = FakeBroker(abort=True)
    b = FakeBroker(keepalive=10)
    targets = [serve(a), serve(b)]

    def check(lease):
        req = b.requests.get(timeout=5)
        assert req.WhichOneof("session") == "resume"
        assert (req.resume.key, req.resume.session_id, req.resume.token) == (lease.key, lease.session_id, lease.token)
        assert req.resume.read == (method == "read_lock")
        sent = a.requests.get(timeout=1)
        assert (req.kind, req.key, list(req.keys)) == (sent.kind, sent.key, list(sent.keys))
        assert req.kind != lock_pb2.ACQUIRE_KIND_UNSPECIFIED

    def settle(lease):
        if api == "sync":
            end = time.monotonic() + 5
            while lease.resumes == 0 and time.monotonic() < end:
                time.sleep(0.02)
            check(lease)
            return None

        async def resumed():
            end = time.monotonic() + 5
            while lease.resumes == 0 and time.monotonic() < end:
                await asyncio.sleep(0.02)
            check(lease)
        return resumed()

    facts, err, _ = take(api, targets, method, arg, settle=settle)
    assert err is None and facts["resumes"] == 1
    assert facts["tokens"] == tuple(100 + n for n in range(len(facts["keys"])))


def other_tokens(req):
    acq = honest_grant(req)
    for s in acq.sequencers[1:]:
        s.token += 50
    return acq


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_resume_with_other_tokens_is_a_loss(serve, api):
    """B answers the resume of a multi-key lease with the first key's
    token but other tokens for the rest: not this grant, so RESUME_REFUSED."""
    targets = [serve(FakeBroker(abort=True)), serve(FakeBroker(grant=other_tokens))]

    def settle(lease):
        if api == "sync":
            assert lease.lost.wait(5)
            return None
        return lease.wait_lost(5)

    _, err, lost_key = take(api, targets, "lock_all", ["a", "b"], settle=settle)
    assert err is not None and err.reason == "RESUME_REFUSED" and lost_key is None


# -- refusals ------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


@pytest.mark.parametrize("found,name", [(types_pb2.LOCK_KIND_RWLOCK, "rwlock"), (types_pb2.LOCK_KIND_LOCK, "lock")])
def test_kind_conflict_is_conflict_with_limit_conflict(found, name):
    st = _rpc.Status(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="m")
    for type_name, msg in (("google.rpc.ErrorInfo", _rpc.ErrorInfo(reason="LIMIT_CONFLICT", domain="lockbroker.v1")),
                           ("lockbroker.v1.LockState", types_pb2.LockState(
                               key="k", kind=found, holders=[types_pb2.Holder(session_id="s", read=True)]))):
        d = st.details.add()
        d.type_url = f"type.googleapis.com/{type_name}"
        d.value = msg.SerializeToString()
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, f"the key is a {name}",
                                           (("grpc-status-details-bin", st.SerializeToString()),)))
    assert type(e) is lockbroker.Conflict and e.reason == "LIMIT_CONFLICT"
    assert e.state.kind == name and e.holders[0].read is True


class Refuse(lock_pb2_grpc.LockServiceServicer):
    def __init__(self, code, reason):
        self.code, self.reason = code, reason

    def Acquire(self, request, context):
        st = _rpc.Status(code=self.code.value[0], message="refused")
        d = st.details.add()
        d.type_url = "type.googleapis.com/google.rpc.ErrorInfo"
        d.value = _rpc.ErrorInfo(reason=self.reason, domain="lockbroker.v1").SerializeToString()
        context.set_trailing_metadata((("grpc-status-details-bin", st.SerializeToString()),))
        context.abort(self.code, "refused")


@pytest.mark.parametrize("api", ["sync", "aio"])
@pytest.mark.parametrize("method,arg", [("try_read_lock", "k"), ("try_write_lock", "k"), ("try_lock_all", ["a", "b"])])
def test_try_forms(serve, api, method, arg):
    """Busy is None; a kind conflict is raised (it does not go away by
    waiting)."""
    busy = serve(Refuse(grpc.StatusCode.ABORTED, "LOCK_HELD"))
    conflict = serve(Refuse(grpc.StatusCode.FAILED_PRECONDITION, "LIMIT_CONFLICT"))
    if api == "sync":
        with lockbroker.Client(busy, timeout=5) as c:
            assert getattr(c, method)(arg) is None
        with lockbroker.Client(conflict, timeout=5) as c:
            with pytest.raises(lockbroker.Conflict) as e:
                getattr(c, method)(arg)
        assert e.value.reason == "LIMIT_CONFLICT"
        return

    async def main():
        async with aio.Client(busy, timeout=5) as c:
            assert await getattr(c, method)(arg) is None
        async with aio.Client(conflict, timeout=5) as c:
            with pytest.raises(lockbroker.Conflict) as e:
                await getattr(c, method)(arg)
        assert e.value.reason == "LIMIT_CONFLICT"
    run(main())


def test_types_read_the_new_fields():
    seq = lockbroker.Sequencer.from_proto(sequencer("k", 5, types_pb2.LOCK_KIND_RWLOCK, True))
    assert seq.kind == "rwlock" and seq.read is True
    assert seq.to_proto().kind == types_pb2.LOCK_KIND_RWLOCK and seq.to_proto().read is True
    st = lockbroker.State.from_proto(types_pb2.LockState(key="k", kind=types_pb2.LOCK_KIND_RWLOCK, holders=[
        types_pb2.Holder(session_id="a", read=True), types_pb2.Holder(session_id="b", read=True)]))
    assert st.kind == "rwlock" and [h.read for h in st.holders] == [True, True]


# -- the conformance CLI ----------------------------------------------------


def cli(addr, *args, seconds="0.3"):
    env = dict(os.environ, PYTHONPATH=PKG)
    r = subprocess.run([sys.executable, "-m", "lockbroker.conformance", "hold", "--target", addr, *args,
                        "--seconds", seconds], capture_output=True, text=True, env=env, timeout=30,
                       stdin=subprocess.DEVNULL)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()], r.stderr


@pytest.mark.parametrize("args,kind,mode,keys", [
    (["--key", "rw", "--mode", "read"], lock_pb2.ACQUIRE_KIND_READ, "read", None),
    (["--key", "rw", "--mode", "write"], lock_pb2.ACQUIRE_KIND_WRITE, "write", None),
    (["--key", "a", "--also", "b", "--also", "c"], lock_pb2.ACQUIRE_KIND_LOCK, "lock", ["a", "b", "c"]),
    (["--key", "a"], lock_pb2.ACQUIRE_KIND_LOCK, "lock", None),
])
def test_cli_mode_and_also(serve, args, kind, mode, keys):
    fake = FakeBroker(keepalive=10)
    rc, lines, err = cli(serve(fake), *args)
    assert rc == 0, (lines, err)
    acquired, released = lines[0], lines[-1]
    assert [line["event"] for line in lines] == ["acquired", "releasing", "released"]
    assert acquired["t"] <= lines[1]["t"] == released["release_t"] <= released["t"]
    assert acquired["mode"] == mode and acquired["lang"] == "python" and acquired["token"] == 100
    if keys:
        assert acquired["keys"] == keys and acquired["tokens"] == [100 + n for n in range(len(keys))]
    else:
        assert "tokens" not in acquired
    req = fake.requests.get(timeout=1)
    assert req.kind == kind and [req.key, *req.keys] == (keys or [req.key])


def test_cli_lost_names_the_key(serve):
    rc, lines, err = cli(serve(FakeBroker(then=[lost(lock_pb2.LOST_REASON_DELETED_BY_OTHER, key="b")])),
                         "--key", "a", "--also", "b", seconds="10")
    assert rc == 2, (lines, err)
    assert lines[-1]["event"] == "lost" and lines[-1]["key"] == "b" and lines[-1]["reason"] == "DELETED_BY_OTHER"


@pytest.mark.parametrize("args", [["--mode", "read", "--limit", "3"], ["--also", "b", "--limit", "3"],
                                  ["--mode", "write", "--also", "b"]])
def test_cli_refuses_mixed_flags(args):
    rc, lines, _ = cli("127.0.0.1:1", "--key", "a", *args)
    assert rc == 1 and lines[-1]["event"] == "error" and lines[-1]["type"] == "InvalidArgument"


@pytest.mark.parametrize("method,arg", [("lock", "k"), ("read_lock", "k"), ("write_lock", "k"),
                                        ("lock_all", ["a", "b"]), ("semaphore", "p")])
def test_aio_async_with_without_await(serve, method, arg):
    """`async with client.read_lock(k) as lease:` (no await) holds for the
    block and releases at its end; `await` still returns the Lease."""
    fake = FakeBroker(keepalive=10)
    addr = serve(fake)
    extra = (3,) if method == "semaphore" else ()

    def semaphore_grant(req):
        acq = honest_grant(req)
        acq.sequencer.kind = types_pb2.LOCK_KIND_SEMAPHORE
        return acq
    if method == "semaphore":
        fake.grant = semaphore_grant

    async def main():
        async with aio.Client(addr, timeout=5) as c:
            async with getattr(c, method)(arg, *extra) as lease:
                assert isinstance(lease, aio.Lease) and not lease.released
                assert not fake.released.is_set()
            assert lease.released and fake.released.is_set()
            fake.released.clear()
            lease = await getattr(c, method)(arg, *extra)
            assert isinstance(lease, aio.Lease)
            await lease.release()
    run(main())
