"""The conformance scenarios through lockbroker.aio (asyncio).

S3 (a stopped broker) is run by the blocking API only: the deadline code
path it checks is also what ends S4 here, and each costs a TTL of waiting.
S5 runs CLI processes (language-level, not API-level). S7 runs here too:
grpc.aio makes its own secure channels.
"""

import asyncio
import signal
import time
import urllib.error
import uuid

import grpc
import pytest

import lockbroker
from lockbroker import aio


def run(coro, timeout=90):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.02)


def test_aio_s1_lock_release_busy_timeout(broker, key):
    async def main():
        async with aio.Client(broker.addr) as client, aio.Client(broker.addr) as other:
            lease = await client.lock(key, value=b"a")
            assert lease.token > 0
            state = await other.get_lock(key)
            assert [(h.session_id, h.value) for h in state.holders] == [(lease.session_id, b"a")]
            assert await other.try_lock(key) is None
            with pytest.raises(lockbroker.LockHeld) as busy:
                await other.lock(key, wait=0)
            assert lease.session_id in [h.session_id for h in busy.value.holders]
            t0 = time.monotonic()
            with pytest.raises(lockbroker.WaitTimeout) as timeout:
                await other.lock(key, wait=1.0)
            took = time.monotonic() - t0
            assert 0.9 <= took <= 10.0, took
            assert lease.session_id in [h.session_id for h in timeout.value.holders]
            assert await lease.release() is True
            assert not lease.lost.is_set() and lease.released
            assert not (await other.get_lock(key)).holders
            async with await other.lock(key, wait=5) as again:
                assert again.token > lease.token
    run(main())


def test_aio_s2_loss_on_session_destroy(cluster, broker, key, figure):
    async def main():
        async with aio.Client(broker.addr) as client:
            lease = await client.lock(key)
            got = []
            lease.on_lost(lambda err: got.append(time.monotonic()))
            t0 = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, cluster.consul.destroy_session, lease.session_id)
            err = await lease.wait_lost(5.0)
            assert err is not None, "loss not reported within 5s"
            latency = got[0] - t0
            figure("S2 (aio) loss reported after session destroy", latency)
            assert err.reason in ("SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER"), err
            assert latency <= 1.0
            with pytest.raises(lockbroker.LockLost):
                lease.check()
    run(main())


def test_aio_s4_resume_then_loss(cluster, key, figure):
    a = cluster.broker("aio-s4-a")
    b = cluster.broker("aio-s4-b")

    async def main():
        async with aio.Client(a.addr, targets=[b.addr]) as c:
            lease = await c.lock(key, ttl=10)
            assert lease.target == a.addr
            token, known = lease.token, lease.deadline
            a.signal(signal.SIGKILL)
            killed = time.monotonic()
            await wait_for(lambda: lease.target == b.addr, known - time.monotonic(), "resume on B")
            figure("S4 (aio) resumed on B after SIGKILL of A", time.monotonic() - killed)
            assert not lease.lost.is_set(), lease.error
            assert lease.token == token
            state = await c.get_lock(key)
            assert [(h.session_id, h.token) for h in state.holders] == [(lease.session_id, token)]
            await wait_for(lambda: lease.deadline > known + 1.0, 10.0, "keepalives from B")
            b.signal(signal.SIGKILL)
            known = lease.deadline
            err = await lease.wait_lost(known - time.monotonic() + 5.0)
            reported = time.monotonic()
            assert err is not None, "loss never reported"
            margin = lease.deadline - reported  # the deadline the library last knew
            figure("S4 (aio) loss with no replica left, before the deadline by", margin)
            assert err.reason == "KEEPALIVE_TIMEOUT", err
            assert 0 < margin <= 1.0, margin
    try:
        run(main())
    finally:
        a.stop()
        b.stop()


def test_aio_s6_watch_holder_then_none(broker, key):
    async def main():
        async with aio.Client(broker.addr) as client, aio.Client(broker.addr) as other:
            async with client.watch(key) as w:
                async def until(pred):
                    async for st in w:
                        if pred(st):
                            return st
                first = await asyncio.wait_for(until(lambda st: True), 5)
                assert first.kind == "none" and first.holder is None
                lease = await other.lock(key, value=b"w")
                st = await asyncio.wait_for(until(lambda st: st.held), 5)
                assert (st.holder.session_id, st.holder.value) == (lease.session_id, b"w")
                await lease.release()
                st = await asyncio.wait_for(until(lambda st: not st.held), 5)
                assert st.holders == ()
    run(main())


def test_aio_s7_tls_and_token(secure):
    pki, token = secure.pki, secure.token
    tag = uuid.uuid4().hex[:8]
    key, outside = f"payments/py-aio/{tag}", f"orders/py-aio/{tag}"
    TLS = lockbroker.TLS
    mtls_opts = TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)

    async def main():
        last = 0
        for what, addr, opts in (("TLS", secure.tls.addr, TLS(ca=pki.ca)), ("mTLS", secure.mtls.addr, mtls_opts)):
            async with aio.Client(addr, tls=opts, token=token, timeout=5) as c:
                lease = await c.lock(key, value=b"s7", wait=5)
                assert lease.token > last, what
                last = lease.token
                state = await c.get_lock(key)
                assert [(h.session_id, h.value) for h in state.holders] == [(lease.session_id, b"s7")], what
                assert await lease.release() is True, what
                assert not lease.lost.is_set() and lease.released, what
                assert not (await c.get_lock(key)).holders, what
                with pytest.raises(lockbroker.PermissionDenied) as denied:
                    await c.lock(outside, wait=5)
                assert denied.value.reason == "PERMISSION_DENIED", (what, denied.value)
                assert outside in denied.value.message and denied.value.metadata.get("key") == outside, what

        async with aio.Client(secure.tls.addr, tls=TLS(ca=pki.ca), timeout=5) as c:
            with pytest.raises(lockbroker.Unauthenticated) as unauth:
                await c.lock(key, wait=5)
            assert unauth.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert unauth.value.reason == "UNAUTHENTICATED", unauth.value

        for what, addr, opts in (("another CA", secure.tls.addr, TLS(ca=pki.other_ca)),
                                 ("mTLS without a client certificate", secure.mtls.addr, TLS(ca=pki.ca))):
            async with aio.Client(addr, tls=opts, token=token, timeout=5) as c:
                with pytest.raises(lockbroker.Unavailable) as unavailable:
                    await c.lock(key, wait=5)
                assert unavailable.value.code == grpc.StatusCode.UNAVAILABLE, (what, unavailable.value)
    run(main(), timeout=30)


