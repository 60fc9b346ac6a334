"""The library against real processes (a Consul dev agent and broker
replicas): what the conformance scenarios do not cover. Calls the broker
does not implement yet skip with a message."""

import asyncio
import contextlib
import queue
import signal
import threading
import time

import pytest

import lockbroker
from lockbroker import _core, aio


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def test_semaphore_slots(client, key):
    a = client.semaphore(key, 2, value=b"a")
    b = client.semaphore(key, 2, value=b"b")
    assert a.sequencer.kind == "semaphore"
    assert client.try_semaphore(key, 2) is None
    with pytest.raises(lockbroker.Conflict):
        client.semaphore(key, 3, wait=0)
    got = []
    t = threading.Thread(target=lambda: got.append(client.semaphore(key, 2, wait=10)))
    t.start()
    time.sleep(0.2)
    a.release()
    t.join(15)
    assert got and got[0].token > b.token
    assert len(client.get_lock(key).holders) == 2


def test_one_slot_semaphore(client, key):
    try:
        lease = client.semaphore(key, 1)
    except lockbroker.Unimplemented as e:
        pytest.skip(f"broker lacks AcquireRequest.kind: {e}")
    assert lease.sequencer.kind == "semaphore"
    assert client.try_semaphore(key, 1) is None


def test_release_from_elsewhere_is_a_loss(broker, client, key):
    lease = client.lock(key)
    got = []
    lease.on_lost(got.append)
    with lockbroker.Client(broker.addr) as other:
        assert other.release(key, lease.session_id, lease.token) is True
    assert lease.lost.wait(5)
    assert lease.error.reason == "RELEASED"
    wait_for(lambda: got, 1, "on_lost")
    assert got[0] is lease.error


def test_set_value_and_check_sequencer(client, key):
    with client.lock(key, value="v1") as lease:
        lease.set_value(b"v2")
        st = client.get_lock(key)
        assert (st.holder.session_id, st.holder.value) == (lease.session_id, b"v2")
        assert client.check_sequencer(lease.sequencer) is True
    assert client.check_sequencer(lease.sequencer) is False


def test_election(broker, key):
    with lockbroker.Client(broker.addr) as c1, lockbroker.Client(broker.addr) as c2:
        e1, e2 = c1.election(key), c2.election(key)
        seen = []
        obs = e2.observe()
        t = threading.Thread(target=lambda: [seen.append(h.value if h else None) for h in obs], daemon=True)
        t.start()
        wait_for(lambda: seen, 5, "first observation")
        with pytest.raises(lockbroker.NotLeader):
            e1.proclaim(b"x")
        assert e1.resign() is False, "nothing to resign"
        lead = e1.campaign(b"py-1")
        assert e2.leader().value == b"py-1"
        wait_for(lambda: b"py-1" in seen, 5, "observed leader")
        e1.proclaim(b"py-1b")
        wait_for(lambda: b"py-1b" in seen, 5, "observed proclamation")
        assert e2.leader().token == lead.token, "a proclamation keeps the token"
        assert e1.resign() is True
        assert lead.lost.is_set() or lead.released
        wait_for(lambda: seen and seen[-1] is None, 5, "observed resignation")
        assert e2.leader() is None
    t.join(5)
    assert seen == [None, b"py-1", b"py-1b", None]


def test_leader_is_a_deprecated_election(client, key):
    with pytest.warns(DeprecationWarning, match="election"):
        e = client.leader(key)
    assert isinstance(e, lockbroker.Election) and e.key == key


def test_client_owned_session(client, key):
    s = client.create_session(ttl=10, lock_delay=0, name="py-cron")
    other = client.create_session(ttl=10)
    try:
        try:
            seq = client.try_acquire(key, s.id, value=b"cron")
        except lockbroker.Unimplemented as e:
            pytest.skip(f"broker lacks TryAcquire: {e}")
        assert seq.token > 0 and seq.session_id == s.id
        assert client.try_acquire(key, other.id) is None
        assert client.renew_session(s.id) > 0
        try:
            mine = [x for x in client.list_sessions() if x.session.id == s.id]
            assert len(mine) == 1 and not mine[0].broker_owned
            assert [h.key for h in mine[0].holds] == [key]
        except lockbroker.Unimplemented:
            pass  # ListSessions not there yet: the rest still holds
        assert client.release(key, s.id, seq.token) is True
        assert client.release(key, s.id, seq.token) is False
    finally:
        client.destroy_session(s.id)
        client.destroy_session(other.id)


