"""The key's shared queue through the library, against real processes: a
waiter hears its place (on_queued), and a wait that moves to another
replica keeps it. The sync and the asyncio clients alike."""

import asyncio
import queue
import signal
import threading
import time
import urllib.error

import pytest

import lockbroker
from lockbroker import aio

LEASE = dict(ttl=10, lock_delay=0)


class Waiter:
    """A lock(key) waiting on a thread of its own, through a client of
    `targets` (the first is where it waits first). `queued` collects what
    its on_queued callback hears; once granted, the lease is held until
    stop()."""

    def __init__(self, targets, key, use_aio=False, limit=None):
        self.limit = limit  # a semaphore slot of this limit, else the lock
        self.queued = queue.Queue()
        self.got = queue.Queue()
        self.done = threading.Event()
        run = self._run_aio if use_aio else self._run
        self.thread = threading.Thread(target=run, args=(targets, key), name=f"test-waiter {key}", daemon=True)
        self.thread.start()

    def _run(self, targets, key):
        with lockbroker.Client(targets[0], targets=targets[1:]) as c:
            try:
                if self.limit:
                    lease = c.semaphore(key, self.limit, on_queued=self.queued.put, **LEASE)
                else:
                    lease = c.lock(key, on_queued=self.queued.put, **LEASE)
            except Exception as e:
                self.got.put(e)
                return
            self.got.put(lease)
            self.done.wait(30)
            lease.release()

    def _run_aio(self, targets, key):
        async def main():
            async with aio.Client(targets[0], targets=targets[1:]) as c:
                try:
                    if self.limit:
                        lease = await c.semaphore(key, self.limit, on_queued=self.queued.put, **LEASE)
                    else:
                        lease = await c.lock(key, on_queued=self.queued.put, **LEASE)
                except Exception as e:
                    self.got.put(e)
                    return
                self.got.put(lease)
                end = time.monotonic() + 30
                while not self.done.is_set() and time.monotonic() < end:
                    await asyncio.sleep(0.02)
                await lease.release()

        asyncio.run(main())

    def place(self, want, waiting=None, timeout=10.0):
        """The first Queued (from now) that says position `want` (and, if
        given, that `waiting` requests wait)."""
        end = time.monotonic() + timeout
        seen = []
        while True:
            try:
                q = self.queued.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no place {want} (waiting {waiting}) reported within {timeout}s; "
                                     f"heard (place, waiting) {seen}") from None
            if q.position == want and waiting in (None, q.waiting):
                return q
            seen.append((q.position, q.waiting))

    def drain(self):
        while not self.queued.empty():
            self.queued.get_nowait()

    def granted(self, timeout):
        """The lease, or None when not granted within timeout."""
        try:
            got = self.got.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(got, Exception):
            raise got
        return got

    def stop(self):
        self.done.set()
        self.thread.join(15)


def queue_tickets(cluster, key):
    """The live tickets of key's shared queue, oldest first: (CreateIndex,
    ModifyIndex, session). A ticket whose session ended stays, unlocked,
    until a broker deletes it."""
    try:
        ps = cluster.consul.http("GET", f"/v1/kv/{key}/.queue/?recurse&consistent") or []
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise
    return sorted((p["CreateIndex"], p["ModifyIndex"], p["Session"]) for p in ps if p.get("Session"))


def contenders(cluster, prefix):
    """The live contender entries of the semaphore at prefix, oldest
    first: (CreateIndex, ModifyIndex, session)."""
    try:
        ps = cluster.consul.http("GET", f"/v1/kv/{prefix}/?recurse&consistent") or []
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise
    return sorted((p["CreateIndex"], p["ModifyIndex"], p["Session"]) for p in ps
                  if p.get("Session") and not p["Key"].endswith("/.lock"))


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.02)


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
def test_on_queued_tells_the_place(broker, key, use_aio):
    """Two waiters behind a holder hear places 1 and 2 (with how many wait
    and who holds the key); when the holder lets go, the first gets the key
    and the second moves up to 1."""
    waiters = []
    try:
        with lockbroker.Client(broker.addr) as hc:
            holder = hc.lock(key, **LEASE)
            first = Waiter([broker.addr], key, use_aio)
            waiters.append(first)
            q1 = first.place(1)
            assert q1.state.holder.session_id == holder.session_id
            second = Waiter([broker.addr], key, use_aio)
            waiters.append(second)
            # The first `queued` may count the waiters before the second's
            # ticket; the next one (at once) counts it.
            q2 = second.place(2, waiting=2, timeout=5)
            assert q2.state.holder.session_id == holder.session_id
            holder.release()
            lease = first.granted(10)
            assert lease is not None, "the first waiter was not granted"
            assert second.place(1).state.holder.session_id == lease.session_id
    finally:
        for w in waiters:
            w.stop()


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
def test_moved_wait_keeps_its_place(cluster, broker, key, use_aio):
    """A wait queued on replica A behind a holder, with later waiters
    queued on B and C after it, moves to B when A is SIGKILLed: it resumes
    with its session, so its ticket keeps its place (same session, same
    CreateIndex, written again by B), it hears place 1 again, and it is
    granted before the later waiters."""
    a, b = cluster.broker(f"queue-move-{use_aio}-a"), cluster.broker(f"queue-move-{use_aio}-b")
    c = broker
    waiters = []
    try:
        with lockbroker.Client(c.addr) as hc:
            holder = hc.lock(key, **LEASE)
            moved = Waiter([a.addr, b.addr], key, use_aio)
            waiters.append(moved)
            moved.place(1)
            tickets = wait_for(lambda: queue_tickets(cluster, key), 5, "the moved wait's ticket")
            assert len(tickets) == 1, tickets
            created, modified, session = tickets[0]
            later = []
            for n, r in enumerate((b, c), start=2):  # one after the other: arrival order
                w = Waiter([r.addr], key)
                waiters.append(w)
                later.append(w)
                w.place(n)

            a.signal(signal.SIGKILL)
            killed = time.monotonic()

            def rewritten():
                if not moved.got.empty():  # the wait ended instead of moving
                    moved.granted(0)
                ts = [t for t in queue_tickets(cluster, key) if t[2] == session]
                return ts and ts[0][1] != modified and ts[0]
            ticket = wait_for(rewritten, 10, "the moved wait's ticket written again by B (same session)")
            print(f"the wait moved to B with its place {time.monotonic() - killed:.2f}s after A was killed")
            assert ticket[0] == created, "the moved wait's ticket lost its place"
            moved.drain()  # what A said before it was killed
            moved.place(1)

            holder.release()
            lease = moved.granted(10)
            assert lease is not None, "the moved wait was not granted"
            assert lease.target == b.addr
            assert lease.session_id == session, "the moved wait was granted on another session"
            for w in later:
                assert w.granted(0) is None, "a later waiter was granted before the moved one"
            moved.stop()
            nxt = later[0].granted(10)
            assert nxt is not None, "the next waiter was not granted after the moved one"
            assert nxt.token > lease.token
    finally:
        for w in waiters:
            w.stop()
        a.stop()
        b.stop()