async def kv_snapshot(cluster, key):
    loop = asyncio.get_running_loop()
    entries = await loop.run_in_executor(None, lambda: _kv(cluster, key))
    return sorted((e["Key"], e["ModifyIndex"], e["Flags"], e.get("Session")) for e in entries)


def _kv(cluster, key):
    try:
        return cluster.consul.http("GET", f"/v1/kv/{key}?recurse&consistent") or []
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise


async def still_waiting(task, seconds):
    """True when task has not finished within seconds."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return not done


def test_aio_s8_read_write_lock(cluster, broker, key):
    plain = key + "-plain"

    async def main():
        async with aio.Client(broker.addr) as c1, aio.Client(broker.addr) as c2, \
                aio.Client(broker.addr) as c3, aio.Client(broker.addr) as cw:
            r1 = await c1.read_lock(key, value=b"r1", wait=10)
            r2 = await c2.read_lock(key, value=b"r2", wait=10)
            assert (r1.mode, r2.mode) == ("read", "read") and r2.token > r1.token > 0
            state = await c1.get_lock(key)
            assert state.kind == "rwlock"
            assert sorted((h.session_id, h.read) for h in state.holders) == sorted(
                [(r1.session_id, True), (r2.session_id, True)])

            queued = asyncio.Event()
            writer = asyncio.ensure_future(cw.write_lock(key, wait=30, on_queued=lambda q: queued.set()))
            await asyncio.wait_for(queued.wait(), 10)
            third = asyncio.ensure_future(c3.read_lock(key, wait=30))
            assert await still_waiting(third, 1.0), "a reader behind a queued writer was granted"
            assert not writer.done()

            assert await r1.release() and await r2.release()
            w = await asyncio.wait_for(writer, 10)
            assert w.mode == "write" and not w.sequencer.read and w.token > r2.token
            assert await still_waiting(third, 0.5), "the third reader was granted beside the writer"
            assert await w.release()
            async with await asyncio.wait_for(third, 10) as r3:
                assert r3.mode == "read" and r3.token > w.token
                async with await c2.lock(plain, wait=10):
                    before = (await kv_snapshot(cluster, key), await kv_snapshot(cluster, plain))
                    with pytest.raises(lockbroker.Conflict) as on_rw:
                        await c2.try_lock(key)
                    assert on_rw.value.reason == "LIMIT_CONFLICT" and on_rw.value.state.kind == "rwlock"
                    assert "RWLOCK" in on_rw.value.message
                    with pytest.raises(lockbroker.Conflict) as on_lock:
                        await c1.try_write_lock(plain)
                    assert on_lock.value.reason == "LIMIT_CONFLICT" and on_lock.value.state.kind == "lock"
                    assert "kind LOCK" in on_lock.value.message
                    assert (await kv_snapshot(cluster, key), await kv_snapshot(cluster, plain)) == before
    run(main())


def test_aio_s9_multi_key_lock(cluster, broker, key, figure):
    a, b, c, d = (f"{key}/{n}" for n in "abcd")

    async def main():
        async with aio.Client(broker.addr) as client, aio.Client(broker.addr) as other:
            first = await client.lock_all([a, b, c], wait=10)
            assert first.keys == (a, b, c) and len(first.tokens) == 3 and all(t > 0 for t in first.tokens)
            for k, token in zip(first.keys, first.tokens):
                assert [(h.session_id, h.token) for h in (await other.get_lock(k)).holders] == [
                    (first.session_id, token)]
            assert await other.try_lock(b) is None
            queued = asyncio.Event()
            pending = asyncio.ensure_future(other.lock_all([c, d], wait=30, on_queued=lambda q: queued.set()))
            await asyncio.wait_for(queued.wait(), 10)
            for _ in range(5):
                assert not (await client.get_lock(d)).holders, "a waiting multi-key request holds a subset (D)"
                assert await still_waiting(pending, 0.2)
            assert await first.release()
            second = await asyncio.wait_for(pending, 10)
            assert second.keys == (c, d) and second.tokens[0] > first.tokens[2]
            t0 = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, cluster.consul.http, "DELETE", f"/v1/kv/{d}")
            err = await second.wait_lost(5.0)
            latency = time.monotonic() - t0
            figure("S9 (aio) loss reported after deleting D", latency)
            assert err is not None and second.lost_key == d, err
            assert latency <= 1.0, latency
            end = time.monotonic() + 5
            while (await client.get_lock(c)).holders:
                assert time.monotonic() < end, "C not released after the loss of D"
                await asyncio.sleep(0.05)
    run(main())