def test_rolling_restart_moves_the_hold(cluster, key):
    a, b = cluster.broker("term-a"), cluster.broker("term-b")
    try:
        with lockbroker.Client(a.addr, targets=[b.addr]) as c:
            lease = c.lock(key, ttl=10)
            token = lease.token
            a.signal(signal.SIGTERM)
            wait_for(lambda: lease.target == b.addr, 8, "resume on B")
            assert not lease.lost.is_set(), lease.error
            assert lease.token == token
            a.proc.wait(10)
            st = c.get_lock(key)
            assert [(h.session_id, h.token) for h in st.holders] == [(lease.session_id, token)]
            assert lease.release() is True
    finally:
        a.stop()
        b.stop()


def test_stalled_replica_moves_the_hold_before_the_deadline(cluster, key):
    a, b = cluster.broker("stall-a"), cluster.broker("stall-b")
    try:
        with lockbroker.Client(a.addr, targets=[b.addr]) as c:
            lease = c.lock(key, ttl=10)
            token, known = lease.token, lease.deadline
            a.signal(signal.SIGSTOP)
            wait_for(lambda: lease.target == b.addr or lease.lost.is_set(), known - time.monotonic() + 2, "resume")
            assert not lease.lost.is_set(), lease.error
            assert time.monotonic() < known
            # The stopped replica wakes up: it no longer owns the session.
            a.signal(signal.SIGCONT)
            time.sleep(1.5)
            assert not lease.lost.is_set(), lease.error
            st = c.get_lock(key)
            assert [(h.session_id, h.token) for h in st.holders] == [(lease.session_id, token)]
            assert lease.release() is True
    finally:
        a.stop()
        b.stop()


def test_aio_semaphore_election_and_stall(cluster, broker, key):
    a, b = cluster.broker("aio-stall-a"), cluster.broker("aio-stall-b")

    async def main():
        async with aio.Client(broker.addr) as c:
            s1 = await c.semaphore(key + "/sem", 2)
            s2 = await c.semaphore(key + "/sem", 2)
            assert await c.try_semaphore(key + "/sem", 2) is None
            await s1.release()
            await s2.release()
            e = c.election(key + "/leader")
            with pytest.raises(lockbroker.NotLeader):
                await e.proclaim("y")
            async with await e.campaign("x") as lead:
                assert (await e.leader()).session_id == lead.session_id
                await e.proclaim("x2")
                assert (await e.leader()).value == b"x2"
                assert await e.resign() is True
            assert await e.leader() is None
        async with aio.Client(a.addr, targets=[b.addr]) as c:
            lease = await c.lock(key + "/stall", ttl=10)
            known = lease.deadline
            a.signal(signal.SIGSTOP)
            while lease.target != b.addr and not lease.lost.is_set():
                assert time.monotonic() < known + 2
                await asyncio.sleep(0.02)
            assert not lease.lost.is_set(), lease.error
            a.signal(signal.SIGCONT)
            await asyncio.sleep(1.0)
            assert not lease.lost.is_set(), lease.error
            assert await lease.release() is True

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        a.stop()
        b.stop()


#: The broker's AcquireQueued.heartbeat (QueuedHeartbeat in
#: internal/broker/wait.go).
HEARTBEAT = 2.0
#: A waiter on a stopped replica gets the key on another within this many
#: seconds of the stop: WAIT_STALL_BEATS heartbeats of silence, plus room
#: (HTTP/2 keepalive alone would take about 15 s).
MOVED_WITHIN = _core.WAIT_STALL_BEATS * HEARTBEAT + 3.0
LEASE = dict(ttl=10, lock_delay=0)


def assert_moved_in_time(lease, to, stopped, got_at):
    print(f"the waiter got the key on {lease.target} {got_at - stopped:.2f}s after A stopped")
    assert lease.target == to.addr
    assert got_at - stopped < MOVED_WITHIN, f"moved only {got_at - stopped:.1f}s after A stopped"


