// Errors, with the details the broker puts in every error status: the
// google.rpc.ErrorInfo reason (see proto/lockbroker/v1/errors.proto), the
// key's state (who holds it), a retry hint, bad fields, quota. fromError
// turns a ConnectError into the most specific class below; a broker that
// sends no details still gets the class its status code calls for.

import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { LockStateSchema } from "../gen/lockbroker/v1/types_pb.js";
import { BadRequestSchema, ErrorInfoSchema, QuotaFailureSchema, RetryInfoSchema } from "./rpc.js";
import { stateFromProto } from "./types.js";

export const DOMAIN = "lockbroker.v1";

export class LockbrokerError extends Error {
  constructor(message, opts = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    /** connect Code (number), or undefined for errors the client raises itself. */
    this.code = opts.code;
    /** ErrorInfo.reason, e.g. "LOCK_HELD"; undefined when the broker sent none. */
    this.reason = opts.reason;
    this.domain = opts.domain;
    this.metadata = opts.metadata ?? {};
    /** The key's State when the broker sent it (busy, timed out, not holder). */
    this.state = opts.state;
    /** Seconds after which a retry may work (RetryInfo), or undefined. */
    this.retryAfter = opts.retryAfter;
    this.fieldViolations = opts.fieldViolations ?? [];
    this.quotaViolations = opts.quotaViolations ?? [];
  }

  /** The key's holders when the broker said who they are, else []. */
  get holders() {
    return this.state ? this.state.holders : [];
  }

  /** The status code's name ("Aborted", "Unavailable", ...). */
  get codeName() {
    return this.code === undefined ? undefined : Code[this.code];
  }
}

/** The key is held or blocked by someone else; `holders` says by whom. */
export class BusyError extends LockbrokerError {}
/** A try (wait 0) found the key held (ABORTED, LOCK_HELD). */
export class LockHeldError extends BusyError {}
/** A try found the key inside Consul's lock-delay (ABORTED, LOCK_DELAY). */
export class LockDelayError extends BusyError {}
/** A bounded wait ran out (DEADLINE_EXCEEDED, WAIT_TIMEOUT). */
export class WaitTimeoutError extends BusyError {}
/** A request field is bad (INVALID_ARGUMENT); see fieldViolations. */
export class InvalidArgumentError extends LockbrokerError {}
/**
 * Foreign flags, a different semaphore limit, a malformed semaphore, or a
 * key of another kind than asked for (FAILED_PRECONDITION). A kind conflict
 * (a lock asked for on a read-write lock, a read or write hold on a lock or
 * semaphore, ...) has reason LIMIT_CONFLICT; its message names the kind
 * found, and `state.kind` is that kind when the broker sent the key's state.
 */
export class ConflictError extends LockbrokerError {}
/** The session does not hold the key, or the grant is no longer current (NOT_HOLDER). */
export class NotHolderError extends LockbrokerError {}
/** Election.proclaim() without a leadership (raised by the client itself). */
export class NotLeaderError extends NotHolderError {}
/** A resume named a grant that is no longer current (RESUME_REFUSED). */
export class ResumeRefusedError extends LockbrokerError {}
/** The session does not exist (NOT_FOUND). */
export class SessionNotFoundError extends LockbrokerError {}
/**
 * The request's own session was invalidated while it waited (SESSION_LOST),
 * or the stream said `lost` instead of `acquired` (a grant the broker could
 * not announce safely; the message names its reason).
 */
