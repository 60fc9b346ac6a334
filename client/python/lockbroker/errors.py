"""Exceptions, with the details the broker puts in every error status.

Every error the broker returns carries a google.rpc.ErrorInfo with a stable
`reason` (see proto/lockbroker/v1/errors.proto) and, depending on the
reason, the key's current state (who holds it), a retry hint, the bad
fields or the quota. `from_rpc_error` turns a grpc.RpcError into the most
specific class below, with those details as attributes; a broker that sends
no details still gets the class its status code calls for.
"""

from typing import Dict, List, Optional, Tuple

import grpc

from . import _rpc
from ._gen.lockbroker.v1 import types_pb2
from ._types import State

DOMAIN = "lockbroker.v1"
_DETAILS_KEY = "grpc-status-details-bin"


class LockbrokerError(Exception):
    """Base class of every error this library raises.

    Attributes:
        code: the grpc.StatusCode (None for errors raised by the client
            itself, such as LockLost).
        message: the broker's message.
        reason: ErrorInfo.reason, e.g. "LOCK_HELD" (None when the broker
            sent no ErrorInfo).
        metadata: ErrorInfo.metadata.
        state: the key's State when the broker sent it (busy, timed out,
            not the holder), else None.
        retry_after: seconds after which a retry may work (RetryInfo), or None.
        field_violations: [(field, description)] for INVALID_ARGUMENT.
        quota_violations: [(subject, description)] for RESOURCE_EXHAUSTED.
    """

    def __init__(self, message="", *, code=None, reason=None, domain=None, metadata=None, state=None,
                 retry_after=None, field_violations=(), quota_violations=()):
        super().__init__(message)
        self.message = message
        self.code: Optional[grpc.StatusCode] = code
        self.reason: Optional[str] = reason
        self.domain: Optional[str] = domain
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.state: Optional[State] = state
        self.retry_after: Optional[float] = retry_after
        self.field_violations: List[Tuple[str, str]] = list(field_violations)
        self.quota_violations: List[Tuple[str, str]] = list(quota_violations)

    @property
    def holders(self):
        """The key's holders when the broker said who they are, else ()."""
        return self.state.holders if self.state is not None else ()

    def __str__(self):
        parts = [self.message or type(self).__name__]
        if self.code is not None:
            parts.insert(0, f"{self.code.name}:")
        if self.reason:
            parts.append(f"[{self.reason}]")
        return " ".join(parts)


class Busy(LockbrokerError):
    """The key is held (or blocked) by someone else. `holders` says by whom."""


class LockHeld(Busy):
    """A try (wait=0) found the key held (ABORTED, LOCK_HELD)."""


class LockDelay(Busy):
    """A try found the key free but inside Consul's lock-delay after a
    holder's session was invalidated (ABORTED, LOCK_DELAY); `retry_after`
    says when it ends if the broker knows."""


class WaitTimeout(Busy, TimeoutError):
    """A bounded wait ran out (DEADLINE_EXCEEDED, WAIT_TIMEOUT)."""


class InvalidArgument(LockbrokerError, ValueError):
    """A request field is bad (INVALID_ARGUMENT); see field_violations.
    Nothing was written to Consul."""


class Conflict(LockbrokerError):
    """The key cannot be taken as asked (FAILED_PRECONDITION): foreign
    flags (reason FOREIGN_FLAGS), a different semaphore limit or another
    kind than asked for (LIMIT_CONFLICT: a lock or semaphore request on a
    read-write lock, a read or write request on a plain lock or semaphore;
    the message names the kind found and `state.kind` is it, e.g.
    "rwlock" or "lock"), a malformed semaphore (MALFORMED_SEMAPHORE)."""


class NotHolder(LockbrokerError):
    """The session does not hold the key, or the grant named by a token is
    no longer the current one (FAILED_PRECONDITION, NOT_HOLDER)."""


class NotLeader(NotHolder):
    """Election.proclaim() without a leadership: no campaign() won, or it
    was resigned (raised by the client itself)."""


class ResumeRefused(LockbrokerError):
    """A resume named a grant that is no longer current (FAILED_PRECONDITION,
    RESUME_REFUSED)."""


class SessionNotFound(LockbrokerError):
    """The session does not exist (NOT_FOUND). Never retried."""


class SessionLost(LockbrokerError):
    """The request's own session was invalidated while it waited (ABORTED,
    SESSION_LOST), or the stream said `lost` instead of `acquired` (a grant
    the broker could not announce safely; the message names its reason).
    Start again."""


class PermissionDenied(LockbrokerError):
    """Not allowed on this key or method, or Consul's ACLs refused the
    operation (PERMISSION_DENIED)."""


class Unauthenticated(LockbrokerError):
    """The call carries no identity the broker accepts (UNAUTHENTICATED)."""


class QuotaExceeded(LockbrokerError):
    """Over a tenant quota (RESOURCE_EXHAUSTED); see quota_violations and
    retry_after."""


class Unavailable(LockbrokerError):
    """Consul or the broker cannot be reached, or the broker is shutting
    down (UNAVAILABLE). `retry_after` is the broker's hint, if any."""


class Rejected(LockbrokerError):
    """Consul refused the request as malformed or too large (FAILED_PRECONDITION,
    CONSUL_REJECTED): a session check that does not exist, a value over
    Consul's limit. Retrying does not help until that changes."""


