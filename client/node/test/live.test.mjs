// The library against real processes (a Consul dev agent and broker
// replicas, from test/conformance/node/cluster.mjs): what the conformance
// scenarios do not cover. Calls the broker does not implement yet skip with
// a message.
//
// Run: npm ci --prefix client/node && node --test client/node/test/

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";

import {
  Client,
  ConflictError,
  Election,
  LockLostError,
  NotLeaderError,
  SNAPSHOT_COMPLETE,
  UnavailableError,
  UnimplementedError,
} from "../src/index.js";
import { Cluster, Link, sleep } from "../../../test/conformance/node/cluster.mjs";

const cluster = new Cluster();
let shared;
const key = (name) => `node-lib/${name}/${randomUUID().slice(0, 8)}`;
const text = (b) => Buffer.from(b).toString();
// How often a waiting request hears `queued` again (internal/broker.QueuedHeartbeat).
const QUEUED_HEARTBEAT_MS = 2000;

before(async () => {
  await cluster.start();
  shared = await cluster.broker("shared");
});

after(async () => {
  await cluster.stop();
});

async function waitFor(pred, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what}: not within ${timeoutMs}ms`);
    await sleep(20);
  }
}

async function using(fn) {
  const clients = [];
  const make = (addr = shared.addr, opts) => {
    const c = new Client(addr, opts);
    clients.push(c);
    return c;
  };
  try {
    await fn(make);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
}

test("semaphore: limit slots, trySemaphore null when full, a release admits the next", () =>
  using(async (make) => {
    const c = make();
    const p = key("sem");
    const a = await c.semaphore(p, 2, { value: "a" });
    const b = await c.semaphore(p, 2, { value: "b" });
    assert.equal(a.sequencer.kind, "semaphore");
    assert.equal(await c.trySemaphore(p, 2), null);
    await assert.rejects(c.semaphore(p, 3, { wait: 0 }), ConflictError);
    const waiting = c.semaphore(p, 2, { wait: 10 });
    await sleep(200);
    await a.release();
    const third = await waiting;
    assert.ok(third.token > b.token);
    assert.equal((await c.getLock(p)).holders.length, 2);
  }));

test("one-slot semaphore (AcquireRequest.kind)", (t) =>
  using(async (make) => {
    const c = make();
    let lease;
    try {
      lease = await c.semaphore(key("sem1"), 1);
    } catch (e) {
      if (e instanceof UnimplementedError) return t.skip(`broker lacks AcquireRequest.kind: ${e.message}`);
      throw e;
    }
    assert.equal(lease.sequencer.kind, "semaphore");
    assert.equal(await c.trySemaphore(lease.key, 1), null);
  }));

test("lock signal: aborting gives up waiting", () =>
  using(async (make) => {
    const c = make();
    const k = key("abort");
    const holder = await c.lock(k);
    const ac = new AbortController();
    const waiting = c.lock(k, { signal: ac.signal });
    await sleep(200);
    ac.abort(new Error("gave up"));
    await assert.rejects(waiting, /gave up/);
    await waitFor(async () => (await c.getLock(k)).holders.length === 1, 5000, "one holder");
    await holder.release();
  }));

test("a Release from elsewhere ends the lease with RELEASED", () =>
  using(async (make) => {
    const c = make();
    const lease = await c.lock(key("rel"));
    assert.equal(await make().release(lease.key, lease.sessionId, lease.token), true);
    const err = await lease.waitLost(5000);
    assert.ok(err instanceof LockLostError);
    assert.equal(err.reason, "RELEASED");
  }));

test("setValue keeps the sequencer; checkSequencer follows the grant", () =>
  using(async (make) => {
    const c = make();
    const lease = await c.lock(key("value"), { value: "v1" });
    await lease.setValue("v2");
    const st = await c.getLock(lease.key);
    assert.equal(text(st.holder.value), "v2");
    assert.equal(st.holder.sessionId, lease.sessionId);
    assert.equal(await c.checkSequencer(lease.sequencer), true);
    await lease.release();
    assert.equal(await c.checkSequencer(lease.sequencer), false);
  }));

test("leader election: campaign, proclaim, leader, observe shows resignation", () =>
  using(async (make) => {
    const k = key("leader");
    const e1 = make().election(k);
    const e2 = make().election(k);
    const ac = new AbortController();
    const seen = [];
    const observing = (async () => {
      try {
        for await (const h of e2.observe({ signal: ac.signal })) seen.push(h ? text(h.value) : null);
      } catch {
        // aborted
      }
    })();
    await waitFor(() => seen.length > 0, 5000, "first observation");
    await assert.rejects(e1.proclaim("x"), NotLeaderError);
    assert.equal(await e1.resign(), false, "nothing to resign");
    const lead = await e1.campaign("node-1");
    assert.equal(text((await e2.leader()).value), "node-1");
    await waitFor(() => seen.includes("node-1"), 5000, "observed leader");
    await e1.proclaim("node-1b");
    await waitFor(() => seen.includes("node-1b"), 5000, "observed proclamation");
    assert.equal((await e2.leader()).token, lead.token, "a proclamation keeps the token");
    assert.equal(await e1.resign(), true);
    await waitFor(() => seen.at(-1) === null, 5000, "observed resignation");
    assert.equal(await e2.leader(), null);
    ac.abort();
    await observing;
    assert.deepEqual(seen, [null, "node-1", "node-1b", null]);
  }));

test("leader(key) is a deprecated election(key)", () =>
  using(async (make) => {
    const warned = new Promise((resolve) => process.once("warning", resolve));
    const e = make().leader(key("deprecated"));
    assert.ok(e instanceof Election);
    const w = await warned;
    assert.equal(w.name, "DeprecationWarning");
    assert.match(w.message, /election\(key\)/);
  }));

test("using(key, fn): holds the lock while fn runs, releases after, passes fn's result or error", () =>
  using(async (make) => {
    const c = make();
    const k = key("using");
    const got = await c.using(k, async (lease) => {
      assert.equal((await c.getLock(k)).holder.sessionId, lease.sessionId);
      assert.equal(await c.tryLock(k), null, "held while fn runs");
      return 42;
    }, { ttl: 10 });
    assert.equal(got, 42);
    assert.equal((await c.getLock(k)).holder, null, "released after fn");
    await assert.rejects(c.using(k, async () => {
      throw new Error("boom");
    }), /boom/);
    assert.equal((await c.getLock(k)).holder, null, "released after fn threw");
    // A hold lost while fn runs: using rejects with the loss, though fn resolved.
    const other = make();
    await assert.rejects(c.using(k, async (lease) => {
      assert.equal(await other.release(k, lease.sessionId, lease.token), true);
      await lease.waitLost();
      return "done";
    }), LockLostError);
  }));

test("client-owned session: TryAcquire, ListSessions, Release", (t) =>
  using(async (make) => {
    const c = make();
    const s = await c.createSession({ ttl: 10, lockDelay: 0, name: "node-cron" });
    try {
      const k = key("cron");
      let seq;
      try {
        seq = await c.tryAcquire(k, s.id, { value: "cron" });
      } catch (e) {
        if (e instanceof UnimplementedError) return t.skip(`broker lacks TryAcquire: ${e.message}`);
        throw e;
      }
      assert.ok(seq.token > 0n);
      assert.equal(await c.tryAcquire(k, (await c.createSession({ ttl: 10 })).id), null);
      try {
        const mine = (await c.listSessions()).find((x) => x.session?.id === s.id);
        assert.ok(mine, "session not listed");
        assert.equal(mine.brokerOwned, false);
        assert.deepEqual(mine.holds.map((h) => h.key), [k]);
      } catch (e) {
        if (!(e instanceof UnimplementedError)) throw e;
        t.diagnostic(`broker lacks ListSessions: ${e.message}`);
      }
      assert.equal(await c.release(k, s.id, seq.token), true);
    } finally {
      await c.destroySession(s.id);
    }
  }));

test("rolling restart: SIGTERM of the holding replica moves the hold (BROKER_SHUTDOWN)", () =>
  using(async (make) => {
    const a = await cluster.broker("term-a");
    const b = await cluster.broker("term-b");
    try {
      const c = make(a.addr, { targets: [b.addr] });
      const lease = await c.lock(key("term"), { ttl: 10 });
      const token = lease.token;
      a.signal("SIGTERM");
      await waitFor(() => lease.target === b.addr, 8000, "resume on B");
      assert.equal(lease.lost, false, lease.error?.message);
      assert.equal(lease.token, token);
      await waitFor(() => a.exit !== null, 10_000, "A exits");
      const st = await make(b.addr).getLock(lease.key);
      assert.deepEqual(st.holders.map((h) => [h.sessionId, h.token]), [[lease.sessionId, token]]);
      assert.equal(await lease.release(), true);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// A lock() whose first replica cannot reach its Consul agent (its link
// refuses: the replica answers UNAVAILABLE, REPLICA_CUT_OFF) takes the lock
// on the next replica at once; a getLock() moves too. With
// CONSUL_UNAVAILABLE, which also means Consul itself is down, the library
// would throw instead.
test("a replica cut off from Consul: lock() takes the next replica", () =>
  using(async (make) =>
    oneBehindLink("cut", async (link, a, b) => {
      link.cut();
      await assert.rejects(make(a.addr).getLock(key("cut")), (err) => {
        assert.ok(err instanceof UnavailableError, String(err));
        assert.equal(err.reason, "REPLICA_CUT_OFF");
        return true;
      });
      const c = make(a.addr, { targets: [b.addr] });
      const t0 = Date.now();
      const lease = await c.lock(key("cut"), { ttl: 10 });
      const took = Date.now() - t0;
      console.log(`the lock was taken on ${lease.target} ${took} ms after asking`);
      assert.equal(lease.target, b.addr);
      assert.ok(took < 5000, `took ${took} ms`);
      const st = await c.getLock(lease.key);
      assert.deepEqual(st.holders.map((h) => h.sessionId), [lease.sessionId]);
      assert.equal(await lease.release(), true);
    })));

test("a replica cut off from Consul: a held lease moves to the next replica (lost: REPLICA_CUT_OFF)", () =>
  using(async (make) => {
    // Once the replica counts as cut off (no answer for 3 s) it tells its
    // holds to resume elsewhere; the next replica renews the session, so the
    // lease outlives the TTL counted from the cut, with the same token.
    // Taken for a loss, it would end before that.
    return oneBehindLink("hold-cut", async (link, a, b) => {
      const c = make(a.addr, { targets: [b.addr] });
      const ttl = 10;
      const lease = await c.lock(key("hold-cut"), { ttl, lockDelay: 0 });
      assert.equal(lease.target, a.addr);
      const token = lease.token;
      link.cut();
      const cut = Date.now();
      await waitFor(() => lease.target === b.addr || lease.lost, 8000, "resume on B");
      console.log(`the lease resumed on ${lease.target} ${Date.now() - cut} ms after the cut`);
      assert.equal(lease.lost, false, lease.error?.message);
      await sleep(Math.max(0, cut + (ttl + 2) * 1000 - Date.now()));
      assert.equal(lease.lost, false, lease.error?.message);
      assert.equal(lease.token, token);
      const st = await c.getLock(lease.key); // A refuses it (cut off): B answers
      assert.deepEqual(st.holders.map((h) => [h.sessionId, h.token]), [[lease.sessionId, token]]);
      assert.equal(await lease.release(), true);
    });
  }));

// oneBehindLink runs fn(link, a, b) with two replicas: A reaches the Consul
// agent through link (to cut), B directly; then cuts the link and stops both.
async function oneBehindLink(name, fn) {
  const link = await Link.open(cluster.consul.addr);
  const a = await cluster.broker(`${name}-a`, [], link.addr);
  try {
    const b = await cluster.broker(`${name}-b`);
    try {
      await fn(link, a, b);
    } finally {
      await b.stop();
    }
  } finally {
    link.cut();
    await a.stop();
  }
}

test("a stalled replica (SIGSTOP) with another configured: the hold moves before the deadline", () =>
  using(async (make) => {
    const a = await cluster.broker("stall-a");
    const b = await cluster.broker("stall-b");
    try {
      const c = make(a.addr, { targets: [b.addr] });
      const lease = await c.lock(key("stall"), { ttl: 10 });
      const token = lease.token;
      const known = lease.deadline;
      a.signal("SIGSTOP");
      await waitFor(() => lease.target === b.addr || lease.lost, known - Date.now() + 2000, "resume on B");
      assert.equal(lease.lost, false, lease.error?.message);
      assert.ok(Date.now() < known, "moved only after the deadline");
      // The stopped replica wakes up: it no longer owns the session and must not touch the hold.
      a.signal("SIGCONT");
      await sleep(1500);
      assert.equal(lease.lost, false, lease.error?.message);
      const st = await make(b.addr).getLock(lease.key);
      assert.deepEqual(st.holders.map((h) => [h.sessionId, h.token]), [[lease.sessionId, token]]);
      assert.equal(await lease.release(), true);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// A request waiting on a replica that stops is moved to another after three
// of the broker's heartbeats of silence, and gets the key there when its
// holder lets go, instead of waiting on the stopped replica until HTTP/2
// keepalive gives up on the connection (10-15 s). When the stopped replica
// continues, the waiter it kept (cancelled by the client) takes nothing from
// the one that moved.
test("a waiter on a stalled replica (SIGSTOP) is moved to another after three heartbeats of silence", (t) =>
  using(async (make) => {
    const a = await cluster.broker("wait-stall-a");
    const b = await cluster.broker("wait-stall-b");
    try {
      const holderClient = make(b.addr);
      const waiterClient = make(a.addr, { targets: [b.addr] });
      const opts = { ttl: 10, lockDelay: 0 };
      const holder = await holderClient.lock(key("wait-stall"), opts);
      const waiting = waiterClient.lock(holder.key, opts).then((lease) => ({ lease, at: performance.now() }));
      // The waiter is queued on A (the holder's hold is the only one).
      await sleep(1000);
      a.signal("SIGSTOP");
      const stopped = performance.now();
      await sleep(500);
      await holder.release();
      const released = performance.now();

      let timer;
      const { lease, at } = await Promise.race([
        waiting,
        new Promise((_, reject) => (timer = setTimeout(() => reject(new Error("the waiter was still waiting 20 s after the release")), 20_000))),
      ]).finally(() => clearTimeout(timer));
      const replica = waiterClient.targets.indexOf(lease.target);
      t.diagnostic(
        `the waiter got the key on replica ${replica} ${Math.round(at - stopped)} ms after A stopped (${Math.round(at - released)} ms after the release)`,
      );
      assert.equal(replica, 1);
      assert.ok(at - stopped < 3 * QUEUED_HEARTBEAT_MS + 3000, `moved only after ${Math.round(at - stopped)} ms`);

      a.signal("SIGCONT");
      await sleep(2000); // A reads the cancel it was sent while stopped
      assert.equal(lease.lost, false, lease.error?.message);
      assert.equal(await holderClient.checkSequencer(lease.sequencer), true, "the moved waiter's hold did not survive A waking up");
      assert.equal(await lease.release(), true);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

test("prefix watch: the states, SNAPSHOT_COMPLETE, then changes", (t) =>
  using(async (make) => {
    const c = make();
    const p = key("prefix");
    const a = await c.lock(`${p}/a`, { value: "a" });
    await c.lock(`${p}/b`, { value: "b" });
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(new Error("timeout")), 5000);
    const it = c.watch(p, { prefix: true, signal: ac.signal });
    const snapshot = [];
    try {
      for (;;) {
        let next;
        try {
          next = await it.next();
        } catch (e) {
          if (ac.signal.aborted) return t.skip(`the broker sent no snapshot_complete marker within 5s (got ${snapshot.length} states)`);
          throw e;
        }
        if (next.value === SNAPSHOT_COMPLETE) break;
        snapshot.push(next.value);
      }
      const held = Object.fromEntries(snapshot.filter((s) => s.held).map((s) => [s.key, text(s.holder.value)]));
      assert.deepEqual(held, { [`${p}/a`]: "a", [`${p}/b`]: "b" });
      await a.release();
      for (;;) {
        const { value } = await it.next();
        if (value !== SNAPSHOT_COMPLETE && value.key === `${p}/a` && !value.held) break;
      }
    } finally {
      clearTimeout(timer);
      ac.abort();
      await it.return();
    }
  }));

// -- the key's shared queue: onQueued tells the place, a moved wait keeps it --

const LEASE = { ttl: 10, lockDelay: 0 };

// A lock(k) waiting through a client of `targets` (the first is where it
// waits first): `heard` collects what its onQueued hears; `lease` or
// `error` is set when it ends. `take(client, opts)` asks for something
// else (a write lock, several keys).
function waiter(make, targets, k, take = (c, opts) => c.lock(k, opts)) {
  const w = { heard: [], lease: undefined, error: undefined };
  const c = make(targets[0], { targets: targets.slice(1) });
  take(c, { ...LEASE, onQueued: (q) => w.heard.push(q) }).then(
    (l) => (w.lease = l),
    (e) => (w.error = e),
  );
  // The first Queued heard from index `from` on that says place n (and, if
  // given, that `waiting` requests wait).
  w.place = (n, { waiting, from = 0, timeoutMs = 10_000 } = {}) =>
    waitFor(
      () => w.heard.slice(from).find((q) => q.position === n && (waiting === undefined || q.waiting === waiting)),
      timeoutMs,
      `place ${n} (waiting ${waiting}) for ${k}`,
    ).catch((e) => {
      throw new Error(`${e.message}; heard [place, waiting] ${JSON.stringify(w.heard.map((q) => [q.position, q.waiting]))}`);
    });
  w.granted = async (timeoutMs) => {
    await waitFor(() => w.lease || w.error, timeoutMs, `the grant of ${k}`);
    if (w.error) throw w.error;
    return w.lease;
  };
  return w;
}

// The live tickets of k's shared queue, oldest first (a ticket whose
// session ended stays, unlocked, until a broker deletes it).
async function queueTickets(k) {
  let ps;
  try {
    ps = (await cluster.consul.http("GET", `/v1/kv/${k}/.queue/?recurse&consistent`)) ?? [];
  } catch (e) {
    if (/: 404 /.test(e.message)) return [];
    throw e;
  }
  return ps.filter((p) => p.Session).sort((x, y) => x.CreateIndex - y.CreateIndex);
}

test("onQueued: two waiters behind a holder hear places 1 and 2; the second moves up when the first is granted", () =>
  using(async (make) => {
    const k = key("queue-place");
    const holder = await make().lock(k, LEASE);
    const first = waiter(make, [shared.addr], k);
    const q1 = await first.place(1);
    assert.equal(q1.state.holder.sessionId, holder.sessionId);
    const second = waiter(make, [shared.addr], k);
    // The first `queued` may count the waiters before the second's ticket;
    // the next one (at once) counts it.
    const q2 = await second.place(2, { waiting: 2, timeoutMs: 5000 });
    assert.equal(q2.state.holder.sessionId, holder.sessionId);
    const heard = second.heard.length;
    await holder.release();
    const lease = await first.granted(10_000);
    const q = await second.place(1, { from: heard });
    assert.equal(q.state.holder.sessionId, lease.sessionId);
  }));

// A wait queued on replica A behind a holder, with later waiters queued on
// B and the shared replica after it, moves to B when A is SIGKILLed: it
// resumes with its session, so its ticket keeps its place (same session,
// same CreateIndex, written again by B), and it is granted before the
// later waiters.
test("a wait moved off a SIGKILLed replica keeps its place in the shared queue", (t) =>
  using(async (make) => {
    const a = await cluster.broker("queue-move-a");
    const b = await cluster.broker("queue-move-b");
    try {
      const k = key("queue-move");
      const holder = await make().lock(k, LEASE);
      const moved = waiter(make, [a.addr, b.addr], k);
      await moved.place(1);
      const tickets = await waitFor(() => queueTickets(k).then((ts) => ts.length && ts), 5000, "the wait's ticket");
      assert.equal(tickets.length, 1);
      const [{ CreateIndex: created, ModifyIndex: modified, Session: session }] = tickets;
      const later = [];
      for (const [n, r] of [[2, b], [3, shared]]) {
        const w = waiter(make, [r.addr], k); // one after the other: arrival order
        later.push(w);
        await w.place(n);
      }

      a.signal("SIGKILL");
      const killed = performance.now();
      const ticket = await waitFor(
        async () => {
          if (moved.error) throw moved.error; // the wait ended instead of moving
          return (await queueTickets(k)).find((p) => p.Session === session && p.ModifyIndex !== modified);
        },
        10_000,
        "the wait's ticket written again by B (same session)",
      );
      t.diagnostic(`the wait moved to B with its place ${Math.round(performance.now() - killed)} ms after A was killed`);
      assert.equal(ticket.CreateIndex, created, "the moved wait's ticket lost its place");
      await moved.place(1, { from: moved.heard.length });

      await holder.release();
      const lease = await moved.granted(10_000);
      assert.equal(lease.target, b.addr);
      assert.equal(lease.sessionId, session, "the moved wait was granted on another session");
      for (const w of later) assert.equal(w.lease, undefined, "a later waiter was granted before the moved one");
      assert.equal(await lease.release(), true);
      const next = await later[0].granted(10_000);
      assert.ok(next.token > lease.token);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// The same with a slot of a limit-1 semaphore: the moved wait resumes on
// B with its session, its contender entry keeps its place (same
// CreateIndex), and it gets the slot before the later waiters.
test("a semaphore wait moved off a SIGKILLed replica keeps its place", () =>
  using(async (make) => {
    const a = await cluster.broker("sem-move-a");
    const b = await cluster.broker("sem-move-b");
    try {
      const k = key("sem-move");
      const slot = (c, opts) => c.semaphore(k, 1, opts);
      const contenders = async () => {
        let ps;
        try {
          ps = (await cluster.consul.http("GET", `/v1/kv/${k}/?recurse&consistent`)) ?? [];
        } catch (e) {
          if (/: 404 /.test(e.message)) return [];
          throw e;
        }
        return ps.filter((p) => p.Session && !p.Key.endsWith("/.lock"));
      };
      const holder = await make().semaphore(k, 1, LEASE);
      const moved = waiter(make, [a.addr, b.addr], k, slot);
      await moved.place(1);
      const entry = await waitFor(
        async () => (await contenders()).find((p) => p.Session !== holder.sessionId),
        5000,
        "the wait's contender entry",
      );
      const later = [];
      for (const [n, r] of [[2, b], [3, shared]]) {
        const w = waiter(make, [r.addr], k, slot); // one after the other: arrival order
        later.push(w);
        await w.place(n);
      }

      a.signal("SIGKILL");
      const from = moved.heard.length;
      await moved.place(1, { from, timeoutMs: 15_000 }); // B says it once the wait moved
      const now = (await contenders()).find((p) => p.Session === entry.Session);
      assert.ok(now, "the moved wait lost its contender entry");
      assert.equal(now.CreateIndex, entry.CreateIndex, "the moved wait lost its place");

      await holder.release();
      const lease = await moved.granted(10_000);
      assert.equal(lease.target, b.addr);
      assert.equal(lease.sessionId, entry.Session, "the moved wait was granted on another session");
      for (const w of later) assert.equal(w.lease, undefined, "a later waiter was granted before the moved one");
      assert.equal(await lease.release(), true);
      const next = await later[0].granted(10_000);
      assert.ok(next.token > lease.token);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// A wait whose session ended while its replica was stopped cannot resume
// its place on the next replica (FAILED_PRECONDITION or NOT_FOUND): the
// library sends its original request there, a fresh wait, which gets the
// key when the holder lets go.
test("a moved wait whose place is gone waits anew", () =>
  using(async (make) => {
    const a = await cluster.broker("queue-gone-a");
    const b = await cluster.broker("queue-gone-b");
    try {
      const k = key("queue-gone");
      const holder = await make().lock(k, LEASE);
      const moved = waiter(make, [a.addr, b.addr], k);
      await moved.place(1);
      const [{ Session: session }] = await waitFor(() => queueTickets(k).then((ts) => ts.length && ts), 5000, "the wait's ticket");
      a.signal("SIGSTOP");
      await cluster.consul.destroySession(session);
      // The wait moves after three heartbeats of silence, is refused its
      // place, and queues anew with another session.
      const [fresh] = await waitFor(
        async () => {
          const ts = (await queueTickets(k)).filter((p) => p.Session !== session);
          return ts.length && ts;
        },
        3 * QUEUED_HEARTBEAT_MS + 9000,
        "a fresh ticket",
      );
      await holder.release();
      const lease = await moved.granted(10_000);
      assert.equal(lease.target, b.addr);
      assert.equal(lease.sessionId, fresh.Session);
      assert.notEqual(lease.sessionId, session);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// Read-write and multi-key locks (issue 43): what S8 and S9 of the
// conformance scenarios leave out.

test("readLock/writeLock signal: an aborted waiting writer leaves the queue, and a later reader shares with the readers", () =>
  using(async (make) => {
    const c = make();
    const k = key("rw-abort");
    const r1 = await c.readLock(k, { wait: 10 });
    const ac = new AbortController();
    let queued = false;
    const writer = c.writeLock(k, { signal: ac.signal, onQueued: () => (queued = true) });
    await waitFor(() => queued, 5000, "the writer queued");
    ac.abort(new Error("writer gave up"));
    await assert.rejects(writer, /writer gave up/);
    // With the writer gone, a reader is no longer behind anyone.
    const r2 = await c.readLock(k, { wait: 5 });
    assert.ok(r2.token > r1.token);
    assert.deepEqual((await c.getLock(k)).holders.map((h) => h.sessionId).sort(), [r1.sessionId, r2.sessionId].sort());
    assert.equal(await c.tryWriteLock(k), null);
    await r1.release();
    await r2.release();
    const w = await c.tryWriteLock(k);
    assert.ok(w, "a free read-write lock refused a try write lock");
    assert.ok(w.token > r2.token);
    await w.release();
  }));

test("lockAll signal: an aborted multi-key wait holds no key, and the free key is takeable", () =>
  using(async (make) => {
    const c = make();
    const base = key("multi-abort");
    const [ka, kb] = [`${base}-a`, `${base}-b`];
    const holder = await c.lock(kb, { wait: 10 });
    const ac = new AbortController();
    let queued = false;
    const waiting = c.lockAll([ka, kb], { signal: ac.signal, onQueued: () => (queued = true) });
    await waitFor(() => queued, 5000, "the multi-key request queued");
    assert.deepEqual((await c.getLock(ka)).holders, [], "a waiting multi-key request holds a subset");
    ac.abort(new Error("gave up"));
    await assert.rejects(waiting, /gave up/);
    // The broker drops the aborted request's tickets when its stream ends
    // (in the background): then the key is free.
    const a = await waitFor(() => c.tryLock(ka), 5000, "the key the aborted request did not get is free");
    await a.release();
    await holder.release();
    const both = await c.tryLockAll([ka, kb]);
    assert.ok(both, "two free keys refused to a try multi-key lock");
    assert.deepEqual(both.keys, [ka, kb]);
    await both.release();
    for (const k of [ka, kb]) assert.deepEqual((await c.getLock(k)).holders, [], k);
  }));

test("lockAll: bad keys are INVALID_ARGUMENT naming keys, and nothing is held", () =>
  using(async (make) => {
    const c = make();
    const k = key("multi-bad");
    for (const keys of [[k, k], [k, "/abs"], [k, ""]]) {
      await assert.rejects(c.lockAll(keys, { wait: 0 }), (e) => {
        assert.equal(e.codeName, "InvalidArgument", `${JSON.stringify(keys)}: ${e.name}: ${e.message}`);
        assert.match(e.message, /keys/, e.message);
        return true;
      });
      assert.deepEqual((await c.getLock(k)).holders, []);
    }
  }));

test("rolling restart: a read hold and a multi-key hold move to the next replica with their kind, keys and tokens", () =>
  using(async (make) => {
    const a = await cluster.broker("rw-term-a");
    const b = await cluster.broker("rw-term-b");
    try {
      const c = make(a.addr, { targets: [b.addr] });
      const base = key("rw-term");
      const reader = await c.readLock(`${base}-rw`, { ttl: 10, wait: 10 });
      const multi = await c.lockAll([`${base}-a`, `${base}-b`], { ttl: 10, wait: 10 });
      const tokens = multi.tokens;
      a.signal("SIGTERM");
      await waitFor(() => reader.target === b.addr && multi.target === b.addr, 8000, "both resumed on B");
      assert.equal(reader.lost, false, reader.error?.message);
      assert.equal(multi.lost, false, multi.error?.message);
      const obs = make(b.addr);
      const st = await obs.getLock(reader.key);
      assert.equal(st.kind, "rwlock");
      assert.deepEqual(st.holders.map((h) => [h.sessionId, h.token, h.read]), [[reader.sessionId, reader.token, true]]);
      // Still a read hold: another reader shares it, a writer waits.
      const r2 = await obs.tryReadLock(reader.key);
      assert.ok(r2, "a second reader was refused beside the resumed read hold");
      assert.equal(await obs.tryWriteLock(reader.key), null);
      await r2.release();
      assert.deepEqual(multi.tokens, tokens);
      for (const [j, k] of multi.keys.entries()) {
        assert.deepEqual((await obs.getLock(k)).holders.map((h) => [h.sessionId, h.token]), [[multi.sessionId, tokens[j]]], k);
      }
      assert.equal(await reader.release(), true);
      assert.equal(await multi.release(), true);
      for (const k of multi.keys) assert.deepEqual((await obs.getLock(k)).holders, [], k);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// A waiting writer moves off a SIGKILLed replica as a writer, keeping its
// place: the reader that came after it keeps waiting behind it (had the
// writer lost its place, that reader would join the holding reader at
// once), and the writer is granted first, on B.
test("a waiting writer moved off a SIGKILLed replica keeps its place ahead of a later reader", () =>
  using(async (make) => {
    const a = await cluster.broker("rw-move-a");
    const b = await cluster.broker("rw-move-b");
    try {
      const k = key("rw-move");
      const reader = await make().readLock(k, LEASE);
      const writer = waiter(make, [a.addr, b.addr], k, (c, o) => c.writeLock(k, o));
      await waitFor(() => writer.heard.length > 0, 5000, "the writer queued");
      const later = waiter(make, [shared.addr], k, (c, o) => c.readLock(k, o));
      await waitFor(() => later.heard.length > 0, 5000, "the later reader queued");
      const heard = writer.heard.length;
      a.signal("SIGKILL");
      await waitFor(() => writer.error || writer.heard.length > heard, 10_000, "the writer queued on B");
      if (writer.error) throw writer.error;
      await sleep(1000);
      assert.equal(later.lease, undefined, "the later reader was granted: the moved writer lost its place");
      assert.equal(writer.lease, undefined);
      await reader.release();
      const lease = await writer.granted(10_000);
      assert.equal(lease.target, b.addr);
      assert.equal(lease.mode, "write");
      assert.ok(lease.token > reader.token);
      assert.equal(later.lease, undefined, "the later reader was granted beside the writer");
      assert.equal(await lease.release(), true);
      const next = await later.granted(10_000);
      assert.ok(next.token > lease.token);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

// A multi-key wait whose replica dies moves to the next replica (the
// client sends the resume: the wait's session, every key, no token) and
// keeps its place.
// It goes on there, holding none of its keys while it waits, and is
// granted all of them together once they are free.
test("a waiting multi-key lock whose replica is SIGKILLed is granted every key on the next replica, holding none meanwhile", () =>
  using(async (make) => {
    const a = await cluster.broker("multi-kill-a");
    const b = await cluster.broker("multi-kill-b");
    try {
      const base = key("multi-kill");
      const [ka, kb] = [`${base}-a`, `${base}-b`];
      const obs = make();
      const holder = await obs.lock(kb, LEASE);
      const moved = waiter(make, [a.addr, b.addr], kb, (c, o) => c.lockAll([ka, kb], o));
      await waitFor(() => moved.heard.length > 0, 5000, "the multi-key request queued");
      const heard = moved.heard.length;
      a.signal("SIGKILL");
      await waitFor(() => moved.error || moved.heard.length > heard, 10_000, "the multi-key request queued on B");
      if (moved.error) throw moved.error;
      const end = performance.now() + 1000;
      while (performance.now() < end) {
        assert.deepEqual((await obs.getLock(ka)).holders, [], "a waiting multi-key request holds a subset");
        await sleep(100);
      }
      await holder.release();
      const lease = await moved.granted(15_000);
      assert.equal(lease.target, b.addr);
      assert.deepEqual(lease.keys, [ka, kb]);
      for (const [j, k] of lease.keys.entries()) {
        assert.deepEqual((await obs.getLock(k)).holders.map((h) => [h.sessionId, h.token]), [[lease.sessionId, lease.tokens[j]]], k);
      }
      assert.ok(lease.tokens[1] > holder.token);
      assert.equal(await lease.release(), true);
    } finally {
      await a.stop();
      await b.stop();
    }
  }));

test("client-owned sessions: tryAcquire with mode read shares, mode write excludes, a plain tryAcquire is a kind conflict", () =>
  using(async (make) => {
    const c = make();
    const k = key("cron-rw");
    const [s1, s2, s3] = await Promise.all([1, 2, 3].map(() => c.createSession({ ttl: 10, lockDelay: 0 })));
    try {
      const r1 = await c.tryAcquire(k, s1.id, { mode: "read", value: "r1" });
      const r2 = await c.tryAcquire(k, s2.id, { mode: "read", value: "r2" });
      assert.ok(r1 && r2, "two readers did not share");
      assert.equal(r1.kind, "rwlock");
      assert.equal(r1.read, true);
      assert.ok(r2.token > r1.token);
      assert.equal(await c.tryAcquire(k, s3.id, { mode: "write" }), null);
      await assert.rejects(c.tryAcquire(k, s3.id), (e) => e instanceof ConflictError && e.reason === "LIMIT_CONFLICT" && e.state?.kind === "rwlock");
      await assert.rejects(c.tryAcquire(k, s3.id, { mode: "both" }), /mode must be/);
      assert.equal(await c.release(k, s1.id, r1.token), true);
      assert.equal(await c.release(k, s2.id, r2.token), true);
      const w = await c.tryAcquire(k, s3.id, { mode: "write" });
      assert.ok(w, "a free read-write lock refused a writer");
      assert.equal(w.read, false);
      assert.ok(w.token > r2.token);
      const st = await c.getLock(k);
      assert.deepEqual(st.holders.map((h) => [h.sessionId, h.read]), [[s3.id, false]]);
      assert.equal(await c.release(k, s3.id, w.token), true);
    } finally {
      await Promise.all([s1, s2, s3].map((s) => c.destroySession(s.id)));
    }
  }));
