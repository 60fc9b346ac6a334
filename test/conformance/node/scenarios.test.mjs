// The conformance scenarios (test/conformance/scenarios.md), Node runner.
//
// Run from the repo root:
//   npm ci --prefix client/node && node --test test/conformance/node/
//
// Each test is named after its scenario id; the first test checks that
// every id in scenarios.md has a test here.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { createHash, randomBytes, randomUUID } from "node:crypto";

import {
  CancelledError,
  Client,
  ConflictError,
  LockHeldError,
  LockLostError,
  PermissionDeniedError,
  UnauthenticatedError,
  UnavailableError,
  WaitTimeoutError,
} from "../../../client/node/src/index.js";
import { Cluster, REPO, sleep } from "./cluster.mjs";
import { makePKI } from "./pki.mjs";

const cluster = new Cluster();
let shared;
const figures = [];
const figure = (name, value, unit = "s") => figures.push(`${name}: ${typeof value === "number" ? value.toFixed(3) : value} ${unit}`);
const enc = (s) => new TextEncoder().encode(s);
const key = (name) => `conformance/node/${name}/${randomUUID().slice(0, 8)}`;

before(async () => {
  await cluster.start();
  shared = await cluster.broker("shared");
});

after(async () => {
  await cluster.stop();
  if (figures.length) console.log(`conformance figures (Node):\n  ${figures.join("\n  ")}`);
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

// Two clients on the shared replica, closed whatever happens.
async function withClients(fn) {
  const a = new Client(shared.addr);
  const b = new Client(shared.addr);
  try {
    await fn(a, b);
  } finally {
    await a.close();
    await b.close();
  }
}

const SCENARIO_TESTS = new Set();
// Every scenario runs: one that skips (S7 included) fails with the reason.
function scenario(id, name, fn, opts = {}) {
  assert.ok(!opts.skip && !opts.todo, `${id} may not be skipped`);
  SCENARIO_TESTS.add(id);
  test(`${id} ${name}`, opts, (t) => {
    t.skip = (why) => {
      throw new Error(`${id} must run, not skip: ${why}`);
    };
    return fn(t);
  });
}

test("every scenario in scenarios.md has a Node test", () => {
  const ids = [...readFileSync(join(REPO, "test", "conformance", "scenarios.md"), "utf8").matchAll(/^## (S\d+)\b/gm)].map((m) => m[1]);
  assert.ok(ids.length > 0);
  assert.deepEqual(ids.filter((id) => !SCENARIO_TESTS.has(id)), []);
});

scenario("S1", "lock, release, busy, timeout", () =>
  withClients(async (client, other) => {
    const k = key("s1");
    const lease = await client.lock(k, { value: "a" });
    try {
      assert.ok(lease.token > 0n);
      const state = await other.getLock(k);
      assert.equal(state.kind, "lock");
      assert.deepEqual(state.holders.map((h) => [h.sessionId, Buffer.from(h.value).toString()]), [[lease.sessionId, "a"]]);

      assert.equal(await other.tryLock(k), null);
      await assert.rejects(other.lock(k, { wait: 0 }), (e) => {
        assert.ok(e instanceof LockHeldError, e);
        assert.ok(e.holders.some((h) => h.sessionId === lease.sessionId), "busy error without the holder");
        return true;
      });

      const t0 = performance.now();
      await assert.rejects(other.lock(k, { wait: 1 }), (e) => {
        assert.ok(e instanceof WaitTimeoutError, e);
        assert.ok(e.holders.some((h) => h.sessionId === lease.sessionId), "timeout error without the holder");
        return true;
      });
      const took = (performance.now() - t0) / 1000;
      figure("S1 bounded wait of 1s took", took);
      assert.ok(took >= 0.9 && took <= 10, `took ${took}s`);
    } finally {
      assert.equal(await lease.release(), true);
    }
    assert.equal(lease.lost, false);
    assert.equal(lease.signal.aborted, false);
    assert.equal(lease.released, true);
    assert.equal((await other.getLock(k)).holders.length, 0);
    assert.throws(() => lease.check(), LockLostError);
    const again = await other.lock(k, { wait: 5 });
    try {
      assert.ok(again.token > lease.token);
    } finally {
      await again[Symbol.asyncDispose]();
    }
    assert.equal(again.released, true);
  }),
);

scenario("S2", "loss when the session is destroyed in Consul", () =>
  withClients(async (client) => {
    const lease = await client.lock(key("s2"));
    let lostAt;
    lease.onLost(() => (lostAt = performance.now()));
    const t0 = performance.now();
    await cluster.consul.destroySession(lease.sessionId);
    const err = await lease.waitLost(5000);
    assert.ok(err, "loss not reported within 5s");
    await waitFor(() => lostAt !== undefined, 1000, "onLost");
    const latency = (lostAt - t0) / 1000;
    figure("S2 loss reported after session destroy", latency);
    assert.ok(["SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER"].includes(err.reason), err.message);
    assert.ok(latency <= 1.0, `loss reported after ${latency}s`);
    assert.ok(lease.signal.aborted);
    assert.ok(lease.signal.reason instanceof LockLostError);
    assert.throws(() => lease.check(), LockLostError);
    assert.equal(await lease.release(), false);
  }),
);

scenario("S3", "deadline enforcement with a stopped broker", async () => {
  const r = await cluster.broker("s3-stopped");
  const c = new Client(r.addr);
  try {
    const lease = await c.lock(key("s3"), { ttl: 10 });
    const first = lease.deadline;
    await waitFor(() => lease.deadline > first, 10_000, "a keepalive");
    r.signal("SIGSTOP");
    const stoppedAt = performance.now();
    const known = lease.deadline;
    const err = await lease.waitLost(known - Date.now() + 5000);
    const reportedEpoch = performance.timeOrigin + performance.now();
    assert.ok(err, "loss never reported");
    const info = await cluster.consul.sessionInfo(lease.sessionId);
    // The deadline the library last knew (a keepalive sent before the stop
    // may still have arrived after it).
    const last = lease.deadline;
    assert.ok(last - known < 5000, "keepalives kept coming from a stopped broker");
    const margin = (last - reportedEpoch) / 1000;
    figure("S3 loss reported before the deadline by", margin);
    figure("S3 loss reported after SIGSTOP", (performance.now() - stoppedAt) / 1000);
    assert.equal(err.reason, "KEEPALIVE_TIMEOUT");
    assert.ok(margin > 0 && margin <= 1.0, `loss reported ${margin}s before the deadline`);
    assert.ok(info.length > 0, "the session was gone when the loss was reported: the guarantee was false");
  } finally {
    r.signal("SIGKILL");
    await c.close();
    await r.stop();
  }
});

scenario("S4", "resume on another replica; loss with no replica left", async () => {
  const a = await cluster.broker("s4-a");
  const b = await cluster.broker("s4-b");
  const c = new Client(a.addr, { targets: [b.addr] });
  const observer = new Client(b.addr);
  try {
    const k = key("s4");
    const lease = await c.lock(k, { ttl: 10 });
    assert.equal(lease.target, a.addr);
    const token = lease.token;
    let known = lease.deadline;
    a.signal("SIGKILL");
    const killed = performance.now();
    await waitFor(() => lease.target === b.addr, known - Date.now(), "resume on B");
    figure("S4 resumed on B after SIGKILL of A", (performance.now() - killed) / 1000);
    assert.equal(lease.lost, false, lease.error?.message);
    assert.equal(lease.token, token);
    const state = await observer.getLock(k);
    assert.deepEqual(state.holders.map((h) => [h.sessionId, h.token]), [[lease.sessionId, token]]);
    await waitFor(() => lease.deadline > known + 1000, 10_000, "keepalives from B");
    assert.equal(lease.lost, false);
    lease.check();

    b.signal("SIGKILL");
    known = lease.deadline;
    const err = await lease.waitLost(known - Date.now() + 5000);
    const reportedEpoch = performance.timeOrigin + performance.now();
    assert.ok(err, "loss never reported");
    const margin = (lease.deadline - reportedEpoch) / 1000; // the deadline the library last knew
    figure("S4 loss with no replica left, before the deadline by", margin);
    assert.equal(err.reason, "KEEPALIVE_TIMEOUT");
    assert.ok(margin > 0 && margin <= 1.0, `loss reported ${margin}s before the deadline`);
  } finally {
    await c.close();
    await observer.close();
    await a.stop();
    await b.stop();
  }
});

// One `hold` CLI process (any language) and its JSON lines.
class CLI {
  constructor(cmd, args, env) {
    this.proc = spawn(cmd, args, { cwd: REPO, env: env ?? process.env, stdio: ["pipe", "pipe", "pipe"] });
    this.events = [];
    this.stderr = "";
    this.proc.stderr.on("data", (d) => (this.stderr += d));
    createInterface({ input: this.proc.stdout }).on("line", (line) => {
      try {
        this.events.push(JSON.parse(line));
      } catch {
        // not a JSON line
      }
    });
    this.exited = new Promise((r) => this.proc.once("exit", r));
  }

  has(name) {
    return this.events.some((e) => e.event === name);
  }

  async wait(name, timeoutMs) {
    return waitFor(() => {
      const bad = this.events.find((e) => e.event === "error" || e.event === "lost");
      if (bad) throw new Error(`CLI failed: ${JSON.stringify(bad)} ${this.stderr}`);
      return this.events.find((e) => e.event === name);
    }, timeoutMs, `CLI ${name}`);
  }

  release() {
    this.proc.stdin.end();
  }

  async stop() {
    this.release();
    const t = setTimeout(() => this.proc.kill("SIGKILL"), 15_000);
    await this.exited;
    clearTimeout(t);
  }
}

const nodeCLI = (addr, k) => new CLI(process.execPath, [join(REPO, "client", "node", "conformance.mjs"), "hold", "--target", addr, "--key", k, "--limit", "3", "--seconds", "60"]);
const pythonCLI = (addr, k) =>
  new CLI("/usr/bin/python3", ["-m", "lockbroker.conformance", "hold", "--target", addr, "--key", k, "--limit", "3", "--seconds", "60"], {
    ...process.env,
    PYTHONPATH: join(REPO, "client", "python"),
  });

scenario("S5", "semaphore limit across languages", () =>
  withClients(async (client) => {
    const k = key("s5");
    const ac = new AbortController();
    let seenMax = 0;
    const watching = (async () => {
      try {
        for await (const st of client.watch(k, { signal: ac.signal })) seenMax = Math.max(seenMax, st.holders.length);
      } catch {
        // aborted at the end
      }
    })();
    const clis = [nodeCLI(shared.addr, k), nodeCLI(shared.addr, k), pythonCLI(shared.addr, k), pythonCLI(shared.addr, k)];
    try {
      await waitFor(() => clis.filter((c) => c.has("acquired")).length === 3, 30_000, "three holders");
      await sleep(1000); // the fourth keeps waiting while three hold
      const holding = clis.filter((c) => c.has("acquired"));
      const waiting = clis.filter((c) => !c.has("acquired"));
      assert.equal(holding.length, 3);
      assert.equal(waiting.length, 1);
      assert.equal((await client.getLock(k)).holders.length, 3);
      holding[0].release();
      await holding[0].wait("released", 15_000);
      await waiting[0].wait("acquired", 15_000);
      assert.equal((await client.getLock(k)).holders.length, 3);
    } finally {
      ac.abort();
      await Promise.all(clis.map((c) => c.stop()));
      await watching;
    }
    assert.ok(seenMax <= 3, `an observer saw ${seenMax} holders`);
    const langs = [...new Set(clis.flatMap((c) => c.events.filter((e) => e.event === "acquired").map((e) => e.lang)))].sort();
    figure("S5 languages holding", langs.join(","), "");
  }),
);

scenario("S6", "watch shows the holder, then explicit none", () =>
  withClients(async (client, other) => {
    const k = key("s6");
    const ac = new AbortController();
    const it = client.watch(k, { signal: ac.signal })[Symbol.asyncIterator]();
    const until = async (pred, timeoutMs = 5000) => {
      const t = setTimeout(() => ac.abort(new Error(`no matching state within ${timeoutMs}ms`)), timeoutMs);
      try {
        for (;;) {
          const { value, done } = await it.next();
          assert.ok(!done, "watch ended");
          if (pred(value)) return value;
        }
      } finally {
        clearTimeout(t);
      }
    };
    try {
      const first = await until(() => true);
      assert.equal(first.kind, "none");
      assert.equal(first.holder, null);
      const lease = await other.lock(k, { value: enc("w") });
      const held = await until((st) => st.held);
      assert.equal(held.holder.sessionId, lease.sessionId);
      assert.equal(Buffer.from(held.holder.value).toString(), "w");
      await lease.release();
      const none = await until((st) => !st.held);
      assert.equal(none.holder, null);
      assert.deepEqual(none.holders, []);
    } finally {
      ac.abort();
      await it.return?.();
    }
  }),
);

// S7's brokers, on the shared Consul: `tls` serves TLS with a server
// certificate of a CA made here; `mtls` also requires a client certificate of
// that CA. One tenants file: tenant payments (prefix payments/) is the bearer
// token and cn:payments-api, the client certificate's Common Name.
async function secureBrokers() {
  const dir = mkdtempSync(join(tmpdir(), "lockbroker-conformance-node-s7-"));
  const pki = makePKI(dir, "payments-api");
  const token = randomBytes(32).toString("hex");
  const tenants = join(dir, "tenants.yaml");
  writeFileSync(
    tenants,
    "tenants:\n  - name: payments\n" +
      `    identities: ["token-sha256:${createHash("sha256").update(token).digest("hex")}", "cn:${pki.clientCN}"]\n` +
      '    prefixes: ["payments/"]\n',
    { mode: 0o600 },
  );
  const flags = ["--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--tenants", tenants];
  const brokers = [];
  const stop = async () => {
    for (const b of brokers) await b.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    brokers.push(await cluster.broker("s7-tls", flags));
    brokers.push(await cluster.broker("s7-mtls", [...flags, "--tls-client-ca", pki.ca]));
  } catch (e) {
    await stop();
    throw e;
  }
  const pem = (f) => readFileSync(f);
  return { pki, pem, token, tls: brokers[0], mtls: brokers[1], stop };
}

async function withClient(addr, opts, fn) {
  const c = new Client(addr, { timeoutMs: 5000, ...opts });
  try {
    return await fn(c);
  } finally {
    await c.close();
  }
}

scenario("S7", "TLS and token options", async () => {
  const s = await secureBrokers();
  try {
    const { pki, pem, token } = s;
    const tag = randomUUID().slice(0, 8);
    const k = `payments/node/${tag}`;
    const outside = `orders/node/${tag}`;
    const mtlsOpts = { ca: pem(pki.ca), cert: pem(pki.clientCert), key: pem(pki.clientKey) };

    // TLS with the CA and the token; mTLS with the token; mTLS alone (the
    // certificate's cn:payments-api is the identity): lock and release.
    const setups = [
      ["TLS and token", s.tls.addr, { tls: { ca: pem(pki.ca) }, token }],
      ["mTLS and token", s.mtls.addr, { tls: mtlsOpts, token }],
      ["mTLS without token", s.mtls.addr, { tls: mtlsOpts }],
    ];
    let last = 0n;
    for (const [what, addr, opts] of setups) {
      await withClient(addr, opts, async (c) => {
        const t0 = performance.now();
        const lease = await c.lock(k, { value: "s7", wait: 5 });
        figure(`S7 lock over ${what}`, (performance.now() - t0) / 1000);
        assert.ok(lease.token > last, what);
        last = lease.token;
        const state = await c.getLock(k);
        assert.deepEqual(state.holders.map((h) => [h.sessionId, Buffer.from(h.value).toString()]), [[lease.sessionId, "s7"]], what);
        assert.equal(await lease.release(), true, what);
        assert.equal(lease.lost, false, what);
        assert.equal(lease.released, true, what);
        assert.equal((await c.getLock(k)).holders.length, 0, what);

        // A key outside the tenant's prefixes: PERMISSION_DENIED naming it.
        await assert.rejects(c.lock(outside, { wait: 5 }), (e) => {
          assert.ok(e instanceof PermissionDeniedError, `${what}: ${e}`);
          assert.equal(e.codeName, "PermissionDenied", what);
          assert.equal(e.reason, "PERMISSION_DENIED", what);
          assert.ok(e.message.includes(outside), `${what}: ${e.message}`);
          assert.equal(e.metadata.key, outside, what);
          return true;
        });
      });
    }

    // TLS without a token (and without a certificate), or with a token the
    // tenants file does not know: UNAUTHENTICATED.
    for (const [what, tok] of [["no token", undefined], ["an unknown token", `not-${token}`]]) {
      await withClient(s.tls.addr, { tls: { ca: pem(pki.ca) }, token: tok }, async (c) => {
        await assert.rejects(c.lock(k, { wait: 5 }), (e) => {
          assert.ok(e instanceof UnauthenticatedError, `${what}: ${e}`);
          assert.equal(e.codeName, "Unauthenticated", what);
          assert.equal(e.reason, "UNAUTHENTICATED", what);
          console.log(`S7 with ${what}: ${e.name}: ${e.message}`);
          return true;
        });
      });
    }

    // Without the CA (system roots), with another CA, or without the
    // client certificate mTLS asks for: no connection (UNAVAILABLE).
    const refused = [
      ["system roots, not the CA", s.tls.addr, { tls: true, token }],
      ["another CA", s.tls.addr, { tls: { ca: pem(pki.otherCA) }, token }],
      ["mTLS without a client certificate", s.mtls.addr, { tls: { ca: pem(pki.ca) }, token }],
    ];
    for (const [what, addr, opts] of refused) {
      await withClient(addr, opts, async (c) => {
        const t0 = performance.now();
        await assert.rejects(c.lock(k, { wait: 5 }), (e) => {
          assert.ok(e instanceof UnavailableError, `${what}: ${e?.name}: ${e?.message} (code ${e?.codeName})`);
          assert.equal(e.codeName, "Unavailable", what);
          console.log(`S7 with ${what}: ${e.name}: ${e.message}`);
          return true;
        });
        figure(`S7 refused connection (${what}) after`, (performance.now() - t0) / 1000);
      });
    }
    // Plaintext to the TLS port: refused too. connect-node sees the broker
    // close the connection before any answer and reports CANCELED.
    await withClient(s.tls.addr, { token }, async (c) => {
      await assert.rejects(c.lock(k, { wait: 5 }), (e) => {
        assert.ok(e instanceof UnavailableError || e instanceof CancelledError, `plaintext: ${e?.name}: ${e?.message}`);
        console.log(`S7 with plaintext: ${e.name}: ${e.message}`);
        return true;
      });
    });
    await withClient(s.tls.addr, { tls: { ca: pem(pki.ca) }, token }, async (c) => {
      assert.equal((await c.getLock(k)).holders.length, 0, "nothing was held through a refused connection");
    });
  } finally {
    await s.stop();
  }
});

// n clients on the shared replica, closed whatever happens.
async function withN(n, fn) {
  const clients = Array.from({ length: n }, () => new Client(shared.addr));
  try {
    await fn(...clients);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
}

// A lease promise still pending: its outcome lands in `out` when it settles.
function pending(promise) {
  const out = { settled: false, lease: undefined, error: undefined, promise };
  promise.then(
    (l) => Object.assign(out, { settled: true, lease: l }),
    (e) => Object.assign(out, { settled: true, error: e }),
  );
  return out;
}

// promise, or an Error naming `what` after timeoutMs.
async function within(promise, timeoutMs, what) {
  let timer;
  try {
    return await Promise.race([
      promise,
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs}ms`)), timeoutMs))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

// A lock request that reports its first `queued` (it has a place in the
// key's queue), so that the next one arrives after it. `queued` resolves
// then (or when the request ends first), within 10 s.
function queuedRequest(take) {
  let heard;
  const queued = new Promise((r) => (heard = r));
  const p = pending(take({ onQueued: () => heard() }));
  p.queued = within(Promise.race([queued, p.promise.then(() => {}, () => {})]), 10_000, "queued");
  return p;
}

// The Consul entries of key k and under k/ (its queue's tickets), as
// Consul reports them; [] when there are none.
async function kvEntries(k) {
  const resp = await fetch(`http://${cluster.consul.addr}/v1/kv/${k}?recurse&consistent`, { signal: AbortSignal.timeout(10_000) });
  if (resp.status === 404) return [];
  assert.ok(resp.ok, `Consul GET ${k}: ${resp.status}`);
  return (await resp.json())
    .filter((e) => e.Key === k || e.Key.startsWith(`${k}/`))
    .map((e) => ({ Key: e.Key, ModifyIndex: e.ModifyIndex, Flags: e.Flags, Session: e.Session ?? "", Value: e.Value }));
}

const max = (...xs) => xs.reduce((a, b) => (a > b ? a : b));

scenario("S8", "read-write lock: shared readers, arrival order, tokens", () =>
  withN(5, async (a, b, c, d, e) => {
    const k = key("s8");
    const l = key("s8-plain");
    const leases = [];
    const writer = { lease: undefined };
    try {
      // 1. Two readers hold at once; GetLock shows RWLOCK with both as readers.
      const r1 = await a.readLock(k, { value: "r1", wait: 10 });
      leases.push(r1);
      const r2 = await b.readLock(k, { value: "r2", wait: 10 });
      leases.push(r2);
      assert.equal(r1.mode, "read");
      assert.equal(r1.sequencer.kind, "rwlock");
      assert.equal(r1.sequencer.read, true);
      assert.equal(r1.lost || r2.lost, false);
      assert.ok(r2.token > r1.token, `second reader's token ${r2.token} not above the first's ${r1.token}`);
      const st = await e.getLock(k);
      assert.equal(st.kind, "rwlock");
      assert.deepEqual(
        st.holders.map((h) => [h.sessionId, h.read, h.token]).sort(),
        [
          [r1.sessionId, true, r1.token],
          [r2.sessionId, true, r2.token],
        ].sort(),
      );

      // 2. A writer waits; a third reader arriving after it waits too.
      const w = queuedRequest((o) => c.writeLock(k, { ...o, value: "w" }));
      await w.queued;
      assert.equal(w.settled, false, `the writer did not wait: ${w.error ?? "granted beside readers"}`);
      const third = queuedRequest((o) => d.readLock(k, { ...o, value: "r3" }));
      await third.queued;
      await sleep(1000);
      assert.equal(third.settled, false, `a reader behind a queued writer did not wait: ${third.error ?? "granted"}`);
      assert.equal(w.settled, false);
      assert.deepEqual((await e.getLock(k)).holders.map((h) => h.sessionId).sort(), [r1.sessionId, r2.sessionId].sort());

      // 3. Both readers release: the writer is granted, above both tokens;
      // the third reader still waits. The writer releases: the third reader
      // is granted, above the writer.
      const t0 = performance.now();
      assert.equal(await r1.release(), true);
      assert.equal(await r2.release(), true);
      writer.lease = await within(w.promise, 15_000, "the writer's grant");
      figure("S8 writer granted after the readers released", (performance.now() - t0) / 1000);
      assert.equal(writer.lease.mode, "write");
      assert.equal(writer.lease.sequencer.read, false);
      assert.ok(writer.lease.token > max(r1.token, r2.token), `writer token ${writer.lease.token} not above the readers'`);
      await sleep(300);
      assert.equal(third.settled, false, "the third reader was granted beside the writer");
      const ws = await e.getLock(k);
      assert.deepEqual(ws.holders.map((h) => [h.sessionId, h.read]), [[writer.lease.sessionId, false]]);
      assert.equal(await writer.lease.release(), true);
      const r3 = await within(third.promise, 15_000, "the third reader's grant");
      leases.push(r3);
      assert.equal(r3.mode, "read");
      assert.ok(r3.token > writer.lease.token, `third reader's token ${r3.token} not above the writer's ${writer.lease.token}`);
      assert.deepEqual((await e.getLock(k)).holders.map((h) => [h.sessionId, h.read]), [[r3.sessionId, true]]);

      // 4. A plain try-lock of the read-write lock, and a try read lock of a
      // held plain lock: LIMIT_CONFLICT naming the kind found; neither key
      // changes in Consul.
      const kBefore = await kvEntries(k);
      await assert.rejects(e.tryLock(k), (err) => {
        assert.ok(err instanceof ConflictError, `${err?.name}: ${err?.message}`);
        assert.equal(err.reason, "LIMIT_CONFLICT");
        assert.equal(err.codeName, "FailedPrecondition");
        // The kind found: RWLOCK in the LockState detail, in words in the message.
        assert.equal(err.state?.kind, "rwlock", "the LockState detail names the kind found");
        assert.match(err.message, /RWLOCK/, "the message names the kind found");
        console.log(`S8 lock on a read-write lock: ${err.name}: ${err.message}`);
        return true;
      });
      assert.deepEqual(await kvEntries(k), kBefore, "a refused lock changed the read-write lock's key in Consul");

      const plain = await a.lock(l, { value: "plain", wait: 10 });
      leases.push(plain);
      const lBefore = await kvEntries(l);
      await assert.rejects(e.tryReadLock(l), (err) => {
        assert.ok(err instanceof ConflictError, `${err?.name}: ${err?.message}`);
        assert.equal(err.reason, "LIMIT_CONFLICT");
        assert.equal(err.state?.kind, "lock", "the LockState detail names the kind found");
        assert.deepEqual(err.holders.map((h) => h.sessionId), [plain.sessionId]);
        assert.match(err.message, /\bLOCK\b/, "the message names the kind found");
        console.log(`S8 read lock on a lock: ${err.name}: ${err.message}`);
        return true;
      });
      await assert.rejects(e.tryWriteLock(l), (err) => err instanceof ConflictError && err.reason === "LIMIT_CONFLICT");
      assert.deepEqual(await kvEntries(l), lBefore, "a refused read lock changed the lock's key in Consul");
      assert.equal(plain.lost, false);
      assert.equal(r3.lost, false);
    } finally {
      if (writer.lease) await writer.lease.release();
      // A third reader still waiting (the test failed midway) goes with its client.
      for (const lease of leases) await lease.release();
    }
  }),
);

scenario("S9", "multi-key lock: all or nothing", () =>
  withN(3, async (a, b, obs) => {
    const base = key("s9");
    const [A, B, C, D] = ["a", "b", "c", "d"].map((x) => `${base}-${x}`);
    const leases = [];
    let second;
    try {
      // 1. A, B, C as one: one session, one token per key in order.
      const first = await a.lockAll([A, B, C], { value: "first", wait: 10 });
      leases.push(first);
      assert.deepEqual(first.keys, [A, B, C]);
      assert.equal(first.tokens.length, 3);
      assert.deepEqual(first.sequencers.map((s) => s.key), [A, B, C]);
      assert.deepEqual(first.sequencers.map((s) => s.sessionId), [first.sessionId, first.sessionId, first.sessionId]);
      assert.equal(first.token, first.tokens[0]);
      for (const [j, k] of [A, B, C].entries()) {
        const st = await obs.getLock(k);
        assert.deepEqual(st.holders.map((h) => [h.sessionId, h.token]), [[first.sessionId, first.tokens[j]]], k);
      }

      // 2. A try-lock of B is busy; C and D as one waits, holding nothing.
      await assert.rejects(b.lock(B, { wait: 0 }), (err) => {
        assert.ok(err instanceof LockHeldError, `${err?.name}: ${err?.message}`);
        assert.equal(err.reason, "LOCK_HELD");
        return true;
      });
      second = queuedRequest((o) => b.lockAll([C, D], { ...o, value: "second" }));
      await second.queued;
      assert.equal(second.settled, false, `the second multi-key lock did not wait: ${second.error ?? "granted"}`);
      const end = performance.now() + 1000;
      while (performance.now() < end) {
        assert.deepEqual((await obs.getLock(D)).holders, [], "a waiting multi-key request holds D: a subset");
        await sleep(100);
      }
      assert.equal(second.settled, false);

      // 3. Release the first: the second gets C and D together.
      const t0 = performance.now();
      assert.equal(await first.release(), true);
      const lease2 = await within(second.promise, 15_000, "the second multi-key lock's grant");
      leases.push(lease2);
      figure("S9 second multi-key lock granted after the first released", (performance.now() - t0) / 1000);
      assert.deepEqual(lease2.keys, [C, D]);
      assert.ok(lease2.tokens[0] > first.tokens[2], "C's token did not increase");
      for (const [j, k] of [C, D].entries()) {
        assert.deepEqual((await obs.getLock(k)).holders.map((h) => [h.sessionId, h.token]), [[lease2.sessionId, lease2.tokens[j]]], k);
      }
      for (const k of [A, B]) assert.deepEqual((await obs.getLock(k)).holders, [], k);

      // 4. D deleted behind the broker's back: lost within 1 s naming D; C is released.
      let lostAt;
      lease2.onLost(() => (lostAt = performance.now()));
      const deleted = performance.now();
      await cluster.consul.http("DELETE", `/v1/kv/${D}`);
      const err = await lease2.waitLost(5000);
      assert.ok(err, "loss not reported within 5s");
      await waitFor(() => lostAt !== undefined, 1000, "onLost");
      const latency = (lostAt - deleted) / 1000;
      figure("S9 multi-key loss reported after DELETE of one key", latency);
      assert.ok(latency <= 1.0, `loss reported after ${latency}s`);
      assert.equal(err.key, D, err.message);
      assert.equal(lease2.lostKey, D);
      assert.ok(lease2.signal.aborted);
      await waitFor(async () => (await obs.getLock(C)).holders.length === 0, 5000, "C released after D was lost");
      assert.equal(await lease2.release(), false);
    } finally {
      for (const lease of leases) await lease.release();
    }
  }),
);

// S10's Node part: the Go runner (test/conformance/go) runs readers and
// writers of every language on one key. Here the Node CLI alone (the one
// this library ships) runs readers and writers on one key for about 8 s
// with S10's checks (no writer beside anyone; readers share; writers'
// tokens increase), and holds a multi-key lock with --also.
const cliHold = (addr, k, extra) =>
  new CLI(process.execPath, [join(REPO, "client", "node", "conformance.mjs"), "hold", "--target", addr, "--key", k, "--wait", "30", ...extra]);

scenario("S10", "read-write lock across processes (Node CLI: hold --mode, --also)", () =>
  withClients(async (client) => {
    const k = key("s10");
    const runFor = 8000;
    const start = performance.now();
    const done = [];
    const live = new Set();
    // Each slot runs one CLI after another for about runFor, and at least
    // twice (a loaded machine starts a process slowly).
    const slot = async (mode, seconds) => {
      for (let n = 0; n < 2 || performance.now() - start < runFor; n++) {
        const cli = cliHold(shared.addr, k, ["--mode", mode, "--seconds", String(seconds)]);
        live.add(cli);
        try {
          // A CLI waits at most 30 s (--wait) and holds `seconds`.
          await within(cli.exited, 45_000, "a CLI's end").catch(() => cli.stop());
        } finally {
          live.delete(cli);
        }
        done.push(cli);
      }
    };
    try {
      await Promise.all([slot("read", 0.8), slot("read", 0.8), slot("read", 0.6), slot("write", 0.3), slot("write", 0.3)]);
    } finally {
      await Promise.all([...live].map((c) => c.stop()));
    }
    const holds = done.map((cli) => {
      const acq = cli.events.find((ev) => ev.event === "acquired");
      const end = cli.events.find((ev) => ev.event === "released" || ev.event === "lost");
      const bad = cli.events.find((ev) => ev.event === "error" || ev.event === "lost");
      assert.equal(bad, undefined, `a CLI failed: ${JSON.stringify(bad)} ${cli.stderr}`);
      assert.ok(acq && end, `a CLI printed no acquired/released: ${JSON.stringify(cli.events)} ${cli.stderr}`);
      assert.ok(["read", "write"].includes(acq.mode), JSON.stringify(acq));
      // release_t: when the CLI asked to release (the hold ends after it,
      // before `released` is printed): [acquired, release_t] lies inside the hold.
      return { mode: acq.mode, from: acq.t, to: end.release_t ?? end.t, token: acq.token };
    });
    const writers = holds.filter((h) => h.mode === "write").sort((x, y) => x.from - y.from);
    const readers = holds.filter((h) => h.mode === "read");
    figure("S10 holds (readers, writers)", `${readers.length}, ${writers.length}`, "");
    assert.ok(writers.length >= 4 && readers.length >= 6, `too few holds: ${readers.length} readers, ${writers.length} writers`);
    const overlap = (x, y) => x !== y && x.from < y.to && y.from < x.to;
    const timeline = () => JSON.stringify(holds.map((h) => [h.mode, h.from.toFixed(3), h.to.toFixed(3), h.token]).sort((x, y) => x[1] - y[1]));
    for (const w of writers) {
      const beside = holds.find((h) => overlap(w, h));
      assert.equal(beside, undefined, `a writer ${JSON.stringify(w)} overlapped ${JSON.stringify(beside)}: ${timeline()}`);
    }
    assert.ok(readers.some((r) => readers.some((q) => overlap(r, q))), `no two readers ever held at once: ${timeline()}`);
    for (let j = 1; j < writers.length; j++) assert.ok(writers[j].token > writers[j - 1].token, `writers' tokens did not increase: ${timeline()}`);

    // A multi-key hold: --also, `tokens` one per key.
    const [ka, kb, kc] = ["a", "b", "c"].map((x) => `${k}-m${x}`);
    const multi = cliHold(shared.addr, ka, ["--also", kb, "--also", kc, "--seconds", "30"]);
    try {
      const acq = await multi.wait("acquired", 30_000);
      assert.equal(acq.mode, "lock");
      assert.deepEqual(acq.keys, [ka, kb, kc]);
      assert.equal(acq.tokens.length, 3);
      assert.equal(acq.token, acq.tokens[0]);
      for (const [j, kk] of [ka, kb, kc].entries()) {
        assert.deepEqual((await client.getLock(kk)).holders.map((h) => [h.sessionId, Number(h.token)]), [[acq.session_id, acq.tokens[j]]]);
      }
      multi.release();
      await multi.wait("released", 15_000);
    } finally {
      await multi.stop();
    }
    for (const kk of [ka, kb, kc]) assert.deepEqual((await client.getLock(kk)).holders, [], kk);
  }),
);
