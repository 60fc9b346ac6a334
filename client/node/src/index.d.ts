// Types of @lockbroker/client.
//
// Durations in options (ttl, wait, lockDelay, retryFor) are in seconds, as
// in every lockbroker library; timeoutMs options are milliseconds, as in
// Node. Fencing tokens and indexes are bigint (uint64 on the wire).

/** The kind of a key: nothing there, a lock, a semaphore, a read-write lock, someone else's data. */
export type LockKind = "none" | "lock" | "semaphore" | "rwlock" | "foreign" | "unspecified";

/** One grant of a lock or semaphore slot (Chubby's sequencer). Pass `token` to the resources you protect. */
export interface Sequencer {
  readonly key: string;
  readonly sessionId: string;
  readonly lockIndex: bigint;
  /** Fencing token: strictly increases with every new grant of the key. */
  readonly token: bigint;
  readonly kind: LockKind;
  /** A read-write lock's grant (kind "rwlock"): true for a read hold, false for the write hold. */
  readonly read: boolean;
}

/** A current holder of a key. */
export interface Holder {
  readonly sessionId: string;
  readonly value: Uint8Array;
  readonly token: bigint;
  readonly lockIndex: bigint;
  readonly sessionName: string;
  /** A read-write lock's holder: true for a reader, false for the writer. */
  readonly read: boolean;
}

/** The state of a key. `holders` empty (and `holder` null) means nobody holds it: an explicit state. */
export interface State {
  readonly key: string;
  readonly kind: LockKind;
  readonly limit: number;
  readonly holders: readonly Holder[];
  readonly index: bigint;
  /** The oldest holder, or null. */
  readonly holder: Holder | null;
  readonly held: boolean;
}

/** Yielded once by a prefix watch after the state of every key under the prefix. */
export declare const SNAPSHOT_COMPLETE: unique symbol;

/** How long before the guaranteed deadline a silent lease is reported lost (ms). */
export declare const CLIENT_MARGIN_MS: number;

export interface TLSOptions {
  /** PEM of the CA that signed the broker's certificate (default: system roots). */
  ca?: string | Buffer;
  /** The client's PEM certificate chain, for mTLS. */
  cert?: string | Buffer;
  /** The client's PEM private key, for mTLS. */
  key?: string | Buffer;
  /** The name to check in the broker's certificate when it differs from the target's host. */
  serverName?: string;
}

export interface ClientOptions {
  /**
   * More replicas of the same deployment; holds resume on them when theirs
   * goes away, and a waiting lock() moves to the next when its replica fails
   * or stays silent for three of the broker's `queued` heartbeats.
   */
  targets?: string[];
  /** false/undefined: plaintext; true: TLS with the system roots; or TLS options. */
  tls?: boolean | TLSOptions;
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /** Bound of every unary call (ms). Default 10000. */
  timeoutMs?: number;
  /**
   * Called for each call; returns the W3C `traceparent` (and `tracestate`)
   * to send, e.g. a carrier filled by OpenTelemetry's
   * `propagation.inject(context.active(), carrier)`. The broker's span for
   * the call is then its child. Nothing is sent without a valid traceparent.
   */
  traceContext?: () => { traceparent?: string; tracestate?: string } | undefined;
}

export interface SessionOptions {
  /** Session TTL in seconds (10 to 86400; default 15). */
  ttl?: number;
  /** Consul's lock-delay in seconds (0 to 60; default 15). */
  lockDelay?: number;
  /** What Consul does with held keys when the session is invalidated. Default "release". */
  behavior?: "release" | "delete";
  /** Consul health checks the session depends on. */
  checks?: string[];
  /** The session's name in Consul (default "lockbroker"). */
  sessionName?: string;
}

export interface LockOptions extends SessionOptions {
  /** Seconds to wait: undefined waits as long as it takes, 0 tries once, more bounds the wait (WaitTimeoutError). */
  wait?: number;
  /** The holder's identity (a leader's address, a host name). */
  value?: string | Uint8Array;
  /** Aborting it gives up waiting (the promise rejects with the signal's reason). It does not affect a granted lease. */
  signal?: AbortSignal;
  /**
   * Called each time the broker says the request waits, with its place in
   * the key's shared queue. A wait that moves to another replica keeps it.
   */
  onQueued?: (queued: Queued) => unknown;
}

