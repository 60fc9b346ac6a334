// A Node client of lockbroker: @connectrpc/connect v2 over gRPC (HTTP/2)
// with the stubs in gen/es. A client never renews anything: it holds a lock
// by keeping the Acquire stream open, and gives it up by aborting the stream
// or with Release.
//
// Run: npm ci --prefix test/node && node --test test/node/

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import { LostReason } from "../../gen/es/lockbroker/v1/lock_pb.js";
import { LockKind } from "../../gen/es/lockbroker/v1/types_pb.js";
import { Broker, Hold, REPO, WatchReader, uniqueKey } from "./fixture.mjs";

const broker = new Broker();
let client;
let opened = [];

before(async () => {
  await broker.start();
  client = broker.client;
});

after(async () => {
  for (const c of opened) c.close();
  await broker.stop();
});

const enc = (s) => new TextEncoder().encode(s);
const holders = (state) => state.holders.map((h) => h.sessionId);

function hold(req) {
  const h = new Hold(client, req);
  opened.push(h);
  return h;
}

function watch(key) {
  const w = new WatchReader(client, key);
  opened.push(w);
  return w;
}

// Each test closes what it opened, whatever happens.
function lockTest(name, fn) {
  test(name, async (t) => {
    const before = opened.length;
    try {
      await fn(uniqueKey(name), t);
    } finally {
      for (const c of opened.splice(before)) c.close();
    }
  });
}

