"""The conformance scenarios (test/conformance/scenarios.md), Python runner.

Each test is named after its scenario id; test_every_scenario_covered
checks that every id in scenarios.md has a test here. The blocking API
runs every scenario; lockbroker.aio runs them too (test_aio_scenarios.py).
"""

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import uuid

import grpc
import pytest

import lockbroker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCENARIOS = os.path.join(REPO, "test", "conformance", "scenarios.md")


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def test_every_scenario_covered():
    with open(SCENARIOS, encoding="utf-8") as f:
        ids = re.findall(r"^## (S\d+)\b", f.read(), re.M)
    assert ids, "no scenario ids in scenarios.md"
    here = {name.split("_")[1].upper() for name in globals() if re.match(r"test_s\d+_", name)}
    missing = [i for i in ids if i not in here]
    assert not missing, f"scenarios without a Python test: {missing}"


# -- S1 -------------------------------------------------------------------


def test_s1_lock_release_busy_timeout(client, other, key, figure):
    lease = client.lock(key, value=b"a")
    try:
        assert lease.token > 0
        state = other.get_lock(key)
        assert state.kind == "lock"
        assert [(h.session_id, h.value) for h in state.holders] == [(lease.session_id, b"a")]

        # try: None when busy; the error form names the holder.
        assert other.try_lock(key) is None
        with pytest.raises(lockbroker.LockHeld) as busy:
            other.lock(key, wait=0)
        assert lease.session_id in [h.session_id for h in busy.value.holders]

        # bounded wait: about 1 s, then WaitTimeout with the holder.
        t0 = time.monotonic()
        with pytest.raises(lockbroker.WaitTimeout) as timeout:
            other.lock(key, wait=1.0)
        took = time.monotonic() - t0
        figure("S1 bounded wait of 1s took", took)
        assert 0.9 <= took <= 10.0, took
        assert lease.session_id in [h.session_id for h in timeout.value.holders]
    finally:
        assert lease.release() is True
    assert not lease.lost.is_set()
    assert lease.released
    assert not other.get_lock(key).holders
    with pytest.raises(lockbroker.LockLost):
        lease.check()

    with other.lock(key, wait=5) as again:
        assert again.token > lease.token


# -- S2 -------------------------------------------------------------------


def test_s2_loss_on_session_destroy(cluster, client, key, figure):
    lease = client.lock(key, value=b"s2")
    lost_at = []
    lease.on_lost(lambda err: lost_at.append((time.monotonic(), err)))
    t0 = time.monotonic()
    cluster.consul.destroy_session(lease.session_id)
    assert lease.lost.wait(5.0), "loss not reported within 5s"
    latency = wait_for(lambda: lost_at, 1.0, "on_lost callback")[0][0] - t0
    figure("S2 loss reported after session destroy", latency)
    err = lease.error
    assert err.reason in ("SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER"), err
    assert latency <= 1.0, f"loss reported after {latency:.3f}s (promise: 1s)"
    with pytest.raises(lockbroker.LockLost):
        lease.check()
    assert lease.release() is False


# -- S3 -------------------------------------------------------------------


def test_s3_deadline_with_stopped_broker(cluster, key, figure):
    r = cluster.broker("s3-stopped")
    try:
        with lockbroker.Client(r.addr) as c:
            lease = c.lock(key, ttl=10)
            first = lease.deadline
            wait_for(lambda: lease.deadline > first, 10.0, "a keepalive")
            r.signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            known = lease.deadline
            assert lease.lost.wait(known - time.monotonic() + 5.0), "loss never reported"
            reported = time.monotonic()
            info = cluster.consul.session_info(lease.session_id)
            err = lease.error
            # The deadline the library last knew (a keepalive sent before the
            # stop may still have arrived after it).
            last = lease.deadline
            assert last - known < 5.0, "keepalives kept coming from a stopped broker"
            margin = last - reported
            figure("S3 loss reported before the deadline by", margin)
            figure("S3 loss reported after SIGSTOP", reported - stopped_at)
            assert err.reason == "KEEPALIVE_TIMEOUT", err
            assert 0 < margin <= 1.0, f"loss reported {margin:.3f}s before the deadline"
            assert info, "the session was gone when the loss was reported: the guarantee was false"
    finally:
        r.stop()


