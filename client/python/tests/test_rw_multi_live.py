"""Read-write and multi-key leases against real processes (a Consul dev
agent and broker replicas): moving to another replica keeps the kind,
the keys, the tokens and a waiting request's place. The scenarios of
scenarios.md (S8, S9) are in test/conformance/python."""

import asyncio
import queue
import signal
import threading
import time

import pytest

import lockbroker
from lockbroker import aio

LEASE = dict(ttl=10, lock_delay=0)


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.02)


class Pending:
    """A blocking call on a thread of its own."""

    def __init__(self, fn, *args, **kw):
        self.items = queue.Queue()
        threading.Thread(target=self._run, args=(fn, args, kw), daemon=True).start()

    def _run(self, fn, args, kw):
        try:
            self.items.put(fn(*args, **kw))
        except Exception as e:  # noqa: BLE001 - handed to the test
            self.items.put(e)

    def result(self, timeout):
        try:
            got = self.items.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(got, Exception):
            raise got
        self.items.put(got)
        return got


def place(places, position, waiting, timeout=10):
    """The first Queued from places (a queue on_queued fills) at position
    with `waiting` requests in all. (The broker's first `queued` of a
    read-write wait may count a holding reader as waiting; the next one,
    at once, is right.)"""
    end = time.monotonic() + timeout
    seen = []
    while True:
        try:
            q = places.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no place {position} of {waiting} within {timeout}s: heard {seen}") from None
        if (q.position, q.waiting) == (position, waiting):
            return q
        seen.append((q.position, q.waiting, len(q.state.holders)))


def take(use_aio, targets, method, arg, then):
    """client.<method>(arg) through a client of targets (sync or aio), then
    then(lease, call) on this thread, where call(coro_or_value) runs an aio
    coroutine (or returns a sync value)."""
    if not use_aio:
        with lockbroker.Client(targets[0], targets=targets[1:]) as c:
            return then(getattr(c, method)(arg, **LEASE), lambda v: v)

    async def main():
        async with aio.Client(targets[0], targets=targets[1:]) as c:
            lease = await getattr(c, method)(arg, **LEASE)
            loop = asyncio.get_running_loop()
            # then() blocks: run it off the loop, handing coroutines back to it.
            call = lambda v: asyncio.run_coroutine_threadsafe(v, loop).result(30) if asyncio.iscoroutine(v) else v
            return await loop.run_in_executor(None, then, lease, call)

    return asyncio.run(asyncio.wait_for(main(), 90))


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
@pytest.mark.parametrize("method", ["read_lock", "write_lock"])
def test_rw_lease_moves_to_another_replica(cluster, broker, key, use_aio, method):
    """A read or write lease on A resumes on B when A is SIGKILLed: same
    session, token and mode; the key still shows it, as a reader or the
    writer; release() through B lets it go."""
    a, b = cluster.broker(f"rw-move-{method}-{use_aio}-a"), cluster.broker(f"rw-move-{method}-{use_aio}-b")
    read = method == "read_lock"
    try:
        with lockbroker.Client(broker.addr) as observer:
            def then(lease, call):
                assert lease.target == a.addr and lease.mode == ("read" if read else "write")
                token, session = lease.token, lease.session_id
                a.signal(signal.SIGKILL)
                wait_for(lambda: lease.target == b.addr, 10, "resume on B")
                assert not lease.lost.is_set(), lease.error
                assert (lease.token, lease.session_id, lease.sequencer.read) == (token, session, read)
                state = observer.get_lock(key)
                assert state.kind == "rwlock"
                assert [(h.session_id, h.token, h.read) for h in state.holders] == [(session, token, read)]
                assert call(lease.release()) is True
                assert not observer.get_lock(key).holders
            take(use_aio, [a.addr, b.addr], method, key, then)
    finally:
        a.stop()
        b.stop()


