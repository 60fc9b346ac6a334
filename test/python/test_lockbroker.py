"""A Python client of lockbroker: Debian's grpcio and the stubs in gen/python.

A client never renews anything: it holds a lock by keeping the Acquire
stream open, and gives it up by closing the stream or with Release.
"""

import os
import select
import signal
import subprocess
import sys
import time

import grpc
import pytest
from google.protobuf import duration_pb2

from conftest import error_details
from lockbroker.v1 import lock_pb2, types_pb2

HERE = os.path.dirname(os.path.abspath(__file__))


def holders(state):
    return [h.session_id for h in state.holders]


def wait_state(stub, key, pred, timeout=5.0):
    """Polls GetLock until pred(state) holds."""
    deadline = time.monotonic() + timeout
    while True:
        state = stub.GetLock(lock_pb2.GetLockRequest(key=key), timeout=5).state
        if pred(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"GetLock({key}) never matched within {timeout}s; last: {state}")
        time.sleep(0.05)


def test_hold_lock(stub, holds, key):
    a = holds(stub, key, value=b"holder-a")
    acq = a.wait_acquired()
    seq = acq.sequencer
    assert seq.token > 0
    assert seq.key == key
    assert seq.session_id
    assert seq.kind == types_pb2.LOCK_KIND_LOCK

    state = stub.GetLock(lock_pb2.GetLockRequest(key=key), timeout=5).state
    assert state.kind == types_pb2.LOCK_KIND_LOCK
    assert holders(state) == [seq.session_id]
    assert state.holders[0].value == b"holder-a"

    # Closing the stream is all it takes to let go.
    a.close()
    wait_state(stub, key, lambda s: not s.holders)


def test_second_client_queued_until_first_closes(stub, holds, key):
    a = holds(stub, key, value=b"a")
    first = a.wait_acquired().sequencer
    b = holds(stub, key, value=b"b")
    q = b.wait_queued()
    assert q.session_id
    assert first.session_id in holders(q.state)

    a.close()
    second = b.wait_acquired(timeout=10).sequencer
    assert second.session_id == q.session_id
    assert second.token > first.token


def test_release_rpc_hands_over(stub, holds, key):
    a = holds(stub, key, value=b"a")
    first = a.wait_acquired().sequencer
    b = holds(stub, key, value=b"b")
    q = b.wait_queued()
    assert first.session_id in holders(q.state)

    resp = stub.Release(lock_pb2.ReleaseRequest(key=key, session_id=first.session_id, token=first.token), timeout=10)
    assert resp.released

    # The holder's stream says `released` and ends.
    ev = a.next_event(timeout=5)
    assert ev.WhichOneof("event") == "released", ev
    assert ev.released.sequencer.token == first.token
    msgs, err = a.stream.wait_end(timeout=5)
    assert err is None, err
    assert [m for m in msgs if m.WhichOneof("event") != "keepalive"] == []

    second = b.wait_acquired(timeout=10).sequencer
    assert second.session_id == q.session_id
    assert second.token > first.token


def test_lost_when_session_destroyed_in_consul(broker, stub, holds, key):
    a = holds(stub, key, value=b"a")
    seq = a.wait_acquired().sequencer

    # Behind the broker's back: destroy the session directly in Consul.
    t0 = time.monotonic()
    assert broker.consul("PUT", f"/v1/session/destroy/{seq.session_id}") is True
    ev = a.next_event(timeout=5)
    elapsed = time.monotonic() - t0
    assert ev.WhichOneof("event") == "lost", ev
    assert ev.lost.reason == lock_pb2.LOST_REASON_SESSION_INVALIDATED, ev
    assert elapsed < 5, f"lost after {elapsed:.2f}s"
    _, err = a.stream.wait_end(timeout=5)
    assert err is None, err


def test_try_once_on_busy_lock_is_aborted(stub, holds, key):
    a = holds(stub, key, value=b"a")
    seq = a.wait_acquired().sequencer

    t0 = time.monotonic()
    b = holds(stub, key, value=b"b", wait_timeout=duration_pb2.Duration(seconds=0))
    msgs, err = b.stream.wait_end(timeout=10)
    assert time.monotonic() - t0 < 5
    assert not [m for m in msgs if m.WhichOneof("event") == "acquired"], msgs
    assert err is not None, f"stream ended without an error after {msgs}"
    assert err.code() == grpc.StatusCode.ABORTED, err
    assert seq.session_id in err.details(), err.details()
    # The google.rpc details: the stable reason and who holds the key.
    d = error_details(err)
    assert d["ErrorInfo"].reason == "LOCK_HELD", d
    assert d["ErrorInfo"].domain == "lockbroker.v1", d
    assert d["ErrorInfo"].metadata["key"] == key, d
    assert holders(d["LockState"]) == [seq.session_id], d
    assert d["LockState"].holders[0].token == seq.token, d
    assert d["LockState"].holders[0].value == b"a", d

    # The holder is untouched.
    state = stub.GetLock(lock_pb2.GetLockRequest(key=key), timeout=5).state
    assert holders(state) == [seq.session_id]


