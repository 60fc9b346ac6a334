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