def test_rw_moved_wait_keeps_its_place(cluster, broker, key):
    """A writer waiting on A behind a reader, with a reader after it on
    another replica, moves to B when A is SIGKILLed and keeps its place:
    when the first reader lets go the writer is granted (on B), and the
    later reader only after the writer."""
    a, b = cluster.broker("rw-wait-a"), cluster.broker("rw-wait-b")
    try:
        with lockbroker.Client(broker.addr) as rc, lockbroker.Client(a.addr, targets=[b.addr]) as wc, \
                lockbroker.Client(broker.addr) as lc:
            reader = rc.read_lock(key, **LEASE)
            places = queue.Queue()
            writer = Pending(wc.write_lock, key, on_queued=places.put, **LEASE)
            place(places, 1, 1)
            later_places = queue.Queue()
            later = Pending(lc.read_lock, key, on_queued=later_places.put, **LEASE)
            place(later_places, 2, 2)
            a.signal(signal.SIGKILL)
            # The wait moves when A's stream breaks; B says the same place.
            place(places, 1, 2, timeout=8)
            assert later.result(0.5) is None
            reader.release()
            w = writer.result(10)
            assert w is not None, "the moved writer was not granted"
            assert w.target == b.addr and w.mode == "write" and w.token > reader.token
            assert later.result(0.5) is None, "the later reader was granted beside (or before) the writer"
            w.release()
            r = later.result(10)
            assert r is not None and r.token > w.token
            r.release()
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
def test_lock_all_lease_moves_to_another_replica(cluster, broker, key, use_aio):
    """A lock_all lease on A resumes on B with every key and token; a loss
    after that still names the key and frees the rest."""
    a, b = cluster.broker(f"multi-move-{use_aio}-a"), cluster.broker(f"multi-move-{use_aio}-b")
    keys = [f"{key}/{n}" for n in "xyz"]
    try:
        with lockbroker.Client(broker.addr) as observer:
            def then(lease, call):
                assert lease.target == a.addr and lease.keys == tuple(keys)
                tokens, session = lease.tokens, lease.session_id
                a.signal(signal.SIGKILL)
                wait_for(lambda: lease.target == b.addr, 10, "resume on B")
                assert not lease.lost.is_set(), lease.error
                assert (lease.tokens, lease.session_id) == (tokens, session)
                for k, t in zip(keys, tokens):
                    assert [(h.session_id, h.token) for h in observer.get_lock(k).holders] == [(session, t)], k
                cluster.consul.http("DELETE", f"/v1/kv/{keys[1]}")
                wait_for(lambda: lease.lost.is_set(), 5, "the loss of the deleted key")
                assert lease.lost_key == keys[1], lease.error
                wait_for(lambda: not any(observer.get_lock(k).holders for k in (keys[0], keys[2])), 5,
                         "the other keys released")
            take(use_aio, [a.addr, b.addr], "lock_all", keys, then)
    finally:
        a.stop()
        b.stop()


def test_lock_all_wait_moves_to_another_replica(cluster, broker, key):
    """A lock_all waiting on A behind a holder goes on waiting at B when A
    is SIGKILLed (anew: the broker does not resume a multi-key wait), and
    gets every key once the holder lets go; meanwhile it holds none."""
    a, b = cluster.broker("multi-wait-a"), cluster.broker("multi-wait-b")
    keys = [f"{key}/{n}" for n in "xy"]
    try:
        with lockbroker.Client(broker.addr) as hc, lockbroker.Client(a.addr, targets=[b.addr]) as wc:
            holder = hc.lock(keys[0], **LEASE)
            places = queue.Queue()
            waiting = Pending(wc.lock_all, keys, on_queued=places.put, **LEASE)
            place(places, 1, 1)
            a.signal(signal.SIGKILL)
            time.sleep(1.0)
            assert waiting.result(0) is None and not hc.get_lock(keys[1]).holders
            holder.release()
            lease = waiting.result(15)
            assert lease is not None, "the moved lock_all was not granted"
            assert lease.target == b.addr and lease.keys == tuple(keys)
            for k, t in zip(keys, lease.tokens):
                assert [(h.session_id, h.token) for h in hc.get_lock(k).holders] == [(lease.session_id, t)], k
            lease.release()
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
def test_try_acquire_read_and_write_with_client_owned_sessions(client, key, use_aio):
    """try_acquire(mode=...) with client-owned sessions: two readers share,
    a writer is busy (None) until both let go, then granted above them."""
    sessions = [client.create_session(ttl=30).id for _ in range(3)]
    try:
        if not use_aio:
            r1 = client.try_acquire(key, sessions[0], mode="read")
            r2 = client.try_acquire(key, sessions[1], mode="read")
            busy = client.try_acquire(key, sessions[2], mode="write")
            for r in (r1, r2):
                client.release(key, r.session_id, r.token)
            w = client.try_acquire(key, sessions[2], mode="write")
        else:
            async def main():
                async with aio.Client(client.targets[0]) as c:
                    r1 = await c.try_acquire(key, sessions[0], mode="read")
                    r2 = await c.try_acquire(key, sessions[1], mode="read")
                    busy = await c.try_acquire(key, sessions[2], mode="write")
                    for r in (r1, r2):
                        await c.release(key, r.session_id, r.token)
                    return r1, r2, busy, await c.try_acquire(key, sessions[2], mode="write")
            r1, r2, busy, w = asyncio.run(asyncio.wait_for(main(), 30))
        assert (r1.kind, r1.read, r2.kind, r2.read) == ("rwlock", True, "rwlock", True)
        assert busy is None
        assert w is not None and (w.kind, w.read) == ("rwlock", False) and w.token > max(r1.token, r2.token)
        client.release(key, w.session_id, w.token)
    finally:
        for s in sessions:
            client.destroy_session(s)