def test_semaphore_limit_two(stub, holds, key):
    a = holds(stub, key, value=b"a", limit=2)
    sa = a.wait_acquired().sequencer
    b = holds(stub, key, value=b"b", limit=2)
    sb = b.wait_acquired().sequencer
    assert sa.kind == sb.kind == types_pb2.LOCK_KIND_SEMAPHORE
    assert sa.token > 0 and sb.token > 0
    assert sa.session_id != sb.session_id

    c = holds(stub, key, value=b"c", limit=2)
    q = c.wait_queued()
    assert q.state.kind == types_pb2.LOCK_KIND_SEMAPHORE
    assert q.state.limit == 2
    assert sorted(holders(q.state)) == sorted([sa.session_id, sb.session_id])

    a.close()
    sc = c.wait_acquired(timeout=10).sequencer
    assert sc.session_id == q.session_id
    assert sc.kind == types_pb2.LOCK_KIND_SEMAPHORE

    state = wait_state(stub, key, lambda s: sorted(holders(s)) == sorted([sb.session_id, sc.session_id]))
    assert state.limit == 2


def test_leader_observer_sees_holder_gap_and_new_holder(stub, holds, watches, key):
    w = watches(stub, key)
    first = w.wait(lambda s: True)
    assert not first.holders, first

    a = holds(stub, key, value=b"leader-a")
    sa = a.wait_acquired().sequencer
    st = w.wait(lambda s: len(s.holders) > 0)
    assert holders(st) == [sa.session_id]
    assert st.holders[0].value == b"leader-a"

    a.close()
    st = w.wait(lambda s: holders(s) != [sa.session_id])
    assert not st.holders, f"expected an empty-holders state after A resigned, got {st}"

    b = holds(stub, key, value=b"leader-b")
    sb = b.wait_acquired(timeout=10).sequencer
    st = w.wait(lambda s: len(s.holders) > 0)
    assert holders(st) == [sb.session_id]
    assert st.holders[0].value == b"leader-b"
    assert st.holders[0].token == sb.token


def test_bad_key_is_invalid_argument(stub, holds):
    a = holds(stub, "a//b")
    msgs, err = a.stream.wait_end(timeout=10)
    assert err is not None, f"stream ended without an error after {msgs}"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "key" in err.details(), err.details()
    d = error_details(err)
    assert d["ErrorInfo"].reason == "INVALID_ARGUMENT", d
    assert [v.field for v in d["BadRequest"].field_violations] == ["key"], d

    with pytest.raises(grpc.RpcError) as info:
        stub.GetLock(lock_pb2.GetLockRequest(key="a//b"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "key" in info.value.details()


EXAMPLE_KEY = "jobs/nightly-report"


class Example:
    """example_hold.py running as a child process."""

    def __init__(self, broker, work_seconds):
        env = dict(os.environ, LOCKBROKER_ADDR=broker.addr, WORK_SECONDS=str(work_seconds))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [os.path.join(os.path.dirname(os.path.dirname(HERE)), "gen", "python"),
                        os.environ.get("PYTHONPATH")] if p)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "example_hold.py")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def acquired_token(self, timeout=30):
        """Waits for the "acquired token=N" line and returns N."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"example_hold.py printed nothing within {timeout}s"
        line = self.proc.stdout.readline()
        assert line.startswith("acquired token="), line
        return int(line.strip().split("=", 1)[1])

    def wait(self, timeout):
        """Waits for the example to exit: (exit code, stdout rest, stderr)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"example_hold.py still running after {timeout}s") from None
        return self.proc.returncode, out, err

    def kill(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def example(broker):
    started = []

    def start(work_seconds):
        e = Example(broker, work_seconds)
        started.append(e)
        return e

    yield start
    for e in started:
        e.kill()


def test_example_hold(broker, stub, example):
    e = example(1)
    assert e.acquired_token() > 0
    code, out, err = e.wait(timeout=30)
    assert code == 0, err
    assert out == "", out
    # It let go when it exited.
    wait_state(stub, EXAMPLE_KEY, lambda s: not s.holders)


def test_example_hold_stops_without_keepalive(broker, stub, example):
    """Pauses the broker: no keepalive comes, and the example must stop by
    the end of the last guarantee (at most the session TTL, 15s)."""
    e = example(60)
    e.acquired_token()
    broker.pause()
    try:
        t0 = time.monotonic()
        code, _, err = e.wait(timeout=20)
        elapsed = time.monotonic() - t0
    finally:
        broker.resume()
    assert code != 0, "the example must fail when no keepalive comes"
    assert "lost" in err, err
    assert elapsed < 15, f"stopped {elapsed:.2f}s after the broker paused"
    wait_state(stub, EXAMPLE_KEY, lambda s: not s.holders, timeout=30)


def test_example_hold_stops_when_lost(broker, stub, example):
    """Destroys the example's session in Consul: it must stop at once. (Last
    of the example tests: the key is in Consul's lock-delay afterwards.)"""
    e = example(60)
    e.acquired_token()
    session = stub.GetLock(lock_pb2.GetLockRequest(key=EXAMPLE_KEY), timeout=5).state.holders[0].session_id
    t0 = time.monotonic()
    assert broker.consul("PUT", f"/v1/session/destroy/{session}") is True
    code, _, err = e.wait(timeout=10)
    elapsed = time.monotonic() - t0
    assert code != 0, "the example must fail when the lock is lost"
    assert "lost" in err, err
    assert elapsed < 5, f"stopped {elapsed:.2f}s after the loss"