# -- S4 -------------------------------------------------------------------


def test_s4_resume_then_loss(cluster, key, figure):
    a = cluster.broker("s4-a")
    b = cluster.broker("s4-b")
    try:
        with lockbroker.Client(a.addr, targets=[b.addr]) as c, lockbroker.Client(b.addr) as observer:
            lease = c.lock(key, ttl=10)
            assert lease.target == a.addr
            token = lease.token
            known = lease.deadline
            a.signal(signal.SIGKILL)
            killed = time.monotonic()
            wait_for(lambda: lease.target == b.addr, known - time.monotonic(), "resume on B")
            figure("S4 resumed on B after SIGKILL of A", time.monotonic() - killed)
            assert not lease.lost.is_set(), lease.error
            assert lease.token == token
            state = observer.get_lock(key)
            assert [(h.session_id, h.token) for h in state.holders] == [(lease.session_id, token)]
            wait_for(lambda: lease.deadline > known + 1.0, 10.0, "keepalives from B")
            assert not lease.lost.is_set(), lease.error
            lease.check()

            b.signal(signal.SIGKILL)
            known = lease.deadline
            assert lease.lost.wait(known - time.monotonic() + 5.0), "loss never reported"
            reported = time.monotonic()
            margin = lease.deadline - reported  # the deadline the library last knew
            figure("S4 loss with no replica left, before the deadline by", margin)
            assert lease.error.reason == "KEEPALIVE_TIMEOUT", lease.error
            assert 0 < margin <= 1.0, f"loss reported {margin:.3f}s before the deadline"
    finally:
        a.stop()
        b.stop()


# -- S5 -------------------------------------------------------------------