class Unimplemented(LockbrokerError):
    """The broker does not implement this call (an older broker)."""


class Cancelled(LockbrokerError):
    """The call was cancelled."""


class Internal(LockbrokerError):
    """A broker bug (INTERNAL or UNKNOWN)."""


class LockLost(LockbrokerError):
    """The hold is gone: raised by Lease.check() and handed to on_lost
    callbacks.

    `reason` is one of the broker's loss reasons — SESSION_INVALIDATED,
    RELEASED_BY_OTHER, DELETED_BY_OTHER, RENEWAL_FAILED, LIMIT_CONFLICT,
    RESUMED_ELSEWHERE — or one the client decides itself:
    KEEPALIVE_TIMEOUT (no keepalive from any broker replica before the
    guaranteed deadline), RESUME_REFUSED (a replica refused to resume the
    hold: it is no longer held), RELEASED (a Release from elsewhere ended
    the hold). `detail` is for humans. `key` names the key whose loss
    ended the hold when the broker said (for a multi-key lock, the key lost
    first: the broker released the others), else None (the client's own
    reasons, and those that concern the whole hold, such as
    RESUMED_ELSEWHERE).
    """

    def __init__(self, reason, detail="", key=None):
        super().__init__(detail or reason, reason=reason)
        self.detail = detail
        self.key: Optional[str] = key or None

    def __str__(self):
        s = f"lock lost: {self.reason}"
        if self.key:
            s += f" (key {self.key!r})"
        return s + (f": {self.detail}" if self.detail else "")


_BY_REASON = {
    "INVALID_ARGUMENT": InvalidArgument,
    "LOCK_HELD": LockHeld,
    "LOCK_DELAY": LockDelay,
    "WAIT_TIMEOUT": WaitTimeout,
    "FOREIGN_FLAGS": Conflict,
    "LIMIT_CONFLICT": Conflict,
    "MALFORMED_SEMAPHORE": Conflict,
    "SESSION_NOT_FOUND": SessionNotFound,
    "NOT_HOLDER": NotHolder,
    "RESUME_REFUSED": ResumeRefused,
    "SESSION_LOST": SessionLost,
    "CONSUL_UNAVAILABLE": Unavailable,
    "CONSUL_PERMISSION_DENIED": PermissionDenied,
    "BROKER_SHUTTING_DOWN": Unavailable,
    "PERMISSION_DENIED": PermissionDenied,
    "UNAUTHENTICATED": Unauthenticated,
    "QUOTA_EXCEEDED": QuotaExceeded,
    "INTERNAL": Internal,
    "CONSUL_REJECTED": Rejected,
    "REPLICA_CUT_OFF": Unavailable,
}

_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ABORTED: LockHeld,
    grpc.StatusCode.DEADLINE_EXCEEDED: WaitTimeout,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.NOT_FOUND: SessionNotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def _trailer(e, key):
    try:
        md = e.trailing_metadata()
    except Exception:  # not a call object
        return None
    for k, v in md or ():
        if k == key:
            return v
    return None


def parse_status_details(raw):
    """Decodes a grpc-status-details-bin value into keyword arguments of
    LockbrokerError (reason, domain, metadata, state, retry_after,
    field_violations, quota_violations). Unknown details are skipped."""
    out = {}
    if not raw:
        return out
    try:
        status = _rpc.Status.FromString(raw)
    except Exception:
        return out
    for any_ in status.details:
        type_name = any_.type_url.rsplit("/", 1)[-1]
        try:
            if type_name == "google.rpc.ErrorInfo":
                info = _rpc.ErrorInfo.FromString(any_.value)
                out.update(reason=info.reason or None, domain=info.domain or None, metadata=dict(info.metadata))
            elif type_name == "google.rpc.RetryInfo":
                d = _rpc.RetryInfo.FromString(any_.value).retry_delay
                out["retry_after"] = d.seconds + d.nanos / 1e9
            elif type_name == "google.rpc.BadRequest":
                br = _rpc.BadRequest.FromString(any_.value)
                out["field_violations"] = [(v.field, v.description) for v in br.field_violations]
            elif type_name == "google.rpc.QuotaFailure":
                qf = _rpc.QuotaFailure.FromString(any_.value)
                out["quota_violations"] = [(v.subject, v.description) for v in qf.violations]
            elif type_name == "lockbroker.v1.LockState":
                out["state"] = State.from_proto(types_pb2.LockState.FromString(any_.value))
        except Exception:  # a detail we cannot decode is left out
            continue
    return out


def from_rpc_error(e):
    """The LockbrokerError for a grpc.RpcError (or grpc.aio.AioRpcError)."""
    if isinstance(e, LockbrokerError):
        return e
    code = e.code() if callable(getattr(e, "code", None)) else None
    message = e.details() if callable(getattr(e, "details", None)) else str(e)
    kw = parse_status_details(_trailer(e, _DETAILS_KEY))
    cls = _BY_REASON.get(kw.get("reason")) if kw.get("domain") in (None, DOMAIN) else None
    if cls is None:
        cls = _BY_CODE.get(code, Internal)
    err = cls(message or "", code=code, **kw)
    err.__cause__ = e
    return err