export class SessionLostError extends LockbrokerError {}
/** Not allowed, or Consul's ACLs refused the operation (PERMISSION_DENIED). */
export class PermissionDeniedError extends LockbrokerError {}
/** No identity the broker accepts (UNAUTHENTICATED). */
export class UnauthenticatedError extends LockbrokerError {}
/** Over a tenant quota (RESOURCE_EXHAUSTED). */
export class QuotaExceededError extends LockbrokerError {}
/** Consul or the broker cannot be reached, or the broker is shutting down (UNAVAILABLE). */
export class UnavailableError extends LockbrokerError {}
/** Consul refused the request as malformed or too large (CONSUL_REJECTED); retrying does not help. */
export class RejectedError extends LockbrokerError {}
/** The broker does not implement this call (an older broker). */
export class UnimplementedError extends LockbrokerError {}
/** The call was cancelled. */
export class CancelledError extends LockbrokerError {}
/** A broker bug (INTERNAL, UNKNOWN). */
export class InternalError extends LockbrokerError {}

/**
 * The hold is gone. `reason` is one of the broker's loss reasons
 * (SESSION_INVALIDATED, RELEASED_BY_OTHER, DELETED_BY_OTHER, RENEWAL_FAILED,
 * LIMIT_CONFLICT, RESUMED_ELSEWHERE) or one the client decides:
 * KEEPALIVE_TIMEOUT (no keepalive from any replica before the guaranteed
 * deadline), RESUME_REFUSED (a replica refused to resume the hold), RELEASED
 * (a Release call from elsewhere ended the hold). `key` is the key whose
 * loss ended the hold when the broker named one (AcquireLost.key: for a
 * multi-key lock, the key lost first; the broker released the others),
 * else undefined.
 */
export class LockLostError extends LockbrokerError {
  constructor(reason, detail = "", key = undefined) {
    super(`lock lost: ${reason}${key ? ` (key ${key})` : ""}${detail ? `: ${detail}` : ""}`, { reason });
    this.detail = detail;
    this.key = key || undefined;
  }
}

const BY_REASON = {
  INVALID_ARGUMENT: InvalidArgumentError,
  LOCK_HELD: LockHeldError,
  LOCK_DELAY: LockDelayError,
  WAIT_TIMEOUT: WaitTimeoutError,
  FOREIGN_FLAGS: ConflictError,
  LIMIT_CONFLICT: ConflictError,
  MALFORMED_SEMAPHORE: ConflictError,
  SESSION_NOT_FOUND: SessionNotFoundError,
  NOT_HOLDER: NotHolderError,
  RESUME_REFUSED: ResumeRefusedError,
  SESSION_LOST: SessionLostError,
  CONSUL_UNAVAILABLE: UnavailableError,
  CONSUL_PERMISSION_DENIED: PermissionDeniedError,
  BROKER_SHUTTING_DOWN: UnavailableError,
  PERMISSION_DENIED: PermissionDeniedError,
  UNAUTHENTICATED: UnauthenticatedError,
  QUOTA_EXCEEDED: QuotaExceededError,
  INTERNAL: InternalError,
  CONSUL_REJECTED: RejectedError,
  REPLICA_CUT_OFF: UnavailableError,
};

const BY_CODE = {
  [Code.InvalidArgument]: InvalidArgumentError,
  [Code.Aborted]: LockHeldError,
  [Code.DeadlineExceeded]: WaitTimeoutError,
  [Code.FailedPrecondition]: ConflictError,
  [Code.NotFound]: SessionNotFoundError,
  [Code.PermissionDenied]: PermissionDeniedError,
  [Code.Unauthenticated]: UnauthenticatedError,
  [Code.ResourceExhausted]: QuotaExceededError,
  [Code.Unavailable]: UnavailableError,
  [Code.Unimplemented]: UnimplementedError,
  [Code.Canceled]: CancelledError,
};

