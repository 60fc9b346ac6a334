// Offline tests of the package: the generated copy is in sync with gen/es,
// the declared types compile, and errors carry the broker's status details.

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
