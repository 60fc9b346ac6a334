// The Node client: Client, Lease, Election over Connect's gRPC transport.

import { clone, create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import {
  AcquireKind,
  AcquireRequestSchema,
  LockService,
  LostReason,
} from "../gen/lockbroker/v1/lock_pb.js";
import { SessionService } from "../gen/lockbroker/v1/session_pb.js";
import { SequencerSchema, SessionBehavior } from "../gen/lockbroker/v1/types_pb.js";
import {
  CancelledError,
  InvalidArgumentError,
  LockDelayError,
  LockHeldError,
  LockLostError,
  LockbrokerError,
  NotHolderError,
  NotLeaderError,
  SessionLostError,
  UnavailableError,
  UnimplementedError,
  WaitTimeoutError,
  failoverOk,
  fromError,
  resumeRefused,
} from "./errors.js";
import {
  SNAPSHOT_COMPLETE,
  queuedFromProto,
  sequencerFromProto,
  sequencerToProto,
  sessionInfoFromProto,
  sessionSummaryFromProto,
  stateFromProto,
} from "./types.js";

/** How long before the guaranteed deadline a silent lease is reported lost (ms). */
export const CLIENT_MARGIN_MS = 250;

// Client.leader(key) warns once per process.
let leaderWarned = false;
/** A stream silent for this share of its guaranteed time is taken to be on a stalled replica. */
const STALL_SHARE = 0.6;
/** Longest single resume attempt on one replica (ms). */
const RESUME_ATTEMPT_MS = 3000;
/**
 * A waiting stream silent for this many of its broker's heartbeats
 * (AcquireQueued.heartbeat) is taken to be on a stalled replica.
 */
const WAIT_STALL_BEATS = 3;

const now = () => performance.now();
const toEpoch = (mono) => performance.timeOrigin + mono;
const END = Symbol("end");
const RELEASED = Symbol("released");
const enc = new TextEncoder();

const asBytes = (v) => (v === undefined || v === null ? new Uint8Array() : typeof v === "string" ? enc.encode(v) : v);
const durationMs = (d) => (d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0);

function duration(seconds, what) {
  if (seconds === undefined || seconds === null) return undefined;
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) {
    throw new InvalidArgumentError(`${what} must be a non-negative number of seconds, not ${seconds}`);
  }
  const nanos = BigInt(Math.round(seconds * 1e9));
  return { seconds: nanos / 1_000_000_000n, nanos: Number(nanos % 1_000_000_000n) };
}

const BEHAVIORS = { undefined: SessionBehavior.UNSPECIFIED, release: SessionBehavior.RELEASE, delete: SessionBehavior.DELETE };

function sessionOptions({ ttl, lockDelay, behavior, checks, sessionName, name } = {}) {
  if (!(String(behavior) in BEHAVIORS)) throw new InvalidArgumentError(`behavior must be "release" or "delete", not ${behavior}`);
  return {
    ttl: duration(ttl, "ttl"),
    lockDelay: duration(lockDelay, "lockDelay"),
    behavior: BEHAVIORS[behavior],
    checks: checks ?? [],
    name: sessionName ?? name ?? "",
  };
}

function lostReasonName(v) {
  const name = LostReason[v];
  return name === undefined ? "UNSPECIFIED" : name;
}

function targetsList(target, targets) {
  const out = [];
  for (const t of [target, ...(targets ?? [])]) if (t && !out.includes(t)) out.push(t);
  if (out.length === 0) throw new TypeError("no broker target");
  return out;
}

// Reads one server stream in the background into a queue of
// [monotonic receive time, message | Error | END], so every wait on it can
// have a bound.
class Reader {
  constructor(open) {
    this.abort = new AbortController();
    this.items = [];
    this.waiter = null;
    this.pump(open(this.abort.signal));
  }

  async pump(iterable) {
    try {
      for await (const msg of iterable) this.push([now(), msg]);
    } catch (e) {
      this.push([now(), e instanceof Error ? e : new Error(String(e))]);
    }
    this.push([now(), END]);
  }

  push(item) {
    this.items.push(item);
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w();
    }
  }

  // The next item, or undefined after timeoutMs (undefined: no bound) or
  // when `wake` resolves first.
  async get(timeoutMs, wake) {
    if (this.items.length === 0) {
      if (timeoutMs !== undefined && timeoutMs <= 0) return undefined;
      let timer;
      const arrived = await Promise.race([
        new Promise((r) => (this.waiter = () => r(true))),
        timeoutMs === undefined ? new Promise(() => {}) : new Promise((r) => (timer = setTimeout(() => r(false), timeoutMs))),
        ...(wake ? [wake.then(() => false)] : []),
      ]);
      clearTimeout(timer);
      if (!arrived) {
        this.waiter = null;
        return undefined;
      }
    }
    return this.items.shift();
  }

  cancel() {
    this.abort.abort();
  }
}

