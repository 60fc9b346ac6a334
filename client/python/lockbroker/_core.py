"""What the blocking and the asyncio clients share: request building,
channel options, event decoding and the lease's timing rules."""

import re
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2

from . import errors
from ._gen.lockbroker.v1 import lock_pb2, session_pb2, types_pb2
from ._types import Queued, Sequencer

#: How long before the guaranteed deadline the client gives a lease up
#: when no broker replica is heard from, so that the loss is reported
#: while the hold is still guaranteed (the Go client uses the same).
CLIENT_MARGIN = 0.25

#: A lease whose stream stays silent for this share of its guaranteed time
#: is taken to be on a stalled replica: with other replicas configured the
#: client resumes the hold on one of them (the broker renews every TTL/3,
#: so a healthy stream speaks at about a third).
STALL_SHARE = 0.6

#: Longest single resume attempt on one replica (a stopped replica accepts
#: the TCP connection and never answers).
RESUME_ATTEMPT = 3.0

#: A waiting Acquire stream that hears nothing for this many of its
#: broker's heartbeats (AcquireQueued.heartbeat) is taken to be on a
#: stalled replica: with other replicas configured the wait moves to the
#: next one (the Go client uses the same).
WAIT_STALL_BEATS = 3

_LOST_PREFIX = "LOST_REASON_"
_BEHAVIORS = {None: 0, "release": types_pb2.SESSION_BEHAVIOR_RELEASE, "delete": types_pb2.SESSION_BEHAVIOR_DELETE}

BytesLike = Union[bytes, bytearray, memoryview, str]


def now():
    return time.monotonic()