class CLI:
    """One `hold` CLI process (any language) and its JSON lines."""

    def __init__(self, argv, env=None):
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, text=True)
        self.events = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                self.events.append(ev)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exit"})
            self._cond.notify_all()

    def has(self, name):
        with self._cond:
            return any(e["event"] == name for e in self.events)

    def wait(self, name, timeout):
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if e["event"] == name:
                        return e
                    if e["event"] in ("error", "lost"):
                        raise AssertionError(f"CLI failed: {e}; stderr: {self.proc.stderr.read()}")
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {name} within {timeout}s: {self.events}")
                self._cond.wait(left)

    def release(self):
        """Closing stdin makes the CLI release and exit."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self):
        self.release()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def python_cli(addr, key, limit, seconds):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client", "python"))
    return CLI(["/usr/bin/python3", "-m", "lockbroker.conformance", "hold", "--target", addr, "--key", key,
                "--limit", str(limit), "--seconds", str(seconds)], env=env)


def node_cli(addr, key, limit, seconds):
    script = os.path.join(REPO, "client", "node", "conformance.mjs")
    return CLI(["node", script, "hold", "--target", addr, "--key", key, "--limit", str(limit),
                "--seconds", str(seconds)])


def node_available():
    return (subprocess.run(["node", "--version"], capture_output=True).returncode == 0
            and os.path.isdir(os.path.join(REPO, "client", "node", "node_modules", "@connectrpc")))


def test_s5_semaphore_limit_across_processes(broker, client, key, figure):
    """Two Python and (when installed) two Node CLI holders on one prefix,
    limit 3: never more than 3 hold, the fourth waits, then gets a slot."""
    makers = [python_cli, python_cli]
    makers += [node_cli, node_cli] if node_available() else [python_cli, python_cli]
    seen_max = [0]
    stop = threading.Event()

    def observe():
        for state in client.watch(key):
            seen_max[0] = max(seen_max[0], len(state.holders))
            if stop.is_set():
                return

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    clis = []
    try:
        for make in makers:
            clis.append(make(broker.addr, key, 3, 60))
        wait_for(lambda: sum(c.has("acquired") for c in clis) == 3, 30.0, "three holders")
        time.sleep(1.0)  # the fourth keeps waiting while the three hold
        holding = [c for c in clis if c.has("acquired")]
        waiting = [c for c in clis if not c.has("acquired")]
        assert len(holding) == 3 and len(waiting) == 1
        assert len(client.get_lock(key).holders) == 3
        holding[0].release()
        holding[0].wait("released", 15.0)
        waiting[0].wait("acquired", 15.0)
        assert len(client.get_lock(key).holders) == 3
    finally:
        stop.set()
        for c in clis:
            c.stop()
    assert seen_max[0] <= 3, f"an observer saw {seen_max[0]} holders"
    langs = sorted({c.wait("acquired", 1)["lang"] for c in clis if c.has("acquired")})
    figure("S5 languages holding", ",".join(langs), "")


# -- S6 -------------------------------------------------------------------


class States:
    """A Watch read on a thread, so every wait has a bound."""

    def __init__(self, watch):
        self.watch = watch
        self.items = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        try:
            for st in self.watch:
                self.items.put(st)
        except Exception as e:  # noqa: BLE001 - handed to the test
            self.items.put(e)

    def until(self, pred, timeout=5.0):
        end = time.monotonic() + timeout
        seen = []
        while True:
            try:
                st = self.items.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no matching state within {timeout}s; saw {seen}") from None
            if isinstance(st, Exception):
                raise st
            if pred(st):
                return st
            seen.append(st)


def test_s6_watch_holder_then_none(client, other, key):
    with client.watch(key) as w:
        states = States(w)
        first = states.until(lambda st: True)
        assert first.kind == "none" and not first.holders and first.holder is None
        lease = other.lock(key, value=b"w")
        st = states.until(lambda st: st.held)
        assert (st.holder.session_id, st.holder.value) == (lease.session_id, b"w")
        lease.release()
        st = states.until(lambda st: not st.held)
        assert st.holder is None and st.holders == ()


# -- S7 -------------------------------------------------------------------


def s7_keys():
    """A key of tenant payments (prefix payments/) and one outside it."""
    tag = uuid.uuid4().hex[:8]
    return f"payments/py/{tag}", f"orders/py/{tag}"


def test_s7_tls_and_token(secure, figure):
    pki, token, tls, mtls = secure.pki, secure.token, secure.tls, secure.mtls
    key, outside = s7_keys()
    TLS = lockbroker.TLS

    # TLS with the CA and the token; mTLS with the token; mTLS alone (the
    # certificate's cn:payments-api is the identity): lock and release.
    setups = (("TLS and token", tls.addr, TLS(ca=pki.ca), token),
              ("mTLS and token", mtls.addr, TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key), token),
              ("mTLS without token", mtls.addr, TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key), None))
    last = 0
    for what, addr, opts, tok in setups:
        with lockbroker.Client(addr, tls=opts, token=tok, timeout=5) as c:
            t0 = time.monotonic()
            lease = c.lock(key, value=b"s7", wait=5)
            figure(f"S7 lock over {what}", time.monotonic() - t0)
            assert lease.token > last, what
            last = lease.token
            state = c.get_lock(key)
            assert [(h.session_id, h.value) for h in state.holders] == [(lease.session_id, b"s7")], what
            assert lease.release() is True, what
            assert not lease.lost.is_set() and lease.released, what
            assert not c.get_lock(key).holders, what

            # A key outside the tenant's prefixes: PERMISSION_DENIED naming it.
            with pytest.raises(lockbroker.PermissionDenied) as denied:
                c.lock(outside, wait=5)
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED, what
            assert denied.value.reason == "PERMISSION_DENIED", (what, denied.value)
            assert outside in denied.value.message and denied.value.metadata.get("key") == outside, (what, denied.value)

    # TLS without a token (and without a certificate), or with a token the
    # tenants file does not know: UNAUTHENTICATED.
    for what, tok in (("no token", None), ("an unknown token", "not-" + token)):
        with lockbroker.Client(tls.addr, tls=TLS(ca=pki.ca), token=tok, timeout=5) as c:
            with pytest.raises(lockbroker.Unauthenticated) as unauth:
                c.lock(key, wait=5)
            assert unauth.value.code == grpc.StatusCode.UNAUTHENTICATED, (what, unauth.value)
            assert unauth.value.reason == "UNAUTHENTICATED", (what, unauth.value)
            print(f"S7 with {what}: {unauth.value}")

    # Without the CA (system roots), with another CA, in plaintext, or
    # without the client certificate mTLS asks for: no connection.
    refused = (("system roots, not the CA", tls.addr, True),
               ("another CA", tls.addr, TLS(ca=pki.other_ca)),
               ("plaintext", tls.addr, None),
               ("mTLS without a client certificate", mtls.addr, TLS(ca=pki.ca)))
    for what, addr, opts in refused:
        with lockbroker.Client(addr, tls=opts, token=token, timeout=5) as c:
            t0 = time.monotonic()
            with pytest.raises(lockbroker.Unavailable) as unavailable:
                c.lock(key, wait=5)
            figure(f"S7 refused connection ({what}) after", time.monotonic() - t0)
            assert unavailable.value.code == grpc.StatusCode.UNAVAILABLE, (what, unavailable.value)
            print(f"S7 with {what}: {unavailable.value}")
    with lockbroker.Client(tls.addr, tls=TLS(ca=pki.ca), token=token, timeout=5) as c:
        assert not c.get_lock(key).holders, "nothing was held through a refused connection"


# -- S8 -------------------------------------------------------------------


class Pending:
    """A blocking call (e.g. a lock that waits) on a thread of its own, so
    that every wait on it has a bound."""

    def __init__(self, fn, *args, **kw):
        self.items = queue.Queue()
        threading.Thread(target=self._run, args=(fn, args, kw), daemon=True).start()

    def _run(self, fn, args, kw):
        try:
            self.items.put(fn(*args, **kw))
        except Exception as e:  # noqa: BLE001 - handed to the test
            self.items.put(e)

    def result(self, timeout):
        """What the call returned (raising what it raised), or None when it
        has not returned within timeout."""
        try:
            got = self.items.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(got, Exception):
            raise got
        self.items.put(got)  # a later result() sees it too
        return got


def kv_snapshot(cluster, key):
    """What Consul has at key and under key/: (Key, ModifyIndex, Flags, Session)."""
    try:
        entries = cluster.consul.http("GET", f"/v1/kv/{key}?recurse&consistent") or []
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise
    return sorted((e["Key"], e["ModifyIndex"], e["Flags"], e.get("Session")) for e in entries)


def test_s8_read_write_lock(cluster, broker, client, other, key, figure):
    plain = key + "-plain"
    with lockbroker.Client(broker.addr) as third_client, lockbroker.Client(broker.addr) as writer_client:
        # 1. Two readers hold at once; GetLock shows both, read, kind rwlock.
        r1 = client.read_lock(key, value=b"r1", wait=10)
        r2 = other.read_lock(key, value=b"r2", wait=10)
        assert (r1.mode, r2.mode) == ("read", "read")
        assert r1.sequencer.kind == "rwlock" and r1.sequencer.read and r2.sequencer.read
        assert r2.token > r1.token > 0
        state = client.get_lock(key)
        assert state.kind == "rwlock"
        assert sorted((h.session_id, h.read) for h in state.holders) == sorted(
            [(r1.session_id, True), (r2.session_id, True)])

        # 2. A writer waits; a reader that arrives after it waits too.
        writer_queued = threading.Event()
        writer = Pending(writer_client.write_lock, key, value=b"w", wait=30,
                         on_queued=lambda q: writer_queued.set())
        assert writer_queued.wait(10), "the writer never said it waits"
        assert writer.result(0.2) is None, "the writer was granted beside readers"
        third = Pending(third_client.read_lock, key, value=b"r3", wait=30)
        t0 = time.monotonic()
        assert third.result(1.0) is None, "a reader behind a queued writer was granted"
        figure("S8 third reader still waiting after", time.monotonic() - t0)
        assert sorted(h.session_id for h in client.get_lock(key).holders) == sorted([r1.session_id, r2.session_id])

        # 3. The readers let go: the writer, then (after it) the third reader.
        t0 = time.monotonic()
        assert r1.release() and r2.release()
        w = writer.result(10)
        assert w is not None, "the writer was not granted after the readers let go"
        figure("S8 writer granted after the readers released", time.monotonic() - t0)
        assert w.mode == "write" and w.sequencer.kind == "rwlock" and not w.sequencer.read
        assert w.token > max(r1.token, r2.token)
        assert third.result(0.5) is None, "the third reader was granted beside the writer"
        state = client.get_lock(key)
        assert [(h.session_id, h.read) for h in state.holders] == [(w.session_id, False)]
        assert w.release()
        r3 = third.result(10)
        assert r3 is not None, "the third reader was not granted after the writer let go"
        assert r3.mode == "read" and r3.token > w.token
        try:
            # 4. Kind conflicts: a lock on the read-write lock, a read on a lock.
            with other.lock(plain, value=b"p", wait=10) as lease:
                before = (kv_snapshot(cluster, key), kv_snapshot(cluster, plain))
                with pytest.raises(lockbroker.Conflict) as on_rw:
                    other.try_lock(key)
                assert on_rw.value.reason == "LIMIT_CONFLICT", on_rw.value
                assert on_rw.value.state is not None and on_rw.value.state.kind == "rwlock", on_rw.value
                assert "RWLOCK" in on_rw.value.message, on_rw.value  # names the kind found
                with pytest.raises(lockbroker.Conflict) as on_lock:
                    client.try_read_lock(plain)
                assert on_lock.value.reason == "LIMIT_CONFLICT", on_lock.value
                assert on_lock.value.state is not None and on_lock.value.state.kind == "lock", on_lock.value
                assert re.search(r"\bLOCK\b", on_lock.value.message), on_lock.value
                assert (kv_snapshot(cluster, key), kv_snapshot(cluster, plain)) == before
                assert not lease.lost.is_set() and not r3.lost.is_set()
        finally:
            r3.release()


# -- S9 -------------------------------------------------------------------


def test_s9_multi_key_lock(cluster, broker, client, other, key, figure):
    a, b, c, d = (f"{key}/{n}" for n in "abcd")
    # 1. A, B and C as one: one session, one token per key in order.
    first = client.lock_all([a, b, c], value=b"abc", wait=10)
    try:
        assert first.keys == (a, b, c) and len(first.tokens) == 3 and all(t > 0 for t in first.tokens)
        assert [s.key for s in first.sequencers] == [a, b, c]
        assert {s.session_id for s in first.sequencers} == {first.session_id}
        assert (first.key, first.token) == (a, first.tokens[0])
        for k, token in zip(first.keys, first.tokens):
            assert [(h.session_id, h.token) for h in other.get_lock(k).holders] == [(first.session_id, token)], k

        # 2. B is busy for a second client; its C and D wait, holding neither.
        assert other.try_lock(b) is None
        with pytest.raises(lockbroker.LockHeld) as busy:
            other.lock(b, wait=0)
        assert first.session_id in [h.session_id for h in busy.value.holders]
        queued = threading.Event()
        second_pending = Pending(other.lock_all, [c, d], value=b"cd", wait=30, on_queued=lambda q: queued.set())
        assert queued.wait(10), "the second multi-key request never said it waits"
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert not client.get_lock(d).holders, "a waiting multi-key request holds a subset (D)"
            assert second_pending.result(0.1) is None, "granted C and D while C is held"
    finally:
        t0 = time.monotonic()
        assert first.release() is True

    # 3. The first lets go: the second gets C and D together.
    second = second_pending.result(10)
    assert second is not None, "the waiting multi-key request was not granted"
    figure("S9 waiting multi-key request granted after the release", time.monotonic() - t0)
    try:
        assert second.keys == (c, d) and second.tokens[0] > first.tokens[2]
        for k, token in zip(second.keys, second.tokens):
            assert [(h.session_id, h.token) for h in client.get_lock(k).holders] == [(second.session_id, token)], k
        for k in (a, b):
            assert not client.get_lock(k).holders, k

        # 4. D deleted behind the broker's back: lost within 1 s naming D,
        # and C is released.
        lost_at = []
        second.on_lost(lambda err: lost_at.append(time.monotonic()))
        t0 = time.monotonic()
        cluster.consul.http("DELETE", f"/v1/kv/{d}")
        assert second.lost.wait(5.0), "loss not reported within 5s"
        latency = wait_for(lambda: lost_at, 1.0, "on_lost callback")[0] - t0
        figure("S9 loss reported after deleting D", latency)
        assert second.lost_key == d and second.error.key == d, second.error
        assert latency <= 1.0, f"loss reported after {latency:.3f}s (promise: 1s)"
        wait_for(lambda: not client.get_lock(c).holders, 5.0, "C released after the loss of D")
        with pytest.raises(lockbroker.LockLost):
            second.check()
    finally:
        second.release()


# -- S10 ------------------------------------------------------------------


def python_hold(addr, key, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client", "python"))
    return CLI(["/usr/bin/python3", "-m", "lockbroker.conformance", "hold", "--target", addr, "--key", key, *args],
               env=env)


def test_s10_read_write_across_processes(broker, key, figure):
    """S10 is the Go runner's, with every language's CLI at once; here the
    Python CLI's side of it, in processes of their own: readers and writers
    on one key, from the printed `t` of their lines no writer beside anyone
    and readers that share; a multi-key hold prints one token per key."""
    clis = []
    try:
        readers = [python_hold(broker.addr, key, "--mode", "read", "--seconds", "2") for _ in range(2)]
        clis += readers
        for r in readers:
            r.wait("acquired", 20)
        for mode, seconds in (("write", "1"), ("read", "1.5"), ("write", "1"), ("read", "1.5"), ("read", "1.5")):
            clis.append(python_hold(broker.addr, key, "--mode", mode, "--seconds", seconds))
            time.sleep(0.3)  # arrival order: the broker serves them in it
        for cli in clis:
            cli.wait("released", 40)
        multi = python_hold(broker.addr, key + "-a", "--also", key + "-b", "--also", key + "-c", "--seconds", "0.2")
        clis.append(multi)
        got = multi.wait("acquired", 20)
        multi.wait("released", 20)
    finally:
        for cli in clis:
            cli.stop()
    assert got["mode"] == "lock" and got["keys"] == [key + "-a", key + "-b", key + "-c"]
    assert len(got["tokens"]) == 3 and got["tokens"][0] == got["token"]

    # A hold's interval ends when its release was asked for (`release_t` on
    # `released`): the next holder may be granted, and print `acquired`,
    # before this one prints `released`.
    holds = []
    for cli in clis[:-1]:
        acq, rel = cli.wait("acquired", 1), cli.wait("released", 1)
        holds.append((acq["t"], rel["release_t"], acq["mode"], acq["token"]))
    holds.sort()
    assert [m for _, _, m, _ in holds].count("write") == 2
    for i, (s1, e1, m1, _) in enumerate(holds):
        for s2, e2, m2, _ in holds[i + 1:]:
            if "write" in (m1, m2):
                assert e1 <= s2 or e2 <= s1, f"a writer's hold overlaps another's: {holds}"
    shared = [(h1, h2) for i, h1 in enumerate(holds) for h2 in holds[i + 1:]
              if h1[2] == h2[2] == "read" and h1[0] < h2[1] and h2[0] < h1[1]]
    assert shared, f"no two readers held at once: {holds}"
    writer_tokens = [tok for _, _, m, tok in holds if m == "write"]
    assert writer_tokens == sorted(writer_tokens) and len(set(writer_tokens)) == 2
    tokens = [tok for _, _, _, tok in holds]
    for (s1, _, m1, t1), (s2, _, m2, t2) in zip(holds, holds[1:]):
        if "write" in (m1, m2):
            assert t2 > t1, f"a grant after a writer (or a writer) has no larger token: {holds}"
    figure("S10 (Python CLIs) holds, readers sharing", f"{len(holds)}, {len(shared)} pairs", "")
    assert len(tokens) == 7