// A waiting request's place in its key's shared queue, carried from
// replica to replica as the Go client does (client/lease.go openAt).
// `queued` names the session the request waits with; when the wait moves
// (its stream failed UNAVAILABLE, or its replica went silent), the request
// on the next replica resumes the wait with that session and no token
// (AcquireRequest.resume), so it keeps its place. When the broker answers
// that the place is gone (FAILED_PRECONDITION or NOT_FOUND: the session
// ended), the original request waits anew on the same replica. A request
// that names its own sessionId keeps sending it. onQueued hears every
// `queued`.
class WaitPlace {
  constructor(req, onQueued) {
    this.req = req;
    this.onQueued = onQueued;
    this.sessionId = "";
    this.resuming = false; // the last request() resumed the wait
  }

  // The request to send to the next replica.
  request() {
    this.resuming = this.sessionId !== "" && this.req.session.case !== "sessionId";
    if (!this.resuming) return this.req;
    const r = clone(AcquireRequestSchema, this.req);
    r.session = { case: "resume", value: create(SequencerSchema, { key: this.req.key, sessionId: this.sessionId }) };
    return r;
  }

  // Whether err refuses a resumed wait because its place is gone: the
  // original request is to be sent instead.
  gone(err) {
    if (!this.resuming || !(err instanceof LockbrokerError)) return false;
    if (err.code !== Code.FailedPrecondition && err.code !== Code.NotFound) return false;
    this.resuming = false;
    this.sessionId = "";
    return true;
  }

  // Notes the session of a `queued` event and tells onQueued.
  heard(queued) {
    if (queued.sessionId) this.sessionId = queued.sessionId;
    if (this.onQueued) callSafely(this.onQueued, queuedFromProto(queued), "onQueued");
  }
}