def as_bytes(value: Optional[BytesLike]) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def duration(seconds: Optional[float]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    if seconds < 0:
        raise errors.InvalidArgument(f"negative duration {seconds!r}")
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


def seconds(d) -> float:
    return d.seconds + d.nanos / 1e9


def session_options(ttl=None, lock_delay=None, behavior=None, checks=(), session_name=None):
    if behavior not in _BEHAVIORS:
        raise errors.InvalidArgument(f"behavior must be 'release' or 'delete', not {behavior!r}")
    opts = types_pb2.SessionOptions(behavior=_BEHAVIORS[behavior], checks=list(checks or ()),
                                    name=session_name or "")
    if ttl is not None:
        opts.ttl.CopyFrom(duration(ttl))
    if lock_delay is not None:
        opts.lock_delay.CopyFrom(duration(lock_delay))
    return opts


#: AcquireRequest.kind by mode: a plain lock, a read-write lock's read
#: (shared) or write (exclusive) hold.
_MODES = {None: lock_pb2.ACQUIRE_KIND_LOCK, "read": lock_pb2.ACQUIRE_KIND_READ,
          "write": lock_pb2.ACQUIRE_KIND_WRITE}

#: The most keys one multi-key lock takes (AcquireRequest.key and 63 keys).
MAX_KEYS = 64


def acquire_request(key, *, value=None, limit=0, semaphore=False, wait=None, ttl=None, lock_delay=None,
                    behavior=None, checks=(), session_name=None, fair=False, mode=None, keys=()):
    """The AcquireRequest for a lock (semaphore False) or semaphore slot;
    mode "read" or "write" asks for a read-write lock's hold instead of a
    plain lock, and `keys` are more lock keys taken with `key` as one."""
    req = lock_pb2.AcquireRequest(
        key=key, value=as_bytes(value), limit=limit, fair=fair, keys=list(keys), kind=acquire_kind(semaphore, mode),
        new_session=session_options(ttl, lock_delay, behavior, checks, session_name),
    )
    if wait is not None:
        req.wait_timeout.CopyFrom(duration(wait))
    return req


def acquire_kind(semaphore=False, mode=None):
    """AcquireRequest.kind for a semaphore slot, or a lock of `mode` (None:
    a plain lock; "read" or "write": a read-write lock's hold)."""
    if mode not in _MODES:
        raise errors.InvalidArgument(f"mode must be 'read' or 'write', not {mode!r}")
    if semaphore and mode is not None:
        raise errors.InvalidArgument("a semaphore slot has no read or write mode")
    return lock_pb2.ACQUIRE_KIND_SEMAPHORE if semaphore else _MODES[mode]


def lock_keys(keys) -> list:
    """The keys of a multi-key lock, checked before any call: a list (or
    other iterable) of 1 to MAX_KEYS distinct strings, in the order given."""
    if isinstance(keys, (str, bytes, bytearray)):
        raise errors.InvalidArgument(f"lock_all takes a list of keys, not the single key {keys!r}",
                                     field_violations=[("keys", "a list of keys, not a string")])
    try:
        out = list(keys)
    except TypeError:
        raise errors.InvalidArgument(f"lock_all takes a list of keys, not {type(keys).__name__}",
                                     field_violations=[("keys", "not a list")]) from None
    if not out:
        raise errors.InvalidArgument("lock_all needs at least one key", field_violations=[("keys", "empty")])
    if len(out) > MAX_KEYS:
        raise errors.InvalidArgument(f"lock_all takes at most {MAX_KEYS} keys, not {len(out)}",
                                     field_violations=[("keys", f"more than {MAX_KEYS} keys")])
    seen = set()
    for k in out:
        if not isinstance(k, str):
            raise errors.InvalidArgument(f"lock_all keys must be strings, not {type(k).__name__}",
                                         field_violations=[("keys", "not a string")])
        if k in seen:
            raise errors.InvalidArgument(f"lock_all key {k!r} is given twice",
                                         field_violations=[("keys", f"{k!r} given twice")])
        seen.add(k)
    return out


def lease_mode(req) -> str:
    """What a request holds once granted: "lock", "semaphore", "read" or "write"."""
    return {lock_pb2.ACQUIRE_KIND_SEMAPHORE: "semaphore", lock_pb2.ACQUIRE_KIND_READ: "read",
            lock_pb2.ACQUIRE_KIND_WRITE: "write"}.get(req.kind, "lock")


def resume_request(req, seq: Sequencer):
    r = lock_pb2.AcquireRequest()
    r.CopyFrom(req)
    r.resume.CopyFrom(seq.to_proto())
    return r


# The `lost` reasons that end a stream, not the hold: the lease resumes on
# another replica before guaranteed_for runs out. By reason, what the log
# says of the replica.
RESUME_REASONS = {
    "BROKER_SHUTDOWN": "is shutting down",
    "REPLICA_CUT_OFF": "is cut off from Consul",
}


def lost_reason_name(value) -> str:
    try:
        name = lock_pb2.LostReason.Name(value)
    except ValueError:
        return "UNSPECIFIED"
    return name[len(_LOST_PREFIX):] if name.startswith(_LOST_PREFIX) else name


def before_grant(msg) -> errors.SessionLost:
    """The error for a stream that says `lost` (or `released`) instead of
    `acquired`: a grant the broker could not announce safely. It names the
    broker's reason and detail."""
    kind = msg.WhichOneof("event")
    text = f"the stream ended with {kind} before the grant"
    if kind == "lost":
        text += f": {lost_reason_name(msg.lost.reason)}: {msg.lost.detail}"
    return errors.SessionLost(text, reason="SESSION_LOST")


class WaitSilence:
    """Whether a waiting Acquire stream has been silent too long.

    A waiter hears from its replica only when the key's holders change, so
    the broker repeats `queued` every `heartbeat` while nothing changes: a
    stopped replica keeps its connection open and says nothing at all.
    After WAIT_STALL_BEATS heartbeats without a word the wait fails as
    Unavailable, which moves it to the next replica as a broken stream
    does. `at` is when the silence runs out: never (inf) without other
    replicas to move to, or before a heartbeat is announced (a broker
    without heartbeats: its silence tells nothing)."""

    def __init__(self, other_replicas: bool):
        self.other_replicas = other_replicas
        self.every = 0.0  # the last heartbeat announced
        self.at = float("inf")

    def heard(self, t: float, msg) -> None:
        """Restarts the count at t, when msg (any event) was received."""
        if not self.other_replicas:
            return
        if msg.WhichOneof("event") == "queued" and msg.queued.HasField("heartbeat"):
            self.every = seconds(msg.queued.heartbeat)
        if self.every > 0:
            self.at = t + WAIT_STALL_BEATS * self.every

    def passed(self, t: float) -> bool:
        return t >= self.at

    def error(self) -> errors.Unavailable:
        return errors.Unavailable(f"the replica was silent for {WAIT_STALL_BEATS} heartbeats of {self.every:g}s "
                                  "while the request waited", code=grpc.StatusCode.UNAVAILABLE)


class WaitPlace:
    """A waiting request's place in its key's shared queue, carried from
    replica to replica as the Go client does (client/lease.go openAt).

    `queued` names the session the request waits with. When the wait
    moves (its stream failed Unavailable, or its replica went silent),
    the request on the next replica resumes the wait with that session
    and no token (AcquireRequest.resume), so it keeps its place; when the
    broker answers that the place is gone (FAILED_PRECONDITION or
    NOT_FOUND: the session ended), the original request waits anew on
    the same replica. A request that names its own session_id keeps
    sending it. `on_queued(Queued)` hears every `queued`."""

    def __init__(self, req, on_queued=None):
        self.req = req
        self.on_queued = on_queued
        self.session_id = ""
        self.resuming = False  # the last request() resumed the wait

    def request(self):
        """The request to send to the next replica."""
        self.resuming = bool(self.session_id) and self.req.WhichOneof("session") != "session_id"
        if not self.resuming:
            return self.req
        r = lock_pb2.AcquireRequest()
        r.CopyFrom(self.req)
        r.resume.CopyFrom(types_pb2.Sequencer(key=self.req.key, session_id=self.session_id))
        return r

    def gone(self, err: errors.LockbrokerError) -> bool:
        """Whether err refuses a resumed wait because its place is gone:
        the original request is to be sent instead."""
        if not self.resuming or err.code not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            return False
        self.resuming = False
        self.session_id = ""
        return True

    def heard(self, msg) -> Optional[Queued]:
        """Notes the session of a `queued` msg; its Queued for on_queued
        (None for other events, or without a callback)."""
        if msg.WhichOneof("event") != "queued":
            return None
        if msg.queued.session_id:
            self.session_id = msg.queued.session_id
        if self.on_queued is None:
            return None
        return Queued.from_proto(msg.queued)


def grant(req, acquired) -> Tuple[Sequencer, ...]:
    """The sequencers of an `acquired` event for req, one per key in the
    request's order. Raises Unimplemented when the grant is not what was
    asked for, which means the broker ignored a field it does not know (an
    older broker): a one-slot semaphore granted as a lock, a read or write
    hold granted as a plain lock, or only the first key of a multi-key lock
    (the caller then ends the stream, which lets that key go)."""
    seq = Sequencer.from_proto(acquired.sequencer)
    if req.kind == lock_pb2.ACQUIRE_KIND_SEMAPHORE and seq.kind != "semaphore":
        raise errors.Unimplemented(
            f"the broker granted a {seq.kind} for a semaphore request on {seq.key!r}: "
            "it does not support AcquireRequest.kind (one-slot semaphores)")
    if req.kind in (lock_pb2.ACQUIRE_KIND_READ, lock_pb2.ACQUIRE_KIND_WRITE):
        read = req.kind == lock_pb2.ACQUIRE_KIND_READ
        if seq.kind != "rwlock" or seq.read != read:
            got = f"{'read' if seq.read else 'write'} hold" if seq.kind == "rwlock" else seq.kind
            raise errors.Unimplemented(
                f"the broker granted a {got} for a {'read' if read else 'write'} request on {seq.key!r}: "
                "it does not support read-write locks (AcquireRequest.kind READ and WRITE)")
    if not req.keys:
        return (seq,)
    seqs = tuple(Sequencer.from_proto(s) for s in acquired.sequencers)
    want = [req.key, *req.keys]
    if [s.key for s in seqs] != want or any(s.session_id != seq.session_id for s in seqs) or seqs[0].token != seq.token:
        raise errors.Unimplemented(
            f"the broker granted {[s.key for s in seqs] or [seq.key]} for a multi-key request on {want}: "
            "it does not support multi-key locks (AcquireRequest.keys)")
    return seqs


@dataclass
class TLS:
    """TLS settings for the broker connection.

    ca: PEM bundle (bytes) or path of the CA that signed the broker's
    certificate (None: the system roots). cert and key: the client's PEM
    certificate and key (bytes or paths) for mTLS. server_name: the name to
    check in the broker's certificate when it differs from the target's
    host.
    """

    ca: Optional[Union[bytes, str]] = None
    cert: Optional[Union[bytes, str]] = None
    key: Optional[Union[bytes, str]] = None
    server_name: Optional[str] = None

    def credentials(self):
        return grpc.ssl_channel_credentials(root_certificates=_pem(self.ca), private_key=_pem(self.key),
                                            certificate_chain=_pem(self.cert))


def _pem(v):
    if v is None or isinstance(v, bytes):
        return v
    with open(v, "rb") as f:
        return f.read()


#: HTTP/2 keepalive: a connection whose peer stops answering pings (a
#: stopped or vanished replica) is closed after about 15 s, so a waiting
#: Acquire or a Watch fails over instead of hanging. The broker permits
#: client pings every 5 s or more.
KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_time_between_pings_ms", 10_000),
)


