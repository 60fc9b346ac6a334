// Offline tests of the package: the generated copy is in sync with gen/es,
// the declared types compile, errors carry the broker's status details, and
// read-write and multi-key requests have the wire shape the proto asks for
// (against a broker stand-in; test/conformance/node runs them against the
// real broker).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { ErrorReason } from "../gen/lockbroker/v1/errors_pb.js";
import { LockStateSchema, LockKind } from "../gen/lockbroker/v1/types_pb.js";
import { ErrorInfoSchema, RetryInfoSchema, BadRequestSchema } from "../src/rpc.js";
import {
  ConflictError,
  InvalidArgumentError,
  LockHeldError,
  LockLostError,
  NotHolderError,
  RejectedError,
  SessionLostError,
  UnavailableError,
  WaitTimeoutError,
  fromError,
} from "../src/index.js";
import { stale } from "../tools/sync-gen.mjs";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..");

test("gen/ is in sync with the repository's gen/es", () => {
  assert.deepEqual(stale(), [], "run: node client/node/tools/sync-gen.mjs");
});

test("the declared types compile (tsc)", () => {
  execFileSync(join(PKG, "node_modules", ".bin", "tsc"), ["-p", join(PKG, "tsconfig.json")], { stdio: "pipe" });
});

const detail = (schema, init) => ({ type: schema.typeName, value: toBinary(schema, create(schema, init)) });

test("a busy status becomes LockHeldError with the holders from the LockState detail", () => {
  const state = { key: "k", kind: LockKind.LOCK, limit: 1, holders: [{ sessionId: "s1", value: new TextEncoder().encode("a"), token: 7n }] };
  const ce = new ConnectError("busy", Code.Aborted, undefined, [
    detail(ErrorInfoSchema, { reason: "LOCK_HELD", domain: "lockbroker.v1", metadata: { key: "k" } }),
    detail(LockStateSchema, state),
  ]);
  const err = fromError(ce);
  assert.ok(err instanceof LockHeldError);
  assert.equal(err.reason, "LOCK_HELD");
  assert.equal(err.code, Code.Aborted);
  assert.equal(err.codeName, "Aborted");
  assert.deepEqual(err.metadata, { key: "k" });
  assert.deepEqual(err.holders.map((h) => [h.sessionId, h.token]), [["s1", 7n]]);
  assert.equal(err.state.kind, "lock");
  assert.equal(err.cause, ce);
});

test("the reason decides the class; the code is the fallback", () => {
  const withReason = (code, reason) => fromError(new ConnectError("m", code, undefined, [detail(ErrorInfoSchema, { reason, domain: "lockbroker.v1" })]));
  assert.ok(withReason(Code.FailedPrecondition, "NOT_HOLDER") instanceof NotHolderError);
  assert.ok(withReason(Code.Aborted, "SESSION_LOST") instanceof SessionLostError);
  assert.ok(withReason(Code.DeadlineExceeded, "WAIT_TIMEOUT") instanceof WaitTimeoutError);
  assert.ok(withReason(Code.FailedPrecondition, "CONSUL_REJECTED") instanceof RejectedError);
  assert.ok(fromError(new ConnectError("m", Code.FailedPrecondition)) instanceof ConflictError);
  assert.ok(fromError(new ConnectError("m", Code.Aborted)) instanceof LockHeldError);
  // Another domain's reason does not pick a class.
  const foreign = fromError(new ConnectError("m", Code.Unavailable, undefined, [detail(ErrorInfoSchema, { reason: "LOCK_HELD", domain: "other" })]));
  assert.ok(foreign instanceof UnavailableError);
});

test("a connection the broker cut is UNAVAILABLE, not a busy lock", () => {
  // connect-node turns a reset (or a destroyed stream) into ABORTED, with
  // Node's error as the cause.
  for (const code of ["ECONNRESET", "EPIPE", "ERR_STREAM_DESTROYED", "ERR_HTTP2_INVALID_STREAM"]) {
    const cause = Object.assign(new Error(`read ${code}`), { code });
    const ce = new ConnectError(`read ${code}`, Code.Aborted, undefined, undefined, cause);
    const err = fromError(ce);
    assert.ok(err instanceof UnavailableError, `${code}: ${err.name}`);
    assert.equal(err.codeName, "Unavailable", code);
    assert.equal(err.cause, ce, code);
  }
  // The broker's own ABORTED, even without its reason, stays a busy lock.
  assert.ok(fromError(new ConnectError("m", Code.Aborted, undefined, undefined, new Error("m"))) instanceof LockHeldError);
});