def test_lock_moves_off_a_replica_cut_from_consul(cluster, key):
    """A lock() whose first replica cannot reach its Consul agent (its link
    refuses: the replica answers UNAVAILABLE, REPLICA_CUT_OFF) takes the
    lock on the next replica at once; a get_lock() moves too. With
    CONSUL_UNAVAILABLE, which also means Consul itself is down, the library
    would raise instead."""
    with one_behind_link(cluster, "cut") as (link, a, b):
        link.cut()
        with lockbroker.Client(a.addr) as only_a:
            with pytest.raises(lockbroker.Unavailable) as e:
                only_a.get_lock(key)
            assert e.value.reason == "REPLICA_CUT_OFF", e.value
        with lockbroker.Client(a.addr, targets=[b.addr]) as c:
            t0 = time.monotonic()
            with c.lock(key, **LEASE) as lease:
                took = time.monotonic() - t0
                print(f"the lock was taken on {lease.target} {took:.2f}s after asking")
                assert lease.target == b.addr
                assert took < 5, took
                assert c.get_lock(key).holders[0].session_id == lease.session_id


def test_hold_moves_off_a_replica_cut_from_consul(cluster, key):
    """A held lease whose replica loses its Consul agent (the link refuses)
    is told `lost: REPLICA_CUT_OFF` once the replica counts as cut off (no
    answer for 3 s), and resumes on the next replica, which renews the
    session: the lease outlives the session's TTL counted from the cut,
    with the same token. Taken for a loss, it would end before that. The
    sync and the asyncio clients alike."""

    async def main(link, a, b):
        with lockbroker.Client(a.addr, targets=[b.addr]) as c:
            async with aio.Client(a.addr, targets=[b.addr]) as ac:
                lease = c.lock(key, **LEASE)
                alease = await ac.lock(key + "/aio", **LEASE)
                assert (lease.target, alease.target) == (a.addr, a.addr)
                tokens = (lease.token, alease.token)
                link.cut()
                cut = time.monotonic()
                while lease.target != b.addr or alease.target != b.addr:
                    assert not lease.lost.is_set(), lease.error
                    assert not alease.lost.is_set(), alease.error
                    assert time.monotonic() < cut + 8, (lease.target, alease.target)
                    await asyncio.sleep(0.02)
                print(f"both leases resumed on B {time.monotonic() - cut:.2f}s after the cut")
                await asyncio.sleep(max(0, cut + LEASE["ttl"] + 2 - time.monotonic()))
                for ls, tok, k in ((lease, tokens[0], key), (alease, tokens[1], key + "/aio")):
                    assert not ls.lost.is_set(), ls.error
                    assert ls.token == tok
                    st = c.get_lock(k)  # A refuses it (cut off): B answers
                    assert [(h.session_id, h.token) for h in st.holders] == [(ls.session_id, tok)]
                assert lease.release() is True
                assert await alease.release() is True

    with one_behind_link(cluster, "hold-cut") as replicas:
        asyncio.run(asyncio.wait_for(main(*replicas), 60))


@contextlib.contextmanager
def one_behind_link(cluster, name):
    """Two replicas: A reaches the Consul agent through a Link (to cut), B
    directly. Yields (link, a, b); cuts the link and stops both after."""
    import cluster as cluster_mod

    link = cluster_mod.Link(cluster.consul.addr)
    a = cluster.broker(name + "-a", consul_addr=link.addr)
    try:
        b = cluster.broker(name + "-b")
        try:
            yield link, a, b
        finally:
            b.stop()
    finally:
        link.cut()
        a.stop()