/** What a waiting lock() or semaphore() hears while it waits (the broker's `queued` event). */
export interface Queued {
  /** The place in the key's shared queue, which every replica serves in arrival order: 1 is next; 0 when the broker does not say. */
  readonly position: number;
  /** How many broker requests wait for the key in all. */
  readonly waiting: number;
  /** Who holds the key now. */
  readonly state: State | null;
}

export interface SemaphoreOptions extends LockOptions {
  /** Admit waiters oldest first. */
  fair?: boolean;
}

export interface WatchOptions {
  /** Aborting it ends the iteration (it throws the signal's reason). */
  signal?: AbortSignal;
  /** Watch every key under `key/`; a SNAPSHOT_COMPLETE marker follows the initial states. */
  prefix?: boolean;
  /** Seconds without any replica answering before UnavailableError. Default 15. */
  retryFor?: number;
}

export interface SessionInfo {
  readonly id: string;
  readonly name: string;
  /** Seconds. */
  readonly ttl: number;
  /** Seconds. */
  readonly lockDelay: number;
  readonly behavior: "release" | "delete";
  readonly node: string;
  readonly checks: readonly string[];
  readonly createIndex: bigint;
}

export interface SessionSummary {
  readonly session: SessionInfo | undefined;
  readonly brokerOwned: boolean;
  readonly holds: readonly Sequencer[];
}