/** Decodes ConnectError.details into LockbrokerError options. */
export function parseDetails(details) {
  const out = {};
  for (const d of details ?? []) {
    if (!d || "desc" in d) continue;
    try {
      switch (d.type) {
        case "google.rpc.ErrorInfo": {
          const info = fromBinary(ErrorInfoSchema, d.value);
          out.reason = info.reason || undefined;
          out.domain = info.domain || undefined;
          out.metadata = { ...info.metadata };
          break;
        }
        case "google.rpc.RetryInfo": {
          const r = fromBinary(RetryInfoSchema, d.value).retryDelay;
          if (r) out.retryAfter = Number(r.seconds) + r.nanos / 1e9;
          break;
        }
        case "google.rpc.BadRequest":
          out.fieldViolations = fromBinary(BadRequestSchema, d.value).fieldViolations.map((v) => ({
            field: v.field,
            description: v.description,
          }));
          break;
        case "google.rpc.QuotaFailure":
          out.quotaViolations = fromBinary(QuotaFailureSchema, d.value).violations.map((v) => ({
            subject: v.subject,
            description: v.description,
          }));
          break;
        case "lockbroker.v1.LockState":
          out.state = stateFromProto(fromBinary(LockStateSchema, d.value));
          break;
        default:
      }
    } catch {
      // a detail we cannot decode is left out
    }
  }
  return out;
}

// Node's codes for a TLS handshake that failed: OpenSSL's (ERR_SSL_...),
// Node's (ERR_TLS_...) and X.509 verification's (UNABLE_TO_VERIFY_LEAF_SIGNATURE,
// SELF_SIGNED_CERT_IN_CHAIN, CERT_HAS_EXPIRED, ...).
const TLS_FAILURE = /^(ERR_SSL_|ERR_TLS_|UNABLE_TO_)|CERT|^(INVALID_CA|INVALID_PURPOSE|PATH_LENGTH_EXCEEDED|HOSTNAME_MISMATCH)$/;

// Node's codes for a connection or stream the other side cut off.
const CONNECTION_CUT = /^(ECONNRESET|EPIPE|ERR_STREAM_DESTROYED|ERR_HTTP2_INVALID_STREAM)$/;

/** Whether err, or an error in its chain of causes, has a Node code that re matches. */
function nodeCode(err, re) {
  for (let e = err, i = 0; e instanceof Error && i < 8; e = e.cause, i++) {
    if (typeof e.code === "string" && re.test(e.code)) return true;
  }
  return false;
}

/** The LockbrokerError for any error a call threw. */
export function fromError(err) {
  if (err instanceof LockbrokerError) return err;
  const ce = ConnectError.from(err);
  // connect-node reports a failed TLS handshake (the broker's certificate
  // does not verify, or the broker wants a client certificate) as INTERNAL;
  // it is a broker that cannot be reached as configured: UNAVAILABLE, as
  // gRPC's own clients say, so another replica is tried.
  if (ce.code === Code.Internal && nodeCode(err, TLS_FAILURE)) {
    return new UnavailableError(`TLS handshake failed: ${ce.rawMessage}`, { code: Code.Unavailable, cause: err });
  }
  // connect-node reports a connection the broker cut (reset, or a stream
  // destroyed) as ABORTED, the code the broker uses for a busy lock, which
  // it always sends with a reason. It is a broker that went away:
  // UNAVAILABLE, as gRPC's own clients say, so another replica is tried.
  if (ce.code === Code.Aborted && nodeCode(err, CONNECTION_CUT)) {
    return new UnavailableError(`connection lost: ${ce.rawMessage}`, { code: Code.Unavailable, cause: err });
  }
  const opts = parseDetails(ce.details);
  let cls = opts.domain === undefined || opts.domain === DOMAIN ? BY_REASON[opts.reason] : undefined;
  cls ??= BY_CODE[ce.code] ?? InternalError;
  return new cls(ce.rawMessage, { ...opts, code: ce.code, cause: err });
}

/** Whether another replica may succeed: this one is unreachable or shutting down, not Consul. */
export function failoverOk(err) {
  return err instanceof UnavailableError && err.reason !== "CONSUL_UNAVAILABLE";
}

/** A resume answer that means the hold is gone. */
export function resumeRefused(err) {
  return [Code.FailedPrecondition, Code.NotFound, Code.InvalidArgument, Code.PermissionDenied].includes(err.code);
}