def channel_setup(tls) -> Tuple[Optional[grpc.ChannelCredentials], Sequence[Tuple[str, object]]]:
    """(credentials or None for plaintext, channel options) for `tls`:
    None/False (plaintext), True (system roots), a TLS, or
    grpc.ChannelCredentials."""
    opts = list(KEEPALIVE_OPTIONS)
    if tls is None or tls is False:
        return None, opts
    if tls is True:
        return grpc.ssl_channel_credentials(), opts
    if isinstance(tls, TLS):
        if tls.server_name:
            opts.append(("grpc.ssl_target_name_override", tls.server_name))
        return tls.credentials(), opts
    if isinstance(tls, grpc.ChannelCredentials):
        return tls, opts
    raise TypeError(f"tls must be None, True, lockbroker.TLS or grpc.ChannelCredentials, not {type(tls).__name__}")


def auth_metadata(token):
    return (("authorization", f"Bearer {token}"),) if token else ()


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def trace_metadata(trace_context):
    """The W3C trace context headers to send with a call: `traceparent`
    (and `tracestate`) from the mapping trace_context() returns, e.g. a
    carrier filled by opentelemetry.propagate.inject. Nothing when
    trace_context is None, returns no valid traceparent, or raises."""
    if trace_context is None:
        return ()
    try:
        carrier = trace_context() or {}
        tp = carrier.get("traceparent")
        ts = carrier.get("tracestate")
    except Exception:  # the caller's tracing must never fail a lock call
        return ()
    if not isinstance(tp, str) or not _TRACEPARENT.match(tp):
        return ()
    out = (("traceparent", tp),)
    if isinstance(ts, str) and ts and len(ts) <= 512:
        out += (("tracestate", ts),)
    return out


def targets_list(target, targets):
    out = []
    for t in (target, *(targets or ())):
        if t and t not in out:
            out.append(t)
    if not out:
        raise ValueError("no broker target")
    return out


def failover_ok(err: errors.LockbrokerError) -> bool:
    """Whether another replica may succeed where this one failed: the
    replica is unreachable or shutting down, not Consul."""
    return isinstance(err, errors.Unavailable) and err.reason != "CONSUL_UNAVAILABLE"


def resume_refused(err: errors.LockbrokerError) -> bool:
    """A resume answer that means the hold is gone (do not try elsewhere)."""
    return err.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED)


def session_request(ttl=None, lock_delay=None, behavior=None, checks=(), name=None):
    return session_pb2.CreateSessionRequest(options=session_options(ttl, lock_delay, behavior, checks, name))
