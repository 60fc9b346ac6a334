#!/usr/bin/env node
// A small CLI over the library, for cross-language conformance runs
// (test/conformance/scenarios.md, S5) and for trying a deployment by hand.
//
//   node conformance.mjs hold --target 127.0.0.1:8700 --key jobs/x [--limit 3] [--seconds 30]
//   node conformance.mjs hold --target 127.0.0.1:8700 --key jobs/x --mode read|write
//   node conformance.mjs hold --target 127.0.0.1:8700 --key a --also b --also c
//   node conformance.mjs watch --target 127.0.0.1:8700 --key jobs/x [--seconds 30]
//
// `hold` takes a lock (limit 0) or a semaphore slot (limit > 0), a read or
// write hold of a read-write lock (--mode read|write, S10), or a multi-key
// lock of --key and every --also (S10), holds it for --seconds (or until
// SIGTERM, or until stdin closes when it is a pipe), releases it, and
// prints JSON lines: {"event":"acquired","token":T,"mode":M,...} (M is
// "read", "write", "lock" or "semaphore"; a multi-key hold adds
// "keys":[...] and "tokens":[...], one per key in order), then
// {"event":"released","release_t":...} (release_t: when the release was
// asked for) or {"event":"lost","reason":...} (with "key" when
// the broker named the key lost); failures print {"event":"error",...} and
// exit 1. `watch` prints {"event":"state",...} per state.

import { fstatSync } from "node:fs";
import { parseArgs } from "node:util";

import { Client, SNAPSHOT_COMPLETE } from "./src/index.js";

const emit = (obj) => process.stdout.write(`${JSON.stringify({ lang: "node", t: Date.now() / 1000, ...obj })}\n`);
const big = (v) => (typeof v === "bigint" ? Number(v) : v);

function fail(e) {
  emit({ event: "error", error: String(e?.message ?? e), reason: e?.reason ?? null, type: e?.name });
  return 1;
}

function take(client, args, opts) {
  const limit = Number(args.limit ?? 0);
  const also = args.also ?? [];
  if (args.mode === "read") return client.readLock(args.key, opts);
  if (args.mode === "write") return client.writeLock(args.key, opts);
  if (also.length > 0) return client.lockAll([args.key, ...also], opts);
  return limit > 0 ? client.semaphore(args.key, limit, opts) : client.lock(args.key, opts);
}

async function hold(client, args) {
  const opts = {
    ttl: args.ttl === undefined ? undefined : Number(args.ttl),
    wait: args.wait === undefined ? undefined : Number(args.wait),
    value: args.value ?? "",
  };
  let lease;
  try {
    lease = await take(client, args, opts);
  } catch (e) {
    return fail(e);
  }
  const multi = (args.also ?? []).length > 0 ? { keys: lease.keys, tokens: lease.tokens.map(big) } : {};
  emit({
    event: "acquired",
    key: args.key,
    token: big(lease.token),
    mode: lease.mode,
    ...multi,
    session_id: lease.sessionId,
    deadline_in: lease.remainingMs() / 1000,
  });
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once("SIGTERM", onSignal);
  // Stdin's end is a request to release when stdin is a pipe (not /dev/null or a terminal).
  const stdinPipe = (() => {
    try {
      const st = fstatSync(0);
      return st.isFIFO() || st.isSocket();
    } catch {
      return false;
    }
  })();
  if (stdinPipe) {
    process.stdin.on("data", () => {});
    process.stdin.once("end", onSignal);
    process.stdin.once("close", onSignal);
    process.stdin.resume();
  }
  const timer = setTimeout(onSignal, Number(args.seconds ?? 30) * 1000);
  await new Promise((r) => {
    stop.signal.addEventListener("abort", r, { once: true });
    lease.signal.addEventListener("abort", r, { once: true });
  });
  clearTimeout(timer);
  if (stdinPipe) process.stdin.destroy();
  if (lease.lost) {
    emit({ event: "lost", reason: lease.error.reason, detail: lease.error.detail, ...(lease.lostKey ? { key: lease.lostKey } : {}) });
    return 2;
  }
  // release_t: when the release was asked for. The hold ends between it
  // and this line's t, so [acquired t, release_t] lies inside the hold
  // (S10's overlap check), while the next holder may print `acquired`
  // before this line.
  const releaseT = Date.now() / 1000;
  await lease.release();
  emit({ event: "released", token: big(lease.token), mode: lease.mode, release_t: releaseT });
  return 0;
}

async function watch(client, args) {
  const signal = AbortSignal.timeout(Number(args.seconds ?? 30) * 1000);
  try {
    for await (const st of client.watch(args.key, { signal, prefix: Boolean(args.prefix) })) {
      if (st === SNAPSHOT_COMPLETE) {
        emit({ event: "snapshot_complete" });
        continue;
      }
      emit({
        event: "state",
        key: st.key,
        kind: st.kind,
        limit: st.limit,
        holders: st.holders.map((h) => ({ session_id: h.sessionId, value: Buffer.from(h.value).toString(), token: big(h.token) })),
      });
    }
  } catch (e) {
    if (!signal.aborted) return fail(e);
  }
  return 0;
}

async function main() {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: {
      target: { type: "string", multiple: true },
      key: { type: "string" },
      seconds: { type: "string" },
      token: { type: "string" },
      limit: { type: "string" },
      ttl: { type: "string" },
      wait: { type: "string" },
      value: { type: "string" },
      prefix: { type: "boolean" },
      mode: { type: "string" },
      also: { type: "string", multiple: true },
    },
  });
  const cmd = positionals[0];
  const usage = (why) => {
    if (why) process.stderr.write(`conformance.mjs: ${why}\n`);
    process.stderr.write(
      "usage: conformance.mjs hold|watch --target ADDR [--target ADDR] --key KEY [--limit N | --mode read|write | --also KEY ...] [--seconds S]\n",
    );
    return 2;
  };
  if (!["hold", "watch"].includes(cmd) || !values.target || !values.key) return usage();
  if (values.mode !== undefined && !["read", "write"].includes(values.mode)) return usage(`--mode must be read or write, not ${values.mode}`);
  const modes = [values.mode !== undefined, (values.also ?? []).length > 0, Number(values.limit ?? 0) > 0].filter(Boolean);
  if (modes.length > 1) return usage("--mode, --also and --limit exclude each other");
  const [first, ...rest] = values.target;
  // LOCKBROKER_TRACEPARENT: the caller's W3C trace context for every call
  // (the trace test, test/conformance/go).
  const tp = process.env.LOCKBROKER_TRACEPARENT;
  const client = new Client(first, { targets: rest, token: values.token, traceContext: tp ? () => ({ traceparent: tp }) : undefined });
  try {
    return cmd === "hold" ? await hold(client, values) : await watch(client, values);
  } finally {
    await client.close();
  }
}

process.exitCode = await main();
