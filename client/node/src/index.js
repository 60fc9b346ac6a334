// @lockbroker/client: distributed locks, semaphores and leader election on
// Consul through a lockbroker broker. See index.d.ts for the API.

export { Client, Election, Lease, CLIENT_MARGIN_MS, SNAPSHOT_COMPLETE } from "./client.js";
export {
  BusyError,
  CancelledError,
  ConflictError,
  InternalError,
  InvalidArgumentError,
  LockDelayError,
  LockHeldError,
  LockLostError,
  LockbrokerError,
  NotHolderError,
  NotLeaderError,
  PermissionDeniedError,
  QuotaExceededError,
  RejectedError,
  ResumeRefusedError,
  SessionLostError,
  SessionNotFoundError,
  UnauthenticatedError,
  UnavailableError,
  UnimplementedError,
  WaitTimeoutError,
  fromError,
} from "./errors.js";