/** A lockbroker client. Close it (or `await using`) to release its leases and close its connections. */
export declare class Client {
  constructor(target?: string, options?: ClientOptions);
  readonly targets: readonly string[];
  /** Waits until it holds the lock `key`. */
  lock(key: string, options?: LockOptions): Promise<Lease>;
  /** lock() with wait 0: the Lease, or null when the key is busy. */
  tryLock(key: string, options?: Omit<LockOptions, "wait">): Promise<Lease | null>;
  /** Waits for one of `limit` slots of the semaphore at `prefix`. */
  semaphore(prefix: string, limit: number, options?: SemaphoreOptions): Promise<Lease>;
  /** semaphore() with wait 0: the Lease, or null when every slot is taken. */
  trySemaphore(prefix: string, limit: number, options?: Omit<SemaphoreOptions, "wait">): Promise<Lease | null>;
  /**
   * Waits for a read (shared) hold of the read-write lock `key`: many readers
   * at once, never beside a writer. Waiters are served in arrival order: a
   * reader behind a waiting writer waits. A key of another kind (a lock, a
   * semaphore) rejects with ConflictError, reason "LIMIT_CONFLICT".
   */
  readLock(key: string, options?: LockOptions): Promise<Lease>;
  /**
   * Waits for the write (exclusive) hold of the read-write lock `key`: no
   * reader or other writer beside it; its token is above every token granted
   * on the key before it.
   */
  writeLock(key: string, options?: LockOptions): Promise<Lease>;
  /** readLock() with wait 0: the Lease, or null when the key is busy (a writer holds it or waits). */
  tryReadLock(key: string, options?: Omit<LockOptions, "wait">): Promise<Lease | null>;
  /** writeLock() with wait 0: the Lease, or null when anyone holds the key. */
  tryWriteLock(key: string, options?: Omit<LockOptions, "wait">): Promise<Lease | null>;
  /**
   * Waits until it holds every lock of `keys` (1 to 64) at once, all or
   * nothing, with one session: the broker never holds a subset. The Lease
   * has one sequencer and token per key, in the order of `keys`; losing any
   * key ends the whole hold (`lostKey` names it) and releases the others.
   */
  lockAll(keys: readonly string[], options?: LockOptions): Promise<Lease>;
  /** lockAll() with wait 0: the Lease, or null when any of the keys is busy. */
  tryLockAll(keys: readonly string[], options?: Omit<LockOptions, "wait">): Promise<Lease | null>;
  /** The state of `key` now, read consistently. */
  getLock(key: string, options?: { signal?: AbortSignal }): Promise<State>;
  /** Whether `sequencer` is still the current grant of its key. */
  checkSequencer(sequencer: Sequencer): Promise<boolean>;
  /** The state now, then after every change; reconnects across replicas. */
  watch(key: string, options?: WatchOptions): AsyncGenerator<State | typeof SNAPSHOT_COMPLETE, void, undefined>;
  /**
   * Runs `fn(lease)` while holding the lock `key`, then releases it, whether
   * fn resolves or throws; resolves to fn's result. Rejects with the
   * LockLostError if the hold was lost before fn settled.
   */
  using<T>(key: string, fn: (lease: Lease) => Promise<T> | T, options?: LockOptions): Promise<T>;
  /** Leader election on `key`. */
  election(key: string): Election;
  /** @deprecated Use election(key). */
  leader(key: string): Election;
  /** Creates a client-owned session (renew it within its TTL, destroy it when done). */
  createSession(options?: Omit<SessionOptions, "sessionName"> & { name?: string }): Promise<SessionInfo>;
  /** Renews a session; resolves to how long it is guaranteed from now (seconds). */
  renewSession(sessionId: string): Promise<number>;
  destroySession(sessionId: string): Promise<void>;
  getSession(sessionId: string): Promise<SessionInfo>;
  listSessions(): Promise<SessionSummary[]>;
  /**
   * Takes `key` now for a client-owned session: the Sequencer, or null when
   * busy. `mode` "read" or "write": a read or write hold of the read-write lock `key`.
   */
  tryAcquire(
    key: string,
    sessionId: string,
    options?: { value?: string | Uint8Array; limit?: number; semaphore?: boolean; mode?: "read" | "write" },
  ): Promise<Sequencer | null>;
  /** Releases `key` held by `sessionId`; with a token, only while that grant is current. */
  release(key: string, sessionId: string, token?: bigint | number): Promise<boolean>;
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * A held lock, semaphore slot, read or write hold, or multi-key lock. The
 * lease watches the deadline the broker guarantees, moves the hold to
 * another replica when its replica goes away (same kind and keys, same
 * tokens), and reports a loss before the deadline when it cannot. A lease
 * can be lost at any moment: pass `token` (`tokens`) to what you protect.
 */
export declare class Lease {
  /** The key (for a multi-key lock, the first of `keys`). */
  readonly key: string;
  readonly value: Uint8Array;
  /** The grant of `key`. */
  readonly sequencer: Sequencer;
  /** One sequencer per key, in the request's order (`[sequencer]` for one key). */
  readonly sequencers: readonly Sequencer[];
  /** The keys held, in the request's order (`[key]` for one key). */
  readonly keys: readonly string[];
  /** One fencing token per key, in the order of `keys`. */
  readonly tokens: readonly bigint[];
  /** "read" or "write" for a read-write lock's hold; "lock" or "semaphore" otherwise. */
  readonly mode: "read" | "write" | Exclude<LockKind, "rwlock">;
  /** After a loss, the key whose loss ended the hold, when the broker named one. */
  readonly lostKey: string | undefined;
  /** The fencing token of this grant (of `key`). */
  readonly token: bigint;
  readonly sessionId: string;
  /** Until when the hold is guaranteed, as of the broker's last word (epoch ms, comparable with Date.now()). */
  readonly deadline: number;
  /** Aborted with a LockLostError reason when the lease is lost (not on release()). */
  readonly signal: AbortSignal;
  readonly lost: boolean;
  readonly error: LockLostError | undefined;
  readonly released: boolean;
  /** The replica that holds the lease now. */
  readonly target: string;
  /** How many times the hold moved to another replica. */
  readonly resumes: number;
  /** Milliseconds the hold is still guaranteed for (negative once past). */
  remainingMs(): number;
  /** Throws LockLostError unless the hold is still guaranteed now. */
  check(): void;
  /** Calls cb once when the lease is lost (at once if it is). Not called after release(). */
  onLost(cb: (err: LockLostError) => unknown): void;
  /** Resolves to the LockLostError once lost, or undefined after timeoutMs. */
  waitLost(timeoutMs?: number): Promise<LockLostError | undefined>;
  /** Changes the holder's value; the sequencer stays the same. */
  setValue(value: string | Uint8Array): Promise<void>;
  /** Gives the hold up; true if this call released it, false if it was already lost or released. */
  release(options?: { timeoutMs?: number }): Promise<boolean>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Leader election on one key (etcd's Election shape; the same object in every lockbroker library). */
export declare class Election {
  constructor(client: Client, key: string);
  readonly key: string;
  /** Resolves once this process leads. */
  campaign(value: string | Uint8Array, options?: Omit<LockOptions, "value">): Promise<Lease>;
  /** Gives the leadership from the last campaign() up; false without one. */
  resign(options?: { timeoutMs?: number }): Promise<boolean>;
  /** Changes the leader's value (same token); NotLeaderError without a leadership. */
  proclaim(value: string | Uint8Array): Promise<void>;
  /** The leader now, or null. */
  leader(): Promise<Holder | null>;
  /** The leader (or null) after every change of leadership. */
  observe(options?: WatchOptions): AsyncGenerator<Holder | null, void, undefined>;
}

export interface ErrorOptions {
  code?: number;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  state?: State;
  retryAfter?: number;
  fieldViolations?: { field: string; description: string }[];
  quotaViolations?: { subject: string; description: string }[];
  cause?: unknown;
}

/** Base of every error the library throws, with the broker's status details. */
export declare class LockbrokerError extends Error {
  constructor(message: string, options?: ErrorOptions);
  /** The connect Code (number); undefined for errors the client raises itself. */
  readonly code: number | undefined;
  /** The status code's name ("Aborted", "Unavailable", ...). */
  readonly codeName: string | undefined;
  /** ErrorInfo.reason (e.g. "LOCK_HELD"), or for LockLostError the loss reason. */
  readonly reason: string | undefined;
  readonly domain: string | undefined;
  readonly metadata: Record<string, string>;
  /** The key's state when the broker sent it (busy, timeout, not holder). */
  state: State | undefined;
  /** The key's holders when known, else []. */
  readonly holders: readonly Holder[];
  /** Seconds after which a retry may work (RetryInfo). */
  readonly retryAfter: number | undefined;
  readonly fieldViolations: { field: string; description: string }[];
  readonly quotaViolations: { subject: string; description: string }[];
}
export declare class BusyError extends LockbrokerError {}
export declare class LockHeldError extends BusyError {}
export declare class LockDelayError extends BusyError {}
export declare class WaitTimeoutError extends BusyError {}
export declare class InvalidArgumentError extends LockbrokerError {}
/**
 * FAILED_PRECONDITION: foreign flags, another semaphore limit, a malformed
 * semaphore, or a key of another kind than asked for (reason
 * "LIMIT_CONFLICT"; the message names the kind found, as `state.kind` does
 * when the broker sent the key's state).
 */
export declare class ConflictError extends LockbrokerError {}
export declare class NotHolderError extends LockbrokerError {}
export declare class NotLeaderError extends NotHolderError {}
export declare class ResumeRefusedError extends LockbrokerError {}
export declare class SessionNotFoundError extends LockbrokerError {}
export declare class SessionLostError extends LockbrokerError {}
export declare class PermissionDeniedError extends LockbrokerError {}
export declare class UnauthenticatedError extends LockbrokerError {}
export declare class QuotaExceededError extends LockbrokerError {}
/** Consul refused the request as malformed or too large (CONSUL_REJECTED). */
export declare class RejectedError extends LockbrokerError {}
export declare class UnavailableError extends LockbrokerError {}
export declare class UnimplementedError extends LockbrokerError {}
export declare class CancelledError extends LockbrokerError {}
export declare class InternalError extends LockbrokerError {}

/**
 * The hold is gone. `reason`: SESSION_INVALIDATED, RELEASED_BY_OTHER,
 * DELETED_BY_OTHER, RENEWAL_FAILED, LIMIT_CONFLICT, RESUMED_ELSEWHERE (from
 * the broker), or KEEPALIVE_TIMEOUT, RESUME_REFUSED, RELEASED (decided by
 * the client).
 */
export declare class LockLostError extends LockbrokerError {
  constructor(reason: string, detail?: string, key?: string);
  readonly reason: string;
  readonly detail: string;
  /** The key whose loss ended the hold (AcquireLost.key; for a multi-key lock the key lost first), when the broker named one. */
  readonly key: string | undefined;
}

/** The LockbrokerError for any error a call threw (a ConnectError or other). */
export declare function fromError(err: unknown): LockbrokerError;