@pytest.mark.parametrize("use_aio", [False, True], ids=["sync", "aio"])
def test_moved_semaphore_wait_keeps_its_place(cluster, broker, key, use_aio):
    """test_moved_wait_keeps_its_place with a slot of a limit-1 semaphore:
    the moved wait resumes on B with its session, its contender entry
    keeps its place (same CreateIndex), and it gets the slot before the
    waiters that came after it."""
    a, b = cluster.broker(f"sem-move-{use_aio}-a"), cluster.broker(f"sem-move-{use_aio}-b")
    c = broker
    waiters = []
    try:
        with lockbroker.Client(c.addr) as hc:
            holder = hc.semaphore(key, 1, **LEASE)
            moved = Waiter([a.addr, b.addr], key, use_aio, limit=1)
            waiters.append(moved)
            moved.place(1)
            entry = wait_for(lambda: [e for e in contenders(cluster, key) if e[2] != holder.session_id], 5,
                             "the moved wait's contender entry")
            created, _, session = entry[0]
            later = []
            for n, r in enumerate((b, c), start=2):  # one after the other: arrival order
                w = Waiter([r.addr], key, limit=1)
                waiters.append(w)
                later.append(w)
                w.place(n)

            a.signal(signal.SIGKILL)
            moved.drain()  # what A said before it was killed
            moved.place(1, timeout=15)  # B says it, once the wait moved
            now = [e for e in contenders(cluster, key) if e[2] == session]
            assert now and now[0][0] == created, "the moved wait's contender entry lost its place"

            holder.release()
            lease = moved.granted(10)
            assert lease is not None, "the moved wait was not granted"
            assert lease.target == b.addr
            assert lease.session_id == session, "the moved wait was granted on another session"
            for w in later:
                assert w.granted(0) is None, "a later waiter was granted before the moved one"
            moved.stop()
            nxt = later[0].granted(10)
            assert nxt is not None, "the next waiter was not granted after the moved one"
            assert nxt.token > lease.token
    finally:
        for w in waiters:
            w.stop()
        a.stop()
        b.stop()


def test_moved_wait_whose_place_is_gone_waits_anew(cluster, broker, key):
    """A wait whose session ended while its replica was stopped cannot
    resume its place on the next replica (FAILED_PRECONDITION or
    NOT_FOUND): the library sends its original request there, a fresh
    wait, which gets the key when the holder lets go."""
    a, b = cluster.broker("queue-gone-a"), cluster.broker("queue-gone-b")
    moved = None
    try:
        with lockbroker.Client(broker.addr) as hc:
            holder = hc.lock(key, **LEASE)
            moved = Waiter([a.addr, b.addr], key)
            moved.place(1)
            tickets = wait_for(lambda: queue_tickets(cluster, key), 5, "the wait's ticket")
            session = tickets[0][2]
            a.signal(signal.SIGSTOP)
            cluster.consul.destroy_session(session)
            moved.drain()
            # The wait moves after three heartbeats of silence, is refused
            # its place, and queues anew with another session.
            ticket = wait_for(lambda: [t for t in queue_tickets(cluster, key) if t[2] != session], 15,
                              "a fresh ticket")[0]
            moved.place(1)
            holder.release()
            lease = moved.granted(10)
            assert lease is not None, "the fresh wait was not granted"
            assert lease.target == b.addr
            assert lease.session_id == ticket[2] != session
    finally:
        if moved is not None:
            moved.stop()
        a.stop()
        b.stop()