test("retry hints and field violations are decoded", () => {
  const err = fromError(
    new ConnectError("bad", Code.InvalidArgument, undefined, [
      detail(ErrorInfoSchema, { reason: "INVALID_ARGUMENT", domain: "lockbroker.v1" }),
      detail(BadRequestSchema, { fieldViolations: [{ field: "key", description: "empty" }] }),
      detail(RetryInfoSchema, { retryDelay: { seconds: 1n, nanos: 500_000_000 } }),
    ]),
  );
  assert.ok(err instanceof InvalidArgumentError);
  assert.deepEqual(err.fieldViolations, [{ field: "key", description: "empty" }]);
  assert.equal(err.retryAfter, 1.5);
});

test("LockLostError carries the reason", () => {
  const e = new LockLostError("KEEPALIVE_TIMEOUT", "no keepalive");
  assert.equal(e.reason, "KEEPALIVE_TIMEOUT");
  assert.equal(e.detail, "no keepalive");
  assert.equal(e.name, "LockLostError");
  assert.match(e.message, /KEEPALIVE_TIMEOUT/);
});

test("every ErrorReason of the proto has its own class", () => {
  const names = Object.keys(ErrorReason).filter((k) => Number.isNaN(Number(k)) && k !== "UNSPECIFIED");
  assert.ok(names.length > 0);
  const unmapped = names.filter((reason) => {
    const err = fromError(new ConnectError("m", Code.Unknown, undefined, [detail(ErrorInfoSchema, { reason, domain: "lockbroker.v1" })]));
    return reason !== "INTERNAL" && err.constructor.name === "InternalError";
  });
  assert.deepEqual(unmapped, []);
});

// A broker says `lost` instead of `acquired` for a grant that came after its
// session's safe deadline (a path only a stopped broker process reaches):
// lock fails with SessionLostError naming the broker's reason and detail.
test("a lost before the grant is SessionLostError with the broker's reason", async () => {
  const { createServer } = await import("node:http2");
  const { connectNodeAdapter } = await import("@connectrpc/connect-node");
  const { LockService, LostReason } = await import("../gen/lockbroker/v1/lock_pb.js");
  const { Client } = await import("../src/index.js");
  const handler = connectNodeAdapter({
    grpc: true,
    connect: false,
    grpcWeb: false,
    routes(router) {
      router.service(LockService, {
        async *acquire() {
          yield { event: { case: "queued", value: {} } };
          yield {
            event: {
              case: "lost",
              value: { reason: LostReason.RENEWAL_FAILED, detail: "the grant came after the session's safe deadline" },
            },
          };
        },
      });
    },
  });
  const server = createServer(handler);
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const c = new Client(`127.0.0.1:${server.address().port}`, { timeoutMs: 5000 });
  try {
    await assert.rejects(c.lock("k", { wait: 5 }), (err) => {
      assert.ok(err instanceof SessionLostError, String(err));
      assert.equal(err.reason, "SESSION_LOST");
      assert.match(
        err.message,
        /the stream ended with lost before the grant: RENEWAL_FAILED: the grant came after the session's safe deadline/,
      );
      return true;
    });
  } finally {
    await c.close();
    server.close();
  }
});

// A broker stand-in for what the client does on the wire with read-write
// and multi-key requests (the conformance scenarios S8 and S9 run them
// against the real broker). `acquire(req, ctx, n)` is the Acquire handler
// (n: the call's number); Release ends every open Acquire stream.
async function fakeBroker(acquire) {
  const { createServer } = await import("node:http2");
  const { connectNodeAdapter } = await import("@connectrpc/connect-node");
  const { LockService } = await import("../gen/lockbroker/v1/lock_pb.js");
  const requests = [];
  const releases = [];
  let release = () => {};
  let released = new Promise((r) => (release = r));
  const handler = connectNodeAdapter({
    grpc: true,
    connect: false,
    grpcWeb: false,
    routes(router) {
      router.service(LockService, {
        async *acquire(req, ctx) {
          requests.push(req);
          yield* acquire(req, ctx, requests.length, released);
        },
        async release(req) {
          releases.push(req);
          release();
          released = new Promise((r) => (release = r));
          return { released: true };
        },
      });
    },
  });
  const server = createServer(handler);
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    addr: `127.0.0.1:${server.address().port}`,
    requests,
    releases,
    close: () => {
      server.closeAllSessions?.();
      server.close();
    },
  };
}