// Polls GetLock until pred(state) holds.
async function waitState(key, pred, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { state } = await client.getLock({ key }, { timeoutMs: 5000 });
    if (pred(state)) return state;
    if (Date.now() > deadline) throw new Error(`GetLock(${key}) never matched within ${timeoutMs}ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

lockTest("hold a lock", async (key) => {
  const a = hold({ key, value: enc("holder-a") });
  const { sequencer: seq } = await a.acquired();
  assert.ok(seq.token > 0n, `token ${seq.token}`);
  assert.equal(seq.key, key);
  assert.ok(seq.sessionId);
  assert.equal(seq.kind, LockKind.LOCK);

  const { state } = await client.getLock({ key }, { timeoutMs: 5000 });
  assert.equal(state.kind, LockKind.LOCK);
  assert.deepEqual(holders(state), [seq.sessionId]);
  assert.deepEqual(state.holders[0].value, enc("holder-a"));

  // Closing the stream is all it takes to let go.
  a.close();
  await waitState(key, (s) => s.holders.length === 0);
});

lockTest("a second client is queued until the first closes its stream", async (key) => {
  const a = hold({ key, value: enc("a") });
  const { sequencer: first } = await a.acquired();
  const b = hold({ key, value: enc("b") });
  const q = await b.queued();
  assert.ok(q.sessionId);
  assert.ok(holders(q.state).includes(first.sessionId), `holders ${holders(q.state)}`);

  a.close();
  const { sequencer: second } = await b.acquired(10_000);
  assert.equal(second.sessionId, q.sessionId);
  assert.ok(second.token > first.token);
});

lockTest("Release with key and session hands the lock over", async (key) => {
  const a = hold({ key, value: enc("a") });
  const { sequencer: first } = await a.acquired();
  const b = hold({ key, value: enc("b") });
  const q = await b.queued();
  assert.ok(holders(q.state).includes(first.sessionId));

  const resp = await client.release({ key, sessionId: first.sessionId }, { timeoutMs: 10_000 });
  assert.equal(resp.released, true);

  // The holder's stream says `released` and ends.
  const ev = await a.nextEvent(5000);
  assert.equal(ev.case, "released");
  assert.equal(ev.value.sequencer.token, first.token);
  const { msgs, err } = await a.stream.waitEnd(5000);
  assert.equal(err, undefined);
  assert.deepEqual(msgs.filter((m) => m.event.case !== "keepalive"), []);

  const { sequencer: second } = await b.acquired(10_000);
  assert.equal(second.sessionId, q.sessionId);
  assert.ok(second.token > first.token);
});

lockTest("lost when the session is destroyed in Consul", async (key) => {
  const a = hold({ key, value: enc("a") });
  const { sequencer: seq } = await a.acquired();

  // Behind the broker's back: destroy the session directly in Consul.
  const t0 = Date.now();
  assert.equal(await broker.consul("PUT", `/v1/session/destroy/${seq.sessionId}`), true);
  const ev = await a.nextEvent(5000);
  const elapsed = Date.now() - t0;
  assert.equal(ev.case, "lost");
  assert.equal(ev.value.reason, LostReason.SESSION_INVALIDATED);
  assert.ok(elapsed < 5000, `lost after ${elapsed}ms`);
  const { err } = await a.stream.waitEnd(5000);
  assert.equal(err, undefined);
});

lockTest("try-once on a busy lock is ABORTED naming the holder", async (key) => {
  const a = hold({ key, value: enc("a") });
  const { sequencer: seq } = await a.acquired();

  const t0 = Date.now();
  const b = hold({ key, value: enc("b"), waitTimeout: { seconds: 0n, nanos: 0 } });
  const { msgs, err } = await b.stream.waitEnd(10_000);
  assert.ok(Date.now() - t0 < 5000);
  assert.ok(!msgs.some((m) => m.event.case === "acquired"));
  assert.ok(err instanceof ConnectError, `stream ended with ${err}`);
  assert.equal(err.code, Code.Aborted, err.message);
  assert.ok(err.rawMessage.includes(seq.sessionId), err.rawMessage);

  // The holder is untouched.
  const { state } = await client.getLock({ key }, { timeoutMs: 5000 });
  assert.deepEqual(holders(state), [seq.sessionId]);
});

lockTest("semaphore with limit 2 and three clients", async (key) => {
  const a = hold({ key, value: enc("a"), limit: 2 });
  const { sequencer: sa } = await a.acquired();
  const b = hold({ key, value: enc("b"), limit: 2 });
  const { sequencer: sb } = await b.acquired();
  assert.equal(sa.kind, LockKind.SEMAPHORE);
  assert.equal(sb.kind, LockKind.SEMAPHORE);
  assert.ok(sa.token > 0n && sb.token > 0n);
  assert.notEqual(sa.sessionId, sb.sessionId);

  const c = hold({ key, value: enc("c"), limit: 2 });
  const q = await c.queued();
  assert.equal(q.state.kind, LockKind.SEMAPHORE);
  assert.equal(q.state.limit, 2);
  assert.deepEqual(holders(q.state).sort(), [sa.sessionId, sb.sessionId].sort());

  a.close();
  const { sequencer: sc } = await c.acquired(10_000);
  assert.equal(sc.sessionId, q.sessionId);
  assert.equal(sc.kind, LockKind.SEMAPHORE);

  const want = [sb.sessionId, sc.sessionId].sort().join();
  const state = await waitState(key, (s) => holders(s).sort().join() === want);
  assert.equal(state.limit, 2);
});

lockTest("a leader observer sees holder A, no holder, then holder B", async (key) => {
  const w = watch(key);
  const first = await w.wait(() => true);
  assert.deepEqual(first.holders, []);

  const a = hold({ key, value: enc("leader-a") });
  const { sequencer: sa } = await a.acquired();
  let st = await w.wait((s) => s.holders.length > 0);
  assert.deepEqual(holders(st), [sa.sessionId]);
  assert.deepEqual(st.holders[0].value, enc("leader-a"));

  a.close();
  st = await w.wait((s) => holders(s).join() !== sa.sessionId);
  assert.deepEqual(st.holders, [], "expected an empty-holders state after A resigned");

  const b = hold({ key, value: enc("leader-b") });
  const { sequencer: sb } = await b.acquired(10_000);
  st = await w.wait((s) => s.holders.length > 0);
  assert.deepEqual(holders(st), [sb.sessionId]);
  assert.deepEqual(st.holders[0].value, enc("leader-b"));
  assert.equal(st.holders[0].token, sb.token);
});

lockTest("a bad key is INVALID_ARGUMENT", async () => {
  const a = hold({ key: "a//b" });
  const { msgs, err } = await a.stream.waitEnd(10_000);
  assert.ok(err instanceof ConnectError, `stream ended with ${err} after ${msgs.length} messages`);
  assert.equal(err.code, Code.InvalidArgument, err.message);
  assert.match(err.rawMessage, /key/);

  await assert.rejects(client.getLock({ key: "a//b" }, { timeoutMs: 5000 }), (e) => {
    assert.ok(e instanceof ConnectError);
    assert.equal(e.code, Code.InvalidArgument, e.message);
    assert.match(e.rawMessage, /key/);
    return true;
  });
});

const EXAMPLE_KEY = "jobs/nightly-report";

// Runs example_hold.mjs; resolves { code, stdout, stderr } when it exits.
// acquired resolves with the token once it printed "acquired token=N".
function runExample(workSeconds) {
  const child = spawn(process.execPath, [join(REPO, "test", "node", "example_hold.mjs")], {
    env: { ...process.env, LOCKBROKER_ADDR: broker.addr, WORK_SECONDS: String(workSeconds) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const acquired = new Promise((res, rej) => {
    child.stdout.on("data", (d) => {
      stdout += d;
      const m = /^acquired token=(\d+)\n/.exec(stdout);
      if (m) res(BigInt(m[1]));
    });
    child.once("exit", () => rej(new Error(`example exited before acquiring: ${stderr}`)));
  });
  acquired.catch(() => {});
  const exited = new Promise((res) => child.once("exit", (code) => res({ code, stdout, stderr })));
  return { child, acquired, exited };
}

// Waits at most ms for the example to exit.
async function exampleExit(ex, ms) {
  let timer;
  const timeout = new Promise((_, rej) => (timer = setTimeout(() => rej(new Error(`example still running after ${ms}ms`)), ms)));
  try {
    return await Promise.race([ex.exited, timeout]);
  } finally {
    clearTimeout(timer);
    if (ex.child.exitCode === null && ex.child.signalCode === null) ex.child.kill("SIGKILL");
  }
}

lockTest("example_hold.mjs holds a lock and lets go", async () => {
  const ex = runExample(1);
  assert.ok((await withTimeout(ex.acquired, 30_000)) > 0n);
  const { code, stdout, stderr } = await exampleExit(ex, 30_000);
  assert.equal(code, 0, stderr);
  assert.match(stdout, /^acquired token=\d+\n$/);
  // It let go when it exited.
  await waitState(EXAMPLE_KEY, (s) => s.holders.length === 0);
});

lockTest("example_hold.mjs stops when no keepalive comes", async () => {
  const ex = runExample(60);
  await withTimeout(ex.acquired, 30_000);
  broker.pause();
  const t0 = Date.now();
  let res;
  try {
    res = await exampleExit(ex, 20_000);
  } finally {
    broker.resume();
  }
  const elapsed = Date.now() - t0;
  assert.notEqual(res.code, 0, "the example must fail when no keepalive comes");
  assert.match(res.stderr, /lost/);
  // By the end of the last guarantee: at most the session TTL (15s).
  assert.ok(elapsed < 15_000, `stopped ${elapsed}ms after the broker paused`);
  await waitState(EXAMPLE_KEY, (s) => s.holders.length === 0, 30_000);
});

// Last of the example tests: the key is in Consul's lock-delay afterwards.
lockTest("example_hold.mjs stops when the lock is lost", async () => {
  const ex = runExample(60);
  await withTimeout(ex.acquired, 30_000);
  const { state } = await client.getLock({ key: EXAMPLE_KEY }, { timeoutMs: 5000 });
  const t0 = Date.now();
  assert.equal(await broker.consul("PUT", `/v1/session/destroy/${state.holders[0].sessionId}`), true);
  const { code, stderr } = await exampleExit(ex, 10_000);
  const elapsed = Date.now() - t0;
  assert.notEqual(code, 0, "the example must fail when the lock is lost");
  assert.match(stderr, /lost/);
  assert.ok(elapsed < 5000, `stopped ${elapsed}ms after the loss`);
});

async function withTimeout(p, ms) {
  let timer;
  try {
    return await Promise.race([p, new Promise((_, rej) => (timer = setTimeout(() => rej(new Error(`nothing within ${ms}ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