function streamError(item) {
  if (item === END) return new UnavailableError("the broker ended the stream without a result");
  return fromError(item);
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/**
 * The W3C trace context headers to send with a call: `traceparent` (and
 * `tracestate`) from the object traceContext() returns, e.g. a carrier
 * filled by OpenTelemetry's propagation.inject. Undefined when there is
 * no function, no valid traceparent, or the function throws: the caller's
 * tracing never fails a lock call.
 */
function traceHeaders(traceContext) {
  if (!traceContext) return undefined;
  let carrier;
  try {
    carrier = traceContext() ?? {};
  } catch {
    return undefined;
  }
  const tp = carrier.traceparent;
  if (typeof tp !== "string" || !TRACEPARENT.test(tp)) return undefined;
  const out = { traceparent: tp };
  const ts = carrier.tracestate;
  if (typeof ts === "string" && ts !== "" && ts.length <= 512) out.tracestate = ts;
  return out;
}

/** A lockbroker client. See index.d.ts for the options. */
export class Client {
  constructor(target = "127.0.0.1:8700", { targets = [], tls, token, timeoutMs = 10_000, traceContext } = {}) {
    this.targets = targetsList(target, targets);
    this.timeoutMs = timeoutMs;
    this.headers = token ? { authorization: `Bearer ${token}` } : undefined;
    this._traceContext = traceContext;
    const scheme = tls ? "https" : "http";
    const nodeOptions = tlsOptions(tls);
    // HTTP/2 keepalive: a connection whose peer stops answering pings (a
    // stopped or vanished replica) is closed after about 15 s, so a watch,
    // or a lock() waiting on a broker that sends no heartbeats, fails over
    // instead of hanging. The broker permits client pings every 5 s or more.
    const ping = { pingIntervalMs: 10_000, pingTimeoutMs: 5_000 };
    this._managers = this.targets.map((t) => new Http2SessionManager(`${scheme}://${t}`, ping, nodeOptions));
    const transports = this.targets.map((t, i) =>
      createGrpcTransport({ baseUrl: `${scheme}://${t}`, httpVersion: "2", sessionManager: this._managers[i] }),
    );
    this._locks = transports.map((tr) => createClient(LockService, tr));
    this._sessions = transports.map((tr) => createClient(SessionService, tr));
    this._preferred = 0;
    this._leases = new Set();
    this._closed = false;
  }

  _order() {
    const n = this.targets.length;
    return Array.from({ length: n }, (_, i) => (this._preferred + i) % n);
  }

  _callOptions(extra = {}) {
    const trace = traceHeaders(this._traceContext);
    return { headers: trace ? { ...this.headers, ...trace } : this.headers, ...extra };
  }

  async _unary(service, method, request, { timeoutMs, signal } = {}) {
    const stubs = service === "lock" ? this._locks : this._sessions;
    let last;
    for (const i of this._order()) {
      try {
        const resp = await stubs[i][method](request, this._callOptions({ timeoutMs: timeoutMs ?? this.timeoutMs, signal }));
        this._preferred = i;
        return resp;
      } catch (e) {
        last = fromError(e);
        if (signal?.aborted) throw signal.reason;
        if (failoverOk(last)) continue;
        throw last;
      }
    }
    throw last;
  }

  // -- locks ----------------------------------------------------------------

  /** Waits until it holds the lock `key`; resolves to the Lease. */
  async lock(key, opts = {}) {
    return this._acquire(buildRequest(key, opts, 0, AcquireKind.LOCK), opts);
  }

  /** lock() with wait 0: the Lease, or null when the key is busy. */
  async tryLock(key, opts = {}) {
    return busyIsNull(this.lock(key, { ...opts, wait: 0 }));
  }

  /** Waits for one of `limit` slots of the semaphore at `prefix`. */
  async semaphore(prefix, limit, opts = {}) {
    if (!Number.isInteger(limit) || limit < 1) {
      throw new InvalidArgumentError(`semaphore limit must be a positive integer, not ${limit}`);
    }
    return this._acquire(buildRequest(prefix, opts, limit, AcquireKind.SEMAPHORE), opts);
  }

  /** semaphore() with wait 0: the Lease, or null when every slot is taken. */
  async trySemaphore(prefix, limit, opts = {}) {
    return busyIsNull(this.semaphore(prefix, limit, { ...opts, wait: 0 }));
  }

  /**
   * Waits until it holds a read (shared) hold of the read-write lock `key`:
   * many readers at once, never beside a writer. Readers and writers are
   * served in arrival order, so a reader behind a waiting writer waits.
   */
  async readLock(key, opts = {}) {
    return this._acquire(buildRequest(key, opts, 0, AcquireKind.READ), opts);
  }

  /**
   * Waits until it holds the write (exclusive) hold of the read-write lock
   * `key`: no reader or other writer beside it; its token is above every
   * token granted on the key before it.
   */
  async writeLock(key, opts = {}) {
    return this._acquire(buildRequest(key, opts, 0, AcquireKind.WRITE), opts);
  }

  /** readLock() with wait 0: the Lease, or null when a writer holds or waits for the key. */
  async tryReadLock(key, opts = {}) {
    return busyIsNull(this.readLock(key, { ...opts, wait: 0 }));
  }

  /** writeLock() with wait 0: the Lease, or null when anyone holds the key. */
  async tryWriteLock(key, opts = {}) {
    return busyIsNull(this.writeLock(key, { ...opts, wait: 0 }));
  }

  /**
   * Waits until it holds every lock of `keys` (1 to 64 lock keys) at once,
   * all or nothing, with one session: the broker takes them in one Consul
   * transaction and never holds a subset. The Lease has one sequencer
   * (and token) per key, in the order of `keys`; losing any key ends the
   * whole hold (`lease.lostKey` names it) and releases the rest.
   */
  async lockAll(keys, opts = {}) {
    const [first, rest] = multiKeys(keys);
    return this._acquire(buildRequest(first, opts, 0, AcquireKind.LOCK, rest), opts);
  }

  /** lockAll() with wait 0: the Lease, or null when any of the keys is busy. */
  async tryLockAll(keys, opts = {}) {
    return busyIsNull(this.lockAll(keys, { ...opts, wait: 0 }));
  }

  async _acquire(req, { wait, signal, onQueued } = {}) {
    if (this._closed) throw new CancelledError("client closed");
    signal?.throwIfAborted();
    // The broker enforces `wait`; the local bound only guards against a
    // broker that stops answering while we queue.
    const localEnd = wait === undefined || wait === null ? undefined : now() + wait * 1000 + 10_000;
    const place = new WaitPlace(req, onQueued);
    let last;
    for (const i of this._order()) {
      try {
        let lease;
        try {
          lease = await this._waitAt(i, place.request(), place, localEnd, signal);
        } catch (e) {
          if (signal?.aborted || !place.gone(e)) throw e;
          lease = await this._waitAt(i, req, place, localEnd, signal);
        }
        this._preferred = i;
        return lease;
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        last = e;
        if (e instanceof LockbrokerError && failoverOk(e)) continue;
        throw e;
      }
    }
    throw last;
  }

  // Sends `sent` (place.req, or it resuming the wait) to replica i and
  // waits there for the grant.
  async _waitAt(i, sent, place, localEnd, signal) {
    const reader = new Reader((s) => this._locks[i].acquire(sent, this._callOptions({ signal: s })));
    const onAbort = () => reader.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await this._awaitGrant(i, place, reader, localEnd, signal);
    } catch (e) {
      reader.cancel();
      throw e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  // When a waiting stream last heard from at `heard` is taken for stalled:
  // after WAIT_STALL_BEATS of the heartbeats its broker announced. A waiter
  // hears from its replica only when the key's holders change, and a
  // stopped replica (SIGSTOP) keeps its connection, so without heartbeats
  // silence tells nothing; with one replica there is nowhere else to wait.
  _waitStallAt(heard, heartbeatMs) {
    return this.targets.length < 2 || heartbeatMs === 0 ? Infinity : heard + WAIT_STALL_BEATS * heartbeatMs;
  }

  // Reads one Acquire stream until `acquired`. A stalled replica fails the
  // attempt with UnavailableError, as a broken stream does, so _acquire
  // cancels the stream (the broker releases a grant it sent meanwhile) and
  // moves to the next replica.
  async _awaitGrant(i, place, reader, localEnd, signal) {
    const req = place.req;
    let heartbeat = 0; // ms, as the broker last announced it
    let stallAt = Infinity;
    for (;;) {
      const t0 = now();
      if (localEnd !== undefined && t0 >= localEnd) {
        throw new WaitTimeoutError(`no answer from ${this.targets[i]} within the wait`, { reason: "WAIT_TIMEOUT" });
      }
      const bound = Math.min(localEnd ?? Infinity, stallAt);
      // What the stream delivered is read before its silence is judged.
      const item = await reader.get(bound === Infinity ? undefined : bound - t0);
      if (item === undefined) {
        if (now() >= stallAt) {
          throw new UnavailableError(
            `${this.targets[i]} was silent for ${WAIT_STALL_BEATS} heartbeats of ${heartbeat} ms while the request waited`,
          );
        }
        continue;
      }
      const [t, msg] = item;
      if (msg === END || msg instanceof Error) {
        if (signal?.aborted) throw signal.reason;
        let err = streamError(msg);
        if (err instanceof CancelledError && !reader.abort.signal.aborted) {
          // Nobody here cancelled the call: its connection went away (a
          // replica killed: HTTP/2 reports the reset as CANCEL). The wait
          // moves on as from any broken stream.
          err = new UnavailableError(`the stream to ${this.targets[i]} broke while the request waited: ${err.message}`, {
            code: Code.Unavailable,
            cause: err,
          });
        }
        if (err.holders.length === 0 && err.state === undefined && isBusy(err)) {
          try {
            err.state = await this.getLock(req.key);
          } catch {
            // keep the error without holders
          }
        }
        throw err;
      }
      const ev = msg.event;
      if (ev.case === "queued") {
        heartbeat = durationMs(ev.value.heartbeat) || heartbeat;
        place.heard(ev.value);
      }
      stallAt = this._waitStallAt(t, heartbeat);
      if (ev.case === "acquired") {
        const seq = sequencerFromProto(ev.value.sequencer ?? {});
        const seqs = ev.value.sequencers.map(sequencerFromProto);
        if (req.kind === AcquireKind.SEMAPHORE && seq.kind !== "semaphore") {
          throw new UnimplementedError(
            `the broker granted a ${seq.kind} for a semaphore request on ${seq.key}: it does not support AcquireRequest.kind (one-slot semaphores)`,
          );
        }
        if ((req.kind === AcquireKind.READ || req.kind === AcquireKind.WRITE) && (seq.kind !== "rwlock" || seq.read !== (req.kind === AcquireKind.READ))) {
          throw new UnimplementedError(
            `the broker granted a ${seq.kind}${seq.read ? " read hold" : ""} for a ${AcquireKind[req.kind].toLowerCase()} request on ${seq.key}: it does not support read-write locks`,
          );
        }
        const want = [req.key, ...req.keys];
        if (req.keys.length > 0 && (seqs.length !== want.length || seqs.some((s, j) => s.key !== want[j] || s.sessionId !== seq.sessionId))) {
          throw new UnimplementedError(
            `the broker granted ${seqs.length} sequencer(s) for a multi-key request of ${want.length} keys: it does not support multi-key locks (AcquireRequest.keys)`,
          );
        }
        const lease = new Lease(this, i, req, seq, reader, t + durationMs(ev.value.guaranteedFor), seqs.length > 0 ? seqs : [seq]);
        this._leases.add(lease);
        return lease;
      }
      if (ev.case === "lost" || ev.case === "released") {
        const why = ev.case === "lost" ? `: ${lostReasonName(ev.value.reason)}: ${ev.value.detail}` : "";
        throw new SessionLostError(`the stream ended with ${ev.case} before the grant${why}`, { reason: "SESSION_LOST" });
      }
    }
  }

  // -- reads ----------------------------------------------------------------

  /** The state of `key` now, read consistently. */
  async getLock(key, { signal } = {}) {
    return stateFromProto((await this._unary("lock", "getLock", { key }, { signal })).state);
  }

  /** Whether `sequencer` is still the current grant of its key. */
  async checkSequencer(sequencer) {
    return (await this._unary("lock", "checkSequencer", { sequencer: sequencerToProto(sequencer) })).current;
  }

  /**
   * The state of `key` now, then after every change ("no holder" is a
   * state). With `prefix`, every key under `key/`, then SNAPSHOT_COMPLETE,
   * then the changes. Reconnects (on another replica if any) when the stream
   * breaks; throws UnavailableError after `retryFor` seconds without one.
   * Aborting `signal` ends it by throwing the signal's reason.
   */
  async *watch(key, { signal, prefix = false, retryFor = 15 } = {}) {
    let failingSince;
    let backoff = 100;
    for (;;) {
      for (const i of this._order()) {
        signal?.throwIfAborted();
        const ac = new AbortController();
        const onAbort = () => ac.abort(signal.reason);
        signal?.addEventListener("abort", onAbort, { once: true });
        try {
          for await (const resp of this._locks[i].watch({ key, prefix }, this._callOptions({ signal: ac.signal }))) {
            failingSince = undefined;
            backoff = 100;
            this._preferred = i;
            if (resp.snapshotComplete) yield SNAPSHOT_COMPLETE;
            if (resp.state) yield stateFromProto(resp.state);
          }
        } catch (e) {
          if (signal?.aborted) throw signal.reason;
          const err = fromError(e);
          if (!failoverOk(err)) throw err;
        } finally {
          signal?.removeEventListener("abort", onAbort);
          ac.abort();
        }
      }
      failingSince ??= now();
      if (now() - failingSince > retryFor * 1000) {
        throw new UnavailableError(`no broker replica answered Watch(${key}) for ${retryFor}s`);
      }
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 2000);
    }
  }

  /**
   * Runs `fn(lease)` while holding the lock `key` (lock() with `opts`), then
   * releases it, whether fn resolves or throws; resolves to fn's result.
   * Pass `lease.signal` to what fn does, so that a loss aborts it. If the
   * hold was lost before fn settled, rejects with the LockLostError even
   * when fn resolved: its work may have overlapped another holder's.
   */
  async using(key, fn, opts = {}) {
    const lease = await this.lock(key, opts);
    let result;
    try {
      result = await fn(lease);
    } finally {
      await lease.release();
    }
    if (lease.signal.aborted && lease.signal.reason instanceof LockLostError) throw lease.signal.reason;
    return result;
  }

  /** Leader election on `key` (the Election of every lockbroker library). */
  election(key) {
    return new Election(this, key);
  }

  /** Deprecated: use election(key). */
  leader(key) {
    if (!leaderWarned) {
      leaderWarned = true;
      process.emitWarning("Client.leader(key) is deprecated; use Client.election(key)", {
        type: "DeprecationWarning",
        code: "LOCKBROKER_LEADER",
      });
    }
    return new Election(this, key);
  }

  // -- client-owned sessions ---------------------------------------------

  async createSession(opts = {}) {
    return sessionInfoFromProto((await this._unary("session", "createSession", { options: sessionOptions(opts) })).session);
  }

  /** Renews a session; resolves to how long it is guaranteed from now (seconds). */
  async renewSession(sessionId) {
    const resp = await this._unary("session", "renewSession", { sessionId });
    return durationMs(resp.guaranteedFor) / 1000;
  }

  async destroySession(sessionId) {
    await this._unary("session", "destroySession", { sessionId });
  }

  async getSession(sessionId) {
    return sessionInfoFromProto((await this._unary("session", "getSession", { sessionId })).session);
  }

  async listSessions() {
    return (await this._unary("session", "listSessions", {})).sessions.map(sessionSummaryFromProto);
  }

  /**
   * Takes `key` now for a client-owned session: the Sequencer, or null when
   * busy. `mode` "read" or "write" takes a read or write hold of the
   * read-write lock `key`.
   */
  async tryAcquire(key, sessionId, { value, limit = 0, semaphore = false, mode } = {}) {
    const kinds = { read: AcquireKind.READ, write: AcquireKind.WRITE, undefined: semaphore ? AcquireKind.SEMAPHORE : AcquireKind.LOCK };
    if (!(String(mode) in kinds)) throw new InvalidArgumentError(`mode must be "read" or "write", not ${mode}`);
    const req = { key, sessionId, value: asBytes(value), limit, kind: kinds[mode] };
    try {
      return sequencerFromProto((await this._unary("lock", "tryAcquire", req)).sequencer);
    } catch (e) {
      if (e instanceof LockHeldError || e instanceof LockDelayError) return null;
      throw e;
    }
  }

  /**
   * Releases `key` held by `sessionId` (only that grant, with a token; the
   * token is required when the broker made the session).
   */
  async release(key, sessionId, token = 0n) {
    return (await this._unary("lock", "release", { key, sessionId, token: BigInt(token) })).released;
  }

  // -- lifetime -------------------------------------------------------------

  /** Releases this client's leases and closes its connections. */
  async close() {
    this._closed = true;
    await Promise.allSettled([...this._leases].map((l) => l.release({ timeoutMs: 2000 })));
    for (const m of this._managers) m.abort();
  }

  async [Symbol.asyncDispose]() {
    await this.close();
  }
}

// The lease a try* call got, or null when the key was busy.
async function busyIsNull(promise) {
  try {
    return await promise;
  } catch (e) {
    if (e instanceof LockHeldError || e instanceof LockDelayError) return null;
    throw e;
  }
}

/** The most keys one multi-key lock takes (AcquireRequest.key and 63 `keys`). */
const MAX_KEYS = 64;

// lockAll's keys as [the first, the others] for buildRequest, or
// InvalidArgumentError naming `keys`. The broker checks each key, and that
// they differ.
function multiKeys(keys) {
  const bad = (why) => new InvalidArgumentError(`keys: ${why}`, { fieldViolations: [{ field: "keys", description: why }] });
  if (!Array.isArray(keys)) throw bad(`must be an array of lock keys, not ${typeof keys}`);
  if (keys.length === 0) throw bad("at least one key is required");
  if (keys.length > MAX_KEYS) throw bad(`at most ${MAX_KEYS} keys, not ${keys.length}`);
  const i = keys.findIndex((k) => typeof k !== "string");
  if (i >= 0) throw bad(`keys[${i}] must be a string, not ${typeof keys[i]}`);
  return [keys[0], keys.slice(1)];
}

function isBusy(err) {
  return err instanceof LockHeldError || err instanceof LockDelayError || err instanceof WaitTimeoutError;
}

function tlsOptions(tls) {
  if (!tls) return {};
  if (tls === true) return {};
  const out = {};
  if (tls.ca) out.ca = tls.ca;
  if (tls.cert) out.cert = tls.cert;
  if (tls.key) out.key = tls.key;
  if (tls.serverName) out.servername = tls.serverName;
  return out;
}

function buildRequest(key, opts, limit, kind, keys = []) {
  return create(AcquireRequestSchema, {
    key,
    keys,
    value: asBytes(opts.value),
    limit,
    fair: Boolean(opts.fair),
    kind,
    waitTimeout: duration(opts.wait, "wait"),
    session: { case: "newSession", value: sessionOptions(opts) },
  });
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }
    function onAbort() {
      clearTimeout(t);
      reject(signal.reason);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A held lock, semaphore slot, read or write hold of a read-write lock, or
 * multi-key lock. The broker keeps it alive while the lease is open; the
 * lease watches the guaranteed deadline, moves the hold to another replica
 * when its replica goes away (the same request, kind and keys, resuming
 * the first key's sequencer), and reports a loss (signal aborted, onLost
 * callbacks, check() throws) before the deadline when it cannot.
 */
export class Lease {
  constructor(client, replica, req, seq, reader, deadline, seqs = [seq]) {
    this._client = client;
    this._req = req;
    this.key = req.key;
    this.value = req.value;
    this.sequencer = seq;
    /** One sequencer per key, in the request's order (`[sequencer]` for one key). */
    this.sequencers = Object.freeze([...seqs]);
    this._replica = replica;
    this._reader = reader;
    this._deadline = deadline;
    this._releasing = false;
    this._released = false;
    this._error = undefined;
    this._callbacks = [];
    this._abort = new AbortController();
    this.resumes = 0;
    this._wakeUp = undefined;
    this._wake = new Promise((r) => (this._wakeUp = r));
    this._done = this._run(reader);
  }

  /** The fencing token of this grant (bigint). */
  get token() {
    return this.sequencer.token;
  }

  get sessionId() {
    return this.sequencer.sessionId;
  }

  /** The keys held, in the request's order (`[key]` for one key). */
  get keys() {
    return this.sequencers.map((s) => s.key);
  }

  /** One fencing token (bigint) per key, in the order of `keys`. */
  get tokens() {
    return this.sequencers.map((s) => s.token);
  }

  /** "read" or "write" for a read-write lock's hold, else the sequencer's kind ("lock", "semaphore"). */
  get mode() {
    const s = this.sequencer;
    return s.kind === "rwlock" ? (s.read ? "read" : "write") : s.kind;
  }

  /** After a loss, the key whose loss ended the hold when the broker named one (undefined otherwise). */
  get lostKey() {
    return this._error?.key;
  }

  /** Until when the hold is guaranteed, as of the broker's last word (epoch ms). */
  get deadline() {
    return toEpoch(this._deadline);
  }

  /** Milliseconds the hold is still guaranteed for (negative once past). */
  remainingMs() {
    return this._deadline - now();
  }

  /** Aborted, with a LockLostError reason, when the lease is lost. */
  get signal() {
    return this._abort.signal;
  }

  get lost() {
    return this._error !== undefined;
  }

  get error() {
    return this._error;
  }

  get released() {
    return this._released;
  }

  /** The broker replica that holds the lease now. */
  get target() {
    return this._client.targets[this._replica];
  }

  /** Throws LockLostError unless the hold is still guaranteed now. */
  check() {
    if (this._error) throw this._error;
    if (this._released) throw new LockLostError("RELEASED", "released by this client");
    if (now() >= this._deadline - CLIENT_MARGIN_MS) {
      throw new LockLostError("KEEPALIVE_TIMEOUT", "no keepalive from the broker before the guaranteed deadline");
    }
  }

  /** Calls cb(LockLostError) once when the lease is lost (at once if it is). Not after release(). */
  onLost(cb) {
    if (this._error) queueMicrotask(() => callSafely(cb, this._error));
    else this._callbacks.push(cb);
  }

  /** Resolves to the LockLostError once lost, or undefined after timeoutMs. */
  waitLost(timeoutMs) {
    if (this._error) return Promise.resolve(this._error);
    return new Promise((resolve) => {
      let timer;
      const onAbort = () => {
        clearTimeout(timer);
        resolve(this._error);
      };
      this.signal.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          this.signal.removeEventListener("abort", onAbort);
          resolve(undefined);
        }, timeoutMs);
      }
    });
  }

  /** Changes the holder's value; the sequencer stays the same. */
  async setValue(value) {
    this.check();
    const v = asBytes(value);
    await this._client._unary("lock", "setValue", { key: this.key, sessionId: this.sessionId, value: v, token: this.token });
    this.value = v;
  }

  /**
   * Gives the hold up and waits (at most timeoutMs) until the broker has
   * released it. Resolves to true if this call released it, false if it was
   * already lost or released.
   */
  async release({ timeoutMs = 10_000 } = {}) {
    if (this._error || this._released || this._releasing) return false;
    this._releasing = true;
    const end = now() + timeoutMs;
    let released = true;
    try {
      const resp = await this._client._unary(
        "lock",
        "release",
        { key: this.key, sessionId: this.sessionId, token: this.token },
        { timeoutMs: Math.max(100, Math.min(timeoutMs, this._client.timeoutMs)) },
      );
      released = resp.released;
    } catch (e) {
      // NotHolder: another grant holds the key now. Otherwise closing the
      // stream releases a broker-owned session too.
      if (e instanceof NotHolderError) released = false;
      this._reader.cancel();
    }
    this._wakeUp();
    let timer;
    const finished = await Promise.race([
      this._done.then(() => true),
      new Promise((r) => (timer = setTimeout(() => r(false), Math.max(0, end - now())))),
    ]);
    clearTimeout(timer);
    if (!finished) {
      this._reader.cancel();
      await Promise.race([this._done, new Promise((r) => (timer = setTimeout(r, 1000)))]);
      clearTimeout(timer);
    }
    this._released = this._error === undefined;
    this._client._leases.delete(this);
    return released;
  }

  async [Symbol.asyncDispose]() {
    await this.release();
  }

  // -- the lease's loop -----------------------------------------------------

  _giveUpAt() {
    return this._deadline - CLIENT_MARGIN_MS;
  }

  _stallAt(lastWord, guaranteed) {
    return this._client.targets.length < 2 ? Infinity : lastWord + STALL_SHARE * guaranteed;
  }

  async _run(reader) {
    try {
      for (;;) {
        const outcome = await this._follow(reader);
        if (outcome !== undefined) {
          this._finish(outcome);
          return;
        }
        reader = await this._resume();
        if (reader === undefined) return;
      }
    } catch (e) {
      this._finish(new LockLostError("KEEPALIVE_TIMEOUT", `client error: ${e?.message ?? e}`));
    }
  }

  // Reads the stream until the lease ends (LockLostError or RELEASED) or
  // should move (undefined: broken stream, broker shutting down, or a
  // silent replica with others to try).
  async _follow(reader) {
    let stallAt = this._stallAt(now(), this._deadline - now());
    for (;;) {
      const giveUp = this._giveUpAt();
      const t0 = now();
      if (t0 >= giveUp) return new LockLostError("KEEPALIVE_TIMEOUT", "no keepalive from the broker before the guaranteed deadline");
      if (t0 >= stallAt) return undefined;
      const item = await reader.get(Math.min(giveUp, stallAt) - t0);
      if (item === undefined) continue;
      const [t, msg] = item;
      if (msg === END || msg instanceof Error) {
        if (this._releasing) return RELEASED;
        return undefined;
      }
      const ev = msg.event;
      if (ev.case === "keepalive") {
        const g = durationMs(ev.value.guaranteedFor);
        this._deadline = t + g;
        stallAt = this._stallAt(t, g);
      } else if (ev.case === "released") {
        return this._releasing ? RELEASED : new LockLostError("RELEASED", "released through the Release call from elsewhere");
      } else if (ev.case === "lost") {
        const reason = lostReasonName(ev.value.reason);
        if (reason === "BROKER_SHUTDOWN" || reason === "REPLICA_CUT_OFF") {
          // Resume elsewhere. The drain (or the cut-off replica's last renewal) may end
          // before the TTL would: the hold is guaranteed until the earlier.
          if (ev.value.guaranteedFor) this._deadline = Math.min(this._deadline, t + durationMs(ev.value.guaranteedFor));
          return undefined;
        }
        return new LockLostError(reason, ev.value.detail, ev.value.key);
      }
    }
  }

  async _resume() {
    const client = this._client;
    const n = client.targets.length;
    const old = this._reader;
    const start = this._replica;
    const req = clone(AcquireRequestSchema, this._req);
    req.session = { case: "resume", value: sequencerToProto(this.sequencer) };
    for (let attempt = 1; ; attempt++) {
      if (this._releasing) {
        old.cancel();
        this._finish(RELEASED);
        return undefined;
      }
      const remaining = this._giveUpAt() - now();
      if (remaining <= 0) {
        old.cancel();
        this._finish(new LockLostError("KEEPALIVE_TIMEOUT", "no broker replica could resume the hold before its guaranteed deadline"));
        return undefined;
      }
      const i = (start + attempt) % n;
      const reader = new Reader((s) => client._locks[i].acquire(req, client._callOptions({ signal: s })));
      const result = await this._awaitResume(reader, now() + Math.min(remaining, RESUME_ATTEMPT_MS));
      if (typeof result === "number") {
        this._reader = reader;
        this._replica = i;
        this._deadline = result;
        this.resumes++;
        old.cancel();
        if (this._releasing) reader.cancel();
        return reader;
      }
      reader.cancel();
      if (result instanceof LockLostError) {
        old.cancel();
        this._finish(result);
        return undefined;
      }
      if (attempt % n === 0) {
        let timer;
        await Promise.race([
          this._wake,
          new Promise((r) => (timer = setTimeout(r, Math.min(200, Math.max(0, this._giveUpAt() - now()))))),
        ]);
        clearTimeout(timer);
      }
    }
  }

  // The new deadline (number) once `acquired` comes with the same grant; a
  // LockLostError when the hold is gone; else the error.
  async _awaitResume(reader, bound) {
    for (;;) {
      const left = Math.min(bound, this._giveUpAt()) - now();
      if (left <= 0) return new UnavailableError("resume attempt timed out");
      const item = await reader.get(left, this._releasing ? undefined : this._wake);
      if (item === undefined) {
        if (this._releasing) return new CancelledError("released while resuming");
        continue;
      }
      const [t, msg] = item;
      if (msg === END || msg instanceof Error) {
        const err = streamError(msg);
        if (resumeRefused(err)) return new LockLostError("RESUME_REFUSED", `resume refused: ${err.message}`);
        return err;
      }
      const ev = msg.event;
      if (ev.case === "acquired") {
        const seq = ev.value.sequencer;
        if (seq?.token !== this.token || seq?.sessionId !== this.sessionId) {
          return new LockLostError("RESUME_REFUSED", `resume returned another grant (token ${seq?.token})`);
        }
        // A multi-key hold: when the broker lists the keys, each is the same grant.
        const seqs = ev.value.sequencers;
        if (seqs.length > 0 && (seqs.length !== this.sequencers.length || seqs.some((s, j) => s.key !== this.sequencers[j].key || s.token !== this.sequencers[j].token))) {
          return new LockLostError("RESUME_REFUSED", `resume returned other grants of the keys (tokens ${seqs.map((s) => s.token).join(", ")})`);
        }
        return t + durationMs(ev.value.guaranteedFor);
      }
      if (ev.case === "lost") return new LockLostError(lostReasonName(ev.value.reason), ev.value.detail, ev.value.key);
    }
  }

  _finish(outcome) {
    if (this._error || this._released) return;
    if (this._releasing) outcome = RELEASED;
    this._reader.cancel();
    if (outcome === RELEASED) {
      this._released = true;
      this._client._leases.delete(this);
      return;
    }
    this._error = outcome;
    this._client._leases.delete(this);
    const callbacks = this._callbacks;
    this._callbacks = [];
    this._abort.abort(outcome);
    for (const cb of callbacks) callSafely(cb, outcome);
  }
}