const SESSION = "11111111-2222-3333-4444-555555555555";
const seqOf = (key, token, extra = {}) => ({ key, sessionId: SESSION, token: BigInt(token), lockIndex: 1n, kind: LockKind.LOCK, ...extra });
const guaranteed = { seconds: 15n, nanos: 0 };

test("readLock, writeLock and lockAll send kind and keys; the lease has a sequencer and token per key", async () => {
  const { AcquireKind } = await import("../gen/lockbroker/v1/lock_pb.js");
  const { Client } = await import("../src/index.js");
  const fake = await fakeBroker(async function* (req, ctx, n, released) {
    const kind = req.kind === AcquireKind.READ || req.kind === AcquireKind.WRITE ? LockKind.RWLOCK : LockKind.LOCK;
    const keys = [req.key, ...req.keys];
    const seqs = keys.map((k, j) => seqOf(k, 10 * n + j, { kind, read: req.kind === AcquireKind.READ }));
    yield { event: { case: "acquired", value: { sequencer: seqs[0], sequencers: req.keys.length ? seqs : [], guaranteedFor: guaranteed } } };
    await released;
  });
  const c = new Client(fake.addr, { timeoutMs: 5000 });
  try {
    const r = await c.readLock("rw/k", { wait: 5 });
    assert.equal(fake.requests[0].kind, AcquireKind.READ);
    assert.deepEqual(fake.requests[0].keys, []);
    assert.equal(r.mode, "read");
    assert.equal(r.sequencer.read, true);
    assert.equal(r.sequencer.kind, "rwlock");
    assert.deepEqual(r.keys, ["rw/k"]);
    assert.deepEqual(r.tokens, [10n]);
    assert.equal(await r.release(), true);

    const w = await c.tryWriteLock("rw/k");
    assert.equal(fake.requests[1].kind, AcquireKind.WRITE);
    assert.equal(fake.requests[1].waitTimeout?.seconds, 0n, "a try sends wait 0");
    assert.equal(w.mode, "write");
    assert.equal(w.sequencer.read, false);
    await w.release();

    const all = await c.lockAll(["a", "b/x", "c"]);
    const req = fake.requests[2];
    assert.equal(req.kind, AcquireKind.LOCK);
    assert.equal(req.key, "a");
    assert.deepEqual(req.keys, ["b/x", "c"]);
    assert.equal(all.mode, "lock");
    assert.deepEqual(all.keys, ["a", "b/x", "c"]);
    assert.deepEqual(all.tokens, [30n, 31n, 32n]);
    assert.equal(all.token, 30n);
    assert.deepEqual(all.sequencers.map((s) => s.sessionId), [SESSION, SESSION, SESSION]);
    assert.equal(await all.release(), true);
    // Release names the first key with its token: the broker releases them all.
    assert.deepEqual(fake.releases.map((r) => [r.key, r.token]), [["rw/k", 10n], ["rw/k", 20n], ["a", 30n]]);
  } finally {
    await c.close();
    fake.close();
  }
});

test("lockAll refuses bad keys before any call (InvalidArgumentError naming keys)", async () => {
  const { Client } = await import("../src/index.js");
  const fake = await fakeBroker(async function* () {});
  const c = new Client(fake.addr, { timeoutMs: 5000 });
  try {
    for (const bad of [[], "a", undefined, ["a", 7], Array.from({ length: 65 }, (_, i) => `k${i}`)]) {
      await assert.rejects(c.lockAll(bad), (e) => {
        assert.ok(e instanceof InvalidArgumentError, String(e));
        assert.deepEqual(e.fieldViolations.map((v) => v.field), ["keys"]);
        return true;
      });
    }
    assert.equal(fake.requests.length, 0);
  } finally {
    await c.close();
    fake.close();
  }
});