def test_stalled_waiter_is_moved_to_another(cluster, key):
    """A lock() waiting on a replica that stops (SIGSTOP keeps its
    connection) moves to another after three of the broker's heartbeats of
    silence, and gets the key there when its holder lets go. When the
    stopped replica continues, the waiter it kept (cancelled by the client)
    takes nothing from the one that moved."""
    a, b = cluster.broker("wait-stall-a"), cluster.broker("wait-stall-b")
    try:
        with lockbroker.Client(b.addr) as hc, lockbroker.Client(a.addr, targets=[b.addr]) as c:
            holder = hc.lock(key, **LEASE)
            got = queue.Queue()

            def wait():
                try:
                    got.put((c.lock(key, **LEASE), time.monotonic()))
                except Exception as e:
                    got.put((e, time.monotonic()))

            threading.Thread(target=wait, daemon=True).start()
            time.sleep(1.0)  # the waiter is queued on A
            a.signal(signal.SIGSTOP)
            stopped = time.monotonic()
            time.sleep(0.5)
            holder.release()
            try:
                lease, got_at = got.get(timeout=20)
            except queue.Empty:
                raise AssertionError("the waiter was still waiting 20 s after the release") from None
            assert isinstance(lease, lockbroker.Lease), lease
            assert_moved_in_time(lease, b, stopped, got_at)
            a.signal(signal.SIGCONT)
            time.sleep(2.0)  # A reads the cancel it was sent while stopped
            assert not lease.lost.is_set(), lease.error
            assert hc.check_sequencer(lease.sequencer) is True, "the moved waiter's hold did not survive A waking up"
            assert lease.release() is True
    finally:
        a.stop()
        b.stop()


def test_aio_stalled_waiter_is_moved_to_another(cluster, key):
    """test_stalled_waiter_is_moved_to_another with lockbroker.aio."""
    a, b = cluster.broker("aio-wait-stall-a"), cluster.broker("aio-wait-stall-b")

    async def lock_at(client):
        lease = await client.lock(key, **LEASE)
        return lease, time.monotonic()

    async def main():
        async with aio.Client(b.addr) as hc, aio.Client(a.addr, targets=[b.addr]) as c:
            holder = await hc.lock(key, **LEASE)
            waiter = asyncio.create_task(lock_at(c))
            await asyncio.sleep(1.0)  # the waiter is queued on A
            a.signal(signal.SIGSTOP)
            stopped = time.monotonic()
            await asyncio.sleep(0.5)
            await holder.release()
            try:
                lease, got_at = await asyncio.wait_for(waiter, 20)
            except asyncio.TimeoutError:
                raise AssertionError("the waiter was still waiting 20 s after the release") from None
            assert_moved_in_time(lease, b, stopped, got_at)
            a.signal(signal.SIGCONT)
            await asyncio.sleep(2.0)  # A reads the cancel it was sent while stopped
            assert not lease.lost.is_set(), lease.error
            assert await hc.check_sequencer(lease.sequencer) is True, \
                "the moved waiter's hold did not survive A waking up"
            assert await lease.release() is True

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        a.stop()
        b.stop()


def test_prefix_watch_snapshot_then_changes(client, key):
    a = client.lock(key + "/a", value=b"a")
    client.lock(key + "/b", value=b"b")
    items = queue.Queue()
    with client.watch(key, prefix=True) as w:
        threading.Thread(target=lambda: [items.put(x) for x in w], daemon=True).start()
        snapshot = []
        end = time.monotonic() + 5
        while True:
            try:
                x = items.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                pytest.skip(f"the broker sent no snapshot_complete marker within 5s (got {len(snapshot)} states)")
            if x is lockbroker.SNAPSHOT_COMPLETE:
                break
            snapshot.append(x)
        held = {s.key: s.holder.value for s in snapshot if s.held}
        assert held == {key + "/a": b"a", key + "/b": b"b"}
        a.release()
        end = time.monotonic() + 5
        while True:
            x = items.get(timeout=max(0.0, end - time.monotonic()))
            if x is not lockbroker.SNAPSHOT_COMPLETE and x.key == key + "/a" and not x.held:
                break


def test_no_threads_left_behind(broker, key):
    """Every thread a lease or watch starts ends once it is released or
    closed (names: lockbroker-*)."""
    def ours():
        return [t for t in threading.enumerate() if t.name.startswith("lockbroker-")]

    with lockbroker.Client(broker.addr) as c:
        leases = [c.lock(f"{key}/{i}") for i in range(3)]
        assert len(ours()) >= 6  # a reader and a lease thread each
        leases[0].release()
        with c.watch(key) as w:
            next(w)
        sem = c.semaphore(key + "/sem", 2)
        del sem  # released by close()
    wait_for(lambda: not ours(), 5, f"threads to end: {ours()}")