function callSafely(cb, arg, what = "onLost") {
  try {
    const r = cb(arg);
    if (r && typeof r.catch === "function") r.catch((e) => console.error(`lockbroker: ${what} callback failed:`, e));
  } catch (e) {
    console.error(`lockbroker: ${what} callback failed:`, e);
  }
}

/**
 * Leader election on one key: campaign() resolves once this process leads
 * (the Lease; its value is the leader's identity), leader() says who leads
 * now, observe() yields the leader (a Holder) or null after every change.
 */
export class Election {
  constructor(client, key) {
    this.client = client;
    this.key = key;
    this._lease = null;
  }

  async campaign(value, opts = {}) {
    const lease = await this.client.lock(this.key, { ...opts, value });
    this._lease = lease;
    return lease;
  }

  /** Gives the leadership from the last campaign() up; false without one. */
  async resign(opts) {
    const lease = this._lease;
    this._lease = null;
    return lease ? lease.release(opts) : false;
  }

  /** Changes the leader's value, same token; NotLeaderError without a leadership. */
  async proclaim(value) {
    if (!this._lease) throw new NotLeaderError(`not the leader of ${this.key}: campaign() first`);
    await this._lease.setValue(value);
  }

  async leader() {
    return (await this.client.getLock(this.key)).holder;
  }

  async *observe(opts = {}) {
    let last;
    let first = true;
    for await (const state of this.client.watch(this.key, opts)) {
      const h = state.holder;
      const ident = h ? `${h.sessionId}\0${Buffer.from(h.value).toString("base64")}` : null;
      if (first || ident !== last) {
        first = false;
        last = ident;
        yield h;
      }
    }
  }
}

export { SNAPSHOT_COMPLETE };