test("a loss naming a key: lease.lostKey and LockLostError.key", async () => {
  const { LostReason } = await import("../gen/lockbroker/v1/lock_pb.js");
  const { Client } = await import("../src/index.js");
  const fake = await fakeBroker(async function* (req) {
    const seqs = [req.key, ...req.keys].map((k, j) => seqOf(k, 5 + j));
    yield { event: { case: "acquired", value: { sequencer: seqs[0], sequencers: seqs, guaranteedFor: guaranteed } } };
    await new Promise((r) => setTimeout(r, 50));
    yield { event: { case: "lost", value: { reason: LostReason.DELETED_BY_OTHER, detail: "deleted", key: "c" } } };
  });
  const c = new Client(fake.addr, { timeoutMs: 5000 });
  try {
    const lease = await c.lockAll(["a", "b", "c"]);
    assert.equal(lease.lostKey, undefined);
    const err = await lease.waitLost(5000);
    assert.ok(err instanceof LockLostError, String(err));
    assert.equal(err.reason, "DELETED_BY_OTHER");
    assert.equal(err.key, "c");
    assert.equal(lease.lostKey, "c");
    assert.equal(lease.signal.reason, err);
    assert.match(err.message, /key c/);
  } finally {
    await c.close();
    fake.close();
  }
});

test("a broker that grants a plain lock for a read or write request, or one sequencer for many keys, is UnimplementedError", async () => {
  const { Client, UnimplementedError } = await import("../src/index.js");
  // An older broker: it ignores kind READ/WRITE and `keys` and grants a lock of `key`.
  const fake = await fakeBroker(async function* (req, ctx, n, released) {
    yield { event: { case: "acquired", value: { sequencer: seqOf(req.key, n), guaranteedFor: guaranteed } } };
    await released;
  });
  const c = new Client(fake.addr, { timeoutMs: 5000 });
  try {
    for (const take of [() => c.readLock("k"), () => c.writeLock("k"), () => c.lockAll(["a", "b"])]) {
      await assert.rejects(take(), (e) => {
        assert.ok(e instanceof UnimplementedError, String(e));
        return true;
      });
    }
  } finally {
    await c.close();
    fake.close();
  }
});

test("a read-write or multi-key hold resumed on another replica carries its kind and keys", async () => {
  const { AcquireKind, LostReason } = await import("../gen/lockbroker/v1/lock_pb.js");
  const { Client } = await import("../src/index.js");
  const grant = (req, resumed) => {
    const kind = req.kind === AcquireKind.WRITE ? LockKind.RWLOCK : LockKind.LOCK;
    const seqs = [req.key, ...req.keys].map((k, j) => seqOf(k, 40 + j, { kind }));
    return { event: { case: "acquired", value: { sequencer: seqs[0], sequencers: req.keys.length ? seqs : [], guaranteedFor: guaranteed, resumed } } };
  };
  // A drains: grants, then says BROKER_SHUTDOWN; B takes the resume.
  const a = await fakeBroker(async function* (req) {
    yield grant(req, false);
    await new Promise((r) => setTimeout(r, 50));
    yield { event: { case: "lost", value: { reason: LostReason.BROKER_SHUTDOWN, guaranteedFor: { seconds: 5n, nanos: 0 } } } };
  });
  const b = await fakeBroker(async function* (req, ctx, n, released) {
    yield grant(req, true);
    await released;
  });
  const c = new Client(a.addr, { targets: [b.addr], timeoutMs: 5000 });
  try {
    const w = await c.writeLock("rw/k");
    await waitUntil(() => w.target === b.addr, 5000, "the write hold resumed on B");
    const all = await c.lockAll(["a", "b", "c"]);
    await waitUntil(() => all.target === b.addr, 5000, "the multi-key hold resumed on B");
    assert.equal(w.lost, false, w.error?.message);
    assert.equal(all.lost, false, all.error?.message);
    const [rw, multi] = b.requests;
    assert.equal(rw.kind, AcquireKind.WRITE);
    assert.equal(rw.session.case, "resume");
    assert.equal(rw.session.value.token, 40n);
    assert.equal(multi.kind, AcquireKind.LOCK);
    assert.deepEqual([multi.key, ...multi.keys], ["a", "b", "c"]);
    assert.equal(multi.session.case, "resume");
    assert.deepEqual([multi.session.value.key, multi.session.value.token], ["a", 40n]);
    assert.deepEqual(all.tokens, [40n, 41n, 42n]);
    assert.equal(await w.release(), true);
    assert.equal(await all.release(), true);
  } finally {
    await c.close();
    a.close();
    b.close();
  }
});

async function waitUntil(pred, timeoutMs, what) {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error(`${what}: not within ${timeoutMs}ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
