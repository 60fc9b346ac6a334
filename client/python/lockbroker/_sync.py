"""The blocking client: Client, Lease and Election over grpc's threads."""

import logging
import queue
import threading
import time
import warnings
import weakref
from typing import Callable, Iterator, List, Optional, Tuple, Union

import grpc

from . import _core, errors
from ._gen.lockbroker.v1 import lock_pb2, lock_pb2_grpc, session_pb2, session_pb2_grpc
from ._types import SNAPSHOT_COMPLETE, Holder, Queued, Sequencer, State
from ._sessions import SessionInfo, session_info, session_summary

log = logging.getLogger("lockbroker")

_END = object()


class _Reader:
    """Reads one server stream on a daemon thread into a queue of
    (monotonic receive time, message | grpc.RpcError | _END), so every
    wait on it can have a bound."""

    def __init__(self, call):
        self.call = call
        self.items = queue.Queue()
        self._thread = threading.Thread(target=self._pump, name="lockbroker-stream", daemon=True)
        self._thread.start()

    def _pump(self):
        try:
            for msg in self.call:
                self.items.put((_core.now(), msg))
        except grpc.RpcError as e:
            self.items.put((_core.now(), e))
        except Exception as e:  # a bug or a closed channel: end the stream
            self.items.put((_core.now(), e))
        self.items.put((_core.now(), _END))

    def get(self, timeout):
        """The next item, or None after timeout seconds (None: no bound)."""
        try:
            return self.items.get(timeout=None if timeout is None else max(0.0, timeout))
        except queue.Empty:
            return None

    def cancel(self):
        self.call.cancel()


def _stream_error(item):
    """The LockbrokerError for a reader item that is not a message."""
    if item is _END:
        return errors.Unavailable("the broker ended the stream without a result", code=grpc.StatusCode.UNAVAILABLE)
    if isinstance(item, grpc.RpcError):
        return errors.from_rpc_error(item)
    return errors.Unavailable(f"stream failed: {item!r}", code=grpc.StatusCode.UNAVAILABLE)


class Client:
    """A lockbroker client.

    `target` is a broker address ("host:port"); `targets` lists more replicas
    of the same deployment. Holds resume on another replica by themselves
    when theirs goes away. `tls` is None (plaintext), True (system roots), a
    lockbroker.TLS or grpc.ChannelCredentials; `token` is sent as a bearer
    token on every call. `timeout` bounds every unary call (seconds).
    `trace_context`, if given, is called on the calling thread for each
    call and returns a mapping with the W3C `traceparent` (and
    `tracestate`) to send, e.g. a dict filled by OpenTelemetry's
    `propagate.inject`; the broker's span for the call is then its child.

    The client is thread-safe. Close it (or use it as a context manager)
    to release its leases and close its connections.
    """

    def __init__(self, target: str = "127.0.0.1:8700", *, targets=(), tls=None, token: Optional[str] = None,
                 timeout: float = 10.0, channel_options=(), trace_context=None):
        self.targets = _core.targets_list(target, targets)
        creds, opts = _core.channel_setup(tls)
        opts = list(opts) + list(channel_options)
        self._channels = [grpc.secure_channel(t, creds, opts) if creds else grpc.insecure_channel(t, opts)
                          for t in self.targets]
        self._locks = [lock_pb2_grpc.LockServiceStub(c) for c in self._channels]
        self._sessions = [session_pb2_grpc.SessionServiceStub(c) for c in self._channels]
        self._metadata = _core.auth_metadata(token)
        self._trace_context = trace_context
        self.timeout = timeout
        self._mu = threading.Lock()
        self._preferred = 0
        self._leases = weakref.WeakSet()
        self._closed = False

    # -- plumbing -------------------------------------------------------

    def _md(self):
        """The call's metadata: the token, and the caller's trace context."""
        return self._metadata + _core.trace_metadata(self._trace_context)

    def _order(self) -> List[int]:
        with self._mu:
            p = self._preferred
        n = len(self.targets)
        return [(p + i) % n for i in range(n)]

    def _prefer(self, i):
        with self._mu:
            self._preferred = i

    def _unary(self, service, method, request, timeout=None):
        """Calls a unary method, on the next replica while one is unreachable."""
        stubs = self._locks if service == "lock" else self._sessions
        last = None
        for i in self._order():
            try:
                resp = getattr(stubs[i], method)(request, timeout=timeout or self.timeout,
                                                 metadata=self._md())
            except grpc.RpcError as e:
                last = errors.from_rpc_error(e)
                if _core.failover_ok(last):
                    continue
                raise last from None
            self._prefer(i)
            return resp
        raise last

    # -- locks ------------------------------------------------------------

    def lock(self, key: str, *, ttl: Optional[float] = None, wait: Optional[float] = None,
             value: _core.BytesLike = b"", lock_delay: Optional[float] = None, behavior: Optional[str] = None,
             checks=(), session_name: Optional[str] = None,
             on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits until it holds the lock `key` and returns the Lease (a
        context manager: leaving the block releases it).

        ttl: the session TTL in seconds (10 s to 24 h; default 15 s).
        wait: None waits as long as it takes; 0 tries once; more waits at
        most that long, then raises WaitTimeout naming the holders.
        value: the holder's identity (bytes or str). lock_delay: Consul's
        lock-delay (0 to 60 s; default 15 s). behavior: "release" (default)
        or "delete" the key when the session is invalidated.
        on_queued: called with a Queued (its `position` in the key's
        shared queue, 1: next) each time the broker says the request
        waits, on the calling thread; it must not block. A wait that
        moves to another replica keeps its place.
        """
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay,
                                    behavior=behavior, checks=checks, session_name=session_name)
        return self._acquire(req, wait, on_queued)

    def try_lock(self, key: str, **kw) -> Optional["Lease"]:
        """lock() with wait=0: the Lease, or None when the key is busy
        (held, or inside Consul's lock-delay)."""
        kw["wait"] = 0
        try:
            return self.lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def read_lock(self, key: str, *, ttl: Optional[float] = None, wait: Optional[float] = None,
                  value: _core.BytesLike = b"", lock_delay: Optional[float] = None, behavior: Optional[str] = None,
                  checks=(), session_name: Optional[str] = None,
                  on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for a read (shared) hold of the read-write lock `key` and
        returns the Lease (lease.mode "read"). Many readers hold the key
        at once, never beside a writer. Requests are served in arrival
        order: a reader that arrives behind a waiting writer waits for the
        writer's turn, so neither readers nor writers starve.

        The key holds a read-write lock, in the broker's own Consul layout:
        a plain lock() or semaphore() on it, or a read_lock()/write_lock()
        on a plain lock or semaphore key, raises Conflict with reason
        LIMIT_CONFLICT naming the kind found (`err.state.kind`). Arguments
        as for lock()."""
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay, behavior=behavior,
                                    checks=checks, session_name=session_name, mode="read")
        return self._acquire(req, wait, on_queued)

    def write_lock(self, key: str, *, ttl: Optional[float] = None, wait: Optional[float] = None,
                   value: _core.BytesLike = b"", lock_delay: Optional[float] = None, behavior: Optional[str] = None,
                   checks=(), session_name: Optional[str] = None,
                   on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for the write (exclusive) hold of the read-write lock
        `key` and returns the Lease (lease.mode "write"): no reader or
        other writer holds the key meanwhile. Its token is above every
        token granted on the key before it, read or write. See
        read_lock(); arguments as for lock()."""
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay, behavior=behavior,
                                    checks=checks, session_name=session_name, mode="write")
        return self._acquire(req, wait, on_queued)

    def try_read_lock(self, key: str, **kw) -> Optional["Lease"]:
        """read_lock() with wait=0: the Lease, or None when a writer holds
        the key or waits for it (or it is inside Consul's lock-delay). A
        key of another kind raises Conflict."""
        kw["wait"] = 0
        try:
            return self.read_lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def try_write_lock(self, key: str, **kw) -> Optional["Lease"]:
        """write_lock() with wait=0: the Lease, or None when anyone holds
        the key. A key of another kind raises Conflict."""
        kw["wait"] = 0
        try:
            return self.write_lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def lock_all(self, keys, *, ttl: Optional[float] = None, wait: Optional[float] = None,
                 value: _core.BytesLike = b"", lock_delay: Optional[float] = None, behavior: Optional[str] = None,
                 checks=(), session_name: Optional[str] = None,
                 on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits until it holds every lock in `keys` (1 to 64 distinct
        keys) at once and returns one Lease for them all: the broker takes
        them in one Consul transaction with one session, all or nothing.
        While it waits it holds none of them; two lock_all() on
        overlapping keys never deadlock, and single-key traffic on one key
        cannot starve it (one place in every key's shared queue).

        lease.keys, lease.sequencers and lease.tokens follow the order of
        `keys` (lease.key and lease.token are the first key's). Losing any
        key ends the whole lease: the broker releases the rest and
        lease.lost_key names the key that was lost. Releasing the lease
        releases every key. Each key is an ordinary Consul lock key, so
        Consul's api.Lock excludes correctly on any of them; `value` is
        every key's value. Other arguments as for lock(); a busy try
        (wait=0) or timed-out wait names the holders of a busy key."""
        keys = _core.lock_keys(keys)
        req = _core.acquire_request(keys[0], value=value, wait=wait, ttl=ttl, lock_delay=lock_delay,
                                    behavior=behavior, checks=checks, session_name=session_name, keys=keys[1:])
        return self._acquire(req, wait, on_queued)

    def try_lock_all(self, keys, **kw) -> Optional["Lease"]:
        """lock_all() with wait=0: the Lease, or None when any of the keys
        is busy (then none is held)."""
        kw["wait"] = 0
        try:
            return self.lock_all(keys, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def semaphore(self, prefix: str, limit: int, *, ttl=None, wait=None, value: _core.BytesLike = b"",
                  lock_delay=None, behavior=None, checks=(), session_name=None, fair: bool = False,
                  on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for one of `limit` slots of the semaphore at `prefix`
        (Consul's semaphore layout) and returns the Lease. Every holder of
        a prefix must use the same limit (else Conflict). fair: admit
        waiters oldest first. Other arguments as for lock()."""
        if not isinstance(limit, int) or limit < 1:
            raise errors.InvalidArgument(f"semaphore limit must be a positive int, not {limit!r}")
        req = _core.acquire_request(prefix, value=value, limit=limit, semaphore=True, wait=wait, ttl=ttl,
                                    lock_delay=lock_delay, behavior=behavior, checks=checks,
                                    session_name=session_name, fair=fair)
        return self._acquire(req, wait, on_queued)

    def try_semaphore(self, prefix: str, limit: int, **kw) -> Optional["Lease"]:
        """semaphore() with wait=0: the Lease, or None when every slot is taken."""
        kw["wait"] = 0
        try:
            return self.semaphore(prefix, limit, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def _acquire(self, req, wait, on_queued=None):
        if self._closed:
            raise errors.Cancelled("client closed")
        # The broker enforces `wait`; the local bound only guards against
        # a broker that stops answering while we queue.
        local_end = None if wait is None else _core.now() + wait + 10.0
        place = _core.WaitPlace(req, on_queued)
        last = None
        for i in self._order():
            try:
                try:
                    lease = self._wait_at(i, place.request(), place, local_end)
                except errors.LockbrokerError as e:
                    if not place.gone(e):
                        raise
                    lease = self._wait_at(i, req, place, local_end)
            except errors.LockbrokerError as e:
                last = e
                if _core.failover_ok(e):
                    continue
                raise
            self._prefer(i)
            return lease
        raise last

    def _wait_at(self, i, sent, place, local_end):
        """Sends `sent` (place.req, or it resuming the wait) to replica i
        and waits there for the grant."""
        call = self._locks[i].Acquire(sent, metadata=self._md())
        reader = _Reader(call)
        try:
            return self._await_grant(i, place, call, reader, local_end)
        except BaseException:
            call.cancel()
            raise

    def _await_grant(self, i, place, call, reader, local_end):
        req = place.req
        silence = _core.WaitSilence(other_replicas=len(self.targets) > 1)
        while True:
            now = _core.now()
            timeout = None if local_end is None else local_end - now
            if timeout is not None and timeout <= 0:
                raise errors.WaitTimeout(f"no answer from {self.targets[i]} within the wait", reason="WAIT_TIMEOUT")
            if silence.passed(now):
                raise silence.error()
            # Wake up now and then so that Ctrl-C is seen promptly.
            wake = min(1.0, silence.at - now)
            item = reader.get(wake if timeout is None else min(timeout, wake))
            if item is None:
                continue
            t, msg = item
            # Heard only after the silence ran out: the wait moves all the same
            # (a grant that came that late is released with the cancelled call).
            if silence.passed(t):
                raise silence.error()
            if not isinstance(msg, lock_pb2.AcquireResponse):
                err = _stream_error(msg)
                if isinstance(err, errors.Busy) and err.state is None:
                    self._fill_state(err, req.key)
                raise err
            silence.heard(t, msg)
            queued = place.heard(msg)
            if queued is not None:
                _call(place.on_queued, queued, "on_queued")
            kind = msg.WhichOneof("event")
            if kind == "acquired":
                seqs = _core.grant(req, msg.acquired)
                lease = Lease(self, i, req, seqs, call, reader, t + _core.seconds(msg.acquired.guaranteed_for))
                self._leases.add(lease)
                return lease
            if kind in ("lost", "released"):
                raise _core.before_grant(msg)

    def _fill_state(self, err, key):
        """A busy answer without the LockState detail (an older broker):
        read who holds the key, so `holders` is still filled."""
        try:
            err.state = self.get_lock(key)
        except errors.LockbrokerError:
            pass

    # -- reads ------------------------------------------------------------

    def get_lock(self, key: str) -> State:
        """The state of `key` now, read consistently."""
        return State.from_proto(self._unary("lock", "GetLock", lock_pb2.GetLockRequest(key=key)).state)

    def check_sequencer(self, sequencer: Sequencer) -> bool:
        """Whether `sequencer` is still the current grant of its key."""
        resp = self._unary("lock", "CheckSequencer", lock_pb2.CheckSequencerRequest(sequencer=sequencer.to_proto()))
        return resp.current

    def watch(self, key: str, *, prefix: bool = False, retry_for: float = 15.0) -> "Watch":
        """Watches `key`: iterate the returned Watch for the state now, then
        the state after every change ("no holder" is a state: State.holders
        empty). With prefix=True, the state of every key under `key/`, then
        SNAPSHOT_COMPLETE once, then the changes. A broken stream is reopened
        (on another replica when there are several); after `retry_for`
        seconds without any replica, Unavailable is raised. close() the
        Watch (from any thread) or use it as a context manager to stop."""
        return Watch(self, lock_pb2.WatchRequest(key=key, prefix=prefix), retry_for)

    def election(self, key: str) -> "Election":
        """Leader election on `key` (see Election): the same object in every
        lockbroker library (Go's Client.Election, Node's and Java's
        election(key))."""
        return Election(self, key)

    def leader(self, key: str) -> "Election":
        """Deprecated: use election(key). (In the Go and Java libraries
        leader(key) read the holder; election(key) is the name all share.)"""
        warnings.warn("lockbroker: Client.leader(key) is deprecated; use Client.election(key)",
                      DeprecationWarning, stacklevel=2)
        return Election(self, key)

    # -- client-owned sessions ---------------------------------------------

    def create_session(self, *, ttl=None, lock_delay=None, behavior=None, checks=(), name=None) -> SessionInfo:
        """Creates a client-owned session: the client renews it within its
        TTL (renew_session) and ends it (destroy_session)."""
        req = _core.session_request(ttl, lock_delay, behavior, checks, name)
        return session_info(self._unary("session", "CreateSession", req).session)

    def renew_session(self, session_id: str) -> float:
        """Renews a session; returns how long it is guaranteed from now."""
        resp = self._unary("session", "RenewSession", session_pb2.RenewSessionRequest(session_id=session_id))
        return _core.seconds(resp.guaranteed_for)

    def destroy_session(self, session_id: str) -> None:
        """Destroys a session (Consul releases what it holds)."""
        self._unary("session", "DestroySession", session_pb2.DestroySessionRequest(session_id=session_id))

    def get_session(self, session_id: str) -> SessionInfo:
        return session_info(self._unary("session", "GetSession",
                                        session_pb2.GetSessionRequest(session_id=session_id)).session)

    def list_sessions(self):
        """The broker's sessions with what each holds (SessionSummary list)."""
        resp = self._unary("session", "ListSessions", session_pb2.ListSessionsRequest())
        return [session_summary(s) for s in resp.sessions]

    def try_acquire(self, key: str, session_id: str, *, value: _core.BytesLike = b"", limit: int = 0,
                    semaphore: bool = False, mode: Optional[str] = None) -> Optional[Sequencer]:
        """Takes `key` now for a client-owned session (TryAcquire): the
        Sequencer, or None when the key is busy. The hold lasts until
        release() or the session ends. mode "read" or "write" takes a
        read-write lock's read or write hold instead of a lock."""
        req = lock_pb2.TryAcquireRequest(
            key=key, session_id=session_id, value=_core.as_bytes(value), limit=limit,
            kind=_core.acquire_kind(semaphore, mode))
        try:
            return Sequencer.from_proto(self._unary("lock", "TryAcquire", req).sequencer)
        except (errors.LockHeld, errors.LockDelay):
            return None

    def release(self, key: str, session_id: str, token: int = 0) -> bool:
        """Releases `key` held by `session_id`; with a token, only while
        that grant is current. True if it was held, False if already free
        (or the token's grant ended). The token is required when the broker
        made the session (an Acquire without session_id)."""
        req = lock_pb2.ReleaseRequest(key=key, session_id=session_id, token=token)
        return self._unary("lock", "Release", req).released

    # -- lifetime ---------------------------------------------------------

    def close(self) -> None:
        """Releases this client's leases and closes its connections."""
        self._closed = True
        for lease in list(self._leases):
            try:
                lease.release(timeout=2.0)
            except Exception:  # closing anyway
                log.debug("release on close failed", exc_info=True)
        for c in self._channels:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Watch:
    """The states of a watched key (see Client.watch). Iterate it; close()
    stops it from any thread (the iteration then ends)."""

    def __init__(self, client: Client, req, retry_for: float):
        self._client = client
        self._req = req
        self._retry_for = retry_for
        self._mu = threading.Lock()
        self._call = None
        self._closed = False
        self._gen = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> Union[State, object]:
        return next(self._gen)

    def close(self) -> None:
        with self._mu:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _open(self, i):
        with self._mu:
            if self._closed or self._client._closed:
                return None
            self._call = self._client._locks[i].Watch(self._req, metadata=self._client._md())
            return self._call

    def _run(self):
        client = self._client
        failing_since = None
        backoff = 0.1
        while True:
            for i in client._order():
                call = self._open(i)
                if call is None:
                    return
                try:
                    for resp in call:
                        failing_since, backoff = None, 0.1
                        client._prefer(i)
                        if resp.snapshot_complete:
                            yield SNAPSHOT_COMPLETE
                        if resp.HasField("state"):
                            yield State.from_proto(resp.state)
                except grpc.RpcError as e:
                    if self._closed or client._closed:  # closed by us: end quietly
                        return
                    err = errors.from_rpc_error(e)
                    if not _core.failover_ok(err):
                        raise err from None
                finally:
                    call.cancel()
                if self._closed:
                    return
            if failing_since is None:
                failing_since = _core.now()
            if _core.now() - failing_since > self._retry_for:
                raise errors.Unavailable(f"no broker replica answered Watch({self._req.key!r}) for "
                                         f"{self._retry_for:g}s", code=grpc.StatusCode.UNAVAILABLE)
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


_RELEASED = object()  # follow/resume outcome: released by this client


class Lease:
    """A held lock, semaphore slot, read-write lock hold, or set of locks
    taken as one (lock_all).

    The hold is kept alive by the broker while the lease is open; the
    library watches its deadline: every `acquired`/`keepalive` event says
    how long the hold is guaranteed, and if no further word arrives (the
    broker replica stopped or is unreachable) the lease tries the other
    replicas and, if none takes it over in time, reports the loss before
    the deadline. A lease can be lost at any moment: pass `token` to what
    you protect, and call check() before acting.

    `mode` says what it holds: "lock", "semaphore", "read" or "write" (a
    read-write lock's shared or exclusive hold). A lock_all() lease holds
    several keys: `keys`, `sequencers` and `tokens` have one entry per key
    in the order asked for; `key`, `sequencer` and `token` are the first
    key's. After a loss, `lost_key` names the key whose loss ended it.
    """

    def __init__(self, client: Client, replica: int, req, seqs, call, reader, deadline: float):
        self._client = client
        self._req = req
        self.key: str = req.key
        self.value: bytes = req.value
        #: One Sequencer per key, in the order asked for.
        self.sequencers: Tuple[Sequencer, ...] = tuple(seqs)
        self.sequencer: Sequencer = self.sequencers[0]
        #: "lock", "semaphore", "read" or "write".
        self.mode: str = _core.lease_mode(req)
        self._mu = threading.Lock()
        self._replica = replica
        self._call = call
        self._deadline = deadline
        self._releasing = False
        self._released = False
        self._error: Optional[errors.LockLost] = None
        self._callbacks: List[Callable[[errors.LockLost], None]] = []
        #: Set when the lease is lost (not when this client releases it).
        self.lost = threading.Event()
        self._done = threading.Event()
        self._wake = threading.Event()
        self.resumes = 0
        self._thread = threading.Thread(target=self._run, args=(reader,), name=f"lockbroker-lease {self.key}",
                                        daemon=True)
        self._thread.start()

    # -- public -----------------------------------------------------------

    @property
    def token(self) -> int:
        """The fencing token of this grant."""
        return self.sequencer.token

    @property
    def keys(self) -> Tuple[str, ...]:
        """Every key the lease holds, in the order asked for (one for all
        but lock_all())."""
        return tuple(s.key for s in self.sequencers)

    @property
    def tokens(self) -> Tuple[int, ...]:
        """The fencing token of each key, in the order of `keys`."""
        return tuple(s.token for s in self.sequencers)

    @property
    def session_id(self) -> str:
        return self.sequencer.session_id

    @property
    def lost_key(self) -> Optional[str]:
        """Once lost, the key whose loss ended the lease when the broker
        named it (for lock_all(), the key lost first: the others were
        released); None while held, and for losses that concern the whole
        hold (KEEPALIVE_TIMEOUT, RESUME_REFUSED, RELEASED,
        RESUMED_ELSEWHERE)."""
        with self._mu:
            return self._error.key if self._error is not None else None

    @property
    def deadline(self) -> float:
        """time.monotonic() value until which the hold is guaranteed, as of
        the last word from the broker."""
        with self._mu:
            return self._deadline

    @property
    def target(self) -> str:
        """The broker replica that holds the lease now."""
        with self._mu:
            return self._client.targets[self._replica]

    @property
    def error(self) -> Optional[errors.LockLost]:
        """The LockLost once lost, else None."""
        with self._mu:
            return self._error

    @property
    def released(self) -> bool:
        with self._mu:
            return self._released

    def check(self) -> None:
        """Raises LockLost unless the hold is still guaranteed now."""
        with self._mu:
            err, released, give_up = self._error, self._released, self._deadline - _core.CLIENT_MARGIN
        if err is not None:
            raise err
        if released:
            raise errors.LockLost("RELEASED", "released by this client")
        if _core.now() >= give_up:
            raise errors.LockLost("KEEPALIVE_TIMEOUT", "no keepalive from the broker before the guaranteed deadline")

    def on_lost(self, callback: Callable[[errors.LockLost], None]) -> None:
        """Calls callback(LockLost) once when the lease is lost (at once if
        it already is), on the lease's thread. Not called after release()."""
        with self._mu:
            err = self._error
            if err is None:
                self._callbacks.append(callback)
                return
        _call(callback, err)

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[errors.LockLost]:
        """Blocks until the lease is lost (or timeout); returns the LockLost or None."""
        self.lost.wait(timeout)
        return self.error

    def set_value(self, value: _core.BytesLike) -> None:
        """Changes the holder's value; the sequencer stays the same."""
        self.check()
        req = lock_pb2.SetValueRequest(key=self.key, session_id=self.session_id, value=_core.as_bytes(value),
                                       token=self.token)
        self._client._unary("lock", "SetValue", req)
        self.value = req.value

    def release(self, timeout: float = 10.0) -> bool:
        """Gives the hold up and waits (at most timeout seconds) until the
        broker has released it. True if this call released it; False if it
        was already lost or released."""
        with self._mu:
            if self._error is not None or self._released or self._releasing:
                return False
            self._releasing = True
            call = self._call
        end = _core.now() + timeout
        req = lock_pb2.ReleaseRequest(key=self.key, session_id=self.session_id, token=self.token)
        released = True
        try:
            released = self._client._unary("lock", "Release", req,
                                           timeout=max(0.1, min(timeout, self._client.timeout))).released
        except errors.NotHolder:  # another grant holds it now: not ours to release
            released = False
            call.cancel()
        except errors.LockbrokerError as e:
            # Closing the stream releases a broker-owned session too.
            log.debug("Release of %s failed (%s); closing the stream", self.key, e)
            call.cancel()
        self._wake.set()
        if not self._done.wait(max(0.0, end - _core.now())):
            with self._mu:
                call = self._call
            call.cancel()
            self._done.wait(1.0)
        with self._mu:
            self._released = self._error is None
        return released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "lost" if self.lost.is_set() else "released" if self.released else "held"
        keys = repr(self.key) if len(self.sequencers) == 1 else repr(list(self.keys))
        mode = "" if self.mode == "lock" else f" {self.mode}"
        return f"<lockbroker.Lease {keys}{mode} token={self.token} {state}>"

    # -- the lease's thread ---------------------------------------------------

    def _give_up_at(self):
        with self._mu:
            return self._deadline - _core.CLIENT_MARGIN

    def _run(self, reader):
        try:
            while True:
                outcome = self._follow(reader)
                if outcome is None:
                    reader = self._resume()
                    if reader is not None:
                        continue
                    return
                self._finish(outcome)
                return
        except Exception as e:  # a bug: never leave a lease looking held
            log.exception("lease thread failed")
            self._finish(errors.LockLost("KEEPALIVE_TIMEOUT", f"client error: {e!r}"))
        finally:
            self._done.set()

    def _stall_at(self, last_word, guaranteed):
        if len(self._client.targets) < 2:
            return float("inf")
        return last_word + _core.STALL_SHARE * guaranteed

    def _follow(self, reader):
        """Reads the stream until the lease ends (returns LockLost or
        _RELEASED) or should move (returns None: broken stream, broker
        shutting down, or a silent replica with others to try)."""
        with self._mu:
            guaranteed = self._deadline - _core.now()
        stall_at = self._stall_at(_core.now(), guaranteed)
        while True:
            give_up = self._give_up_at()
            t = _core.now()
            if t >= give_up:
                return errors.LockLost("KEEPALIVE_TIMEOUT",
                                       "no keepalive from the broker before the guaranteed deadline")
            if t >= stall_at:
                return None
            item = reader.get(min(give_up, stall_at) - t)
            if item is None:
                continue
            t, msg = item
            if not isinstance(msg, lock_pb2.AcquireResponse):
                with self._mu:
                    if self._releasing:
                        return _RELEASED
                if isinstance(msg, grpc.RpcError):
                    log.info("lease %s: stream to %s broke (%s); resuming", self.key, self.target,
                             errors.from_rpc_error(msg))
                return None
            kind = msg.WhichOneof("event")
            if kind == "keepalive":
                g = _core.seconds(msg.keepalive.guaranteed_for)
                with self._mu:
                    self._deadline = t + g
                stall_at = self._stall_at(t, g)
            elif kind == "released":
                with self._mu:
                    if self._releasing:
                        return _RELEASED
                return errors.LockLost("RELEASED", "released through the Release call from elsewhere")
            elif kind == "lost":
                reason = _core.lost_reason_name(msg.lost.reason)
                if reason in _core.RESUME_REASONS:
                    log.info("lease %s: %s %s; resuming", self.key, self.target, _core.RESUME_REASONS[reason])
                    if msg.lost.HasField("guaranteed_for"):  # the drain (or the last renewal) may end before the TTL would
                        with self._mu:
                            self._deadline = min(self._deadline, t + _core.seconds(msg.lost.guaranteed_for))
                    return None
                return errors.LockLost(reason, msg.lost.detail, key=msg.lost.key)

    def _resume(self):
        """Re-attaches the hold on the replicas in turn until it works (the
        new reader), the hold is refused or the deadline passes (None,
        after finishing the lease)."""
        client = self._client
        n = len(client.targets)
        with self._mu:
            old_call = self._call
            start = self._replica
        req = _core.resume_request(self._req, self.sequencer)
        attempt = 0
        while True:
            with self._mu:
                releasing = self._releasing
            if releasing:
                old_call.cancel()
                self._finish(_RELEASED)
                return None
            remaining = self._give_up_at() - _core.now()
            if remaining <= 0:
                old_call.cancel()
                self._finish(errors.LockLost(
                    "KEEPALIVE_TIMEOUT", "no broker replica could resume the hold before its guaranteed deadline"))
                return None
            attempt += 1
            i = (start + attempt) % n
            call = client._locks[i].Acquire(req, metadata=client._md())
            reader = _Reader(call)
            bound = _core.now() + min(remaining, _core.RESUME_ATTEMPT)
            result = self._await_resume(reader, bound)
            if isinstance(result, float):  # acquired: result is the new deadline
                with self._mu:
                    self._call, self._replica, self._deadline = call, i, result
                    self.resumes += 1
                    releasing = self._releasing
                old_call.cancel()
                log.info("lease %s: resumed on %s", self.key, client.targets[i])
                if releasing:  # release() began meanwhile and used the old call
                    call.cancel()
                return reader
            call.cancel()
            if isinstance(result, errors.LockLost):
                old_call.cancel()
                self._finish(result)
                return None
            log.debug("lease %s: resume on %s failed: %s", self.key, client.targets[i], result)
            if attempt % n == 0:
                self._wake.wait(min(0.2, max(0.0, self._give_up_at() - _core.now())))
                self._wake.clear()

    def _await_resume(self, reader, bound):
        """The new deadline (float) once `acquired` comes with the same
        grant; a LockLost when the hold is gone; else the error."""
        while True:
            left = min(bound, self._give_up_at()) - _core.now()
            if left <= 0:
                return errors.Unavailable("resume attempt timed out")
            item = reader.get(left)
            if item is None:
                continue
            t, msg = item
            if not isinstance(msg, lock_pb2.AcquireResponse):
                err = _stream_error(msg)
                if _core.resume_refused(err):
                    return errors.LockLost("RESUME_REFUSED", f"resume refused: {err}")
                return err
            kind = msg.WhichOneof("event")
            if kind == "acquired":
                seq = msg.acquired.sequencer
                tokens = tuple(s.token for s in msg.acquired.sequencers)
                if seq.token != self.token or seq.session_id != self.session_id or (tokens and tokens != self.tokens):
                    return errors.LockLost("RESUME_REFUSED", f"resume returned another grant (token {seq.token})")
                return t + _core.seconds(msg.acquired.guaranteed_for)
            if kind == "lost":
                return errors.LockLost(_core.lost_reason_name(msg.lost.reason), msg.lost.detail, key=msg.lost.key)

    def _finish(self, outcome):
        with self._mu:
            if self._error is not None or self._released:
                return
            if self._releasing:  # whatever ended it, this client let it go
                outcome = _RELEASED
            call = self._call
            if outcome is _RELEASED:
                self._released = True
                callbacks = []
            else:
                self._error = outcome
                callbacks, self._callbacks = self._callbacks, []
        call.cancel()
        if outcome is _RELEASED:
            return
        log.warning("lease %s (token %d) lost: %s", self.key, self.token, outcome)
        self.lost.set()
        for cb in callbacks:
            _call(cb, outcome)


def _call(cb, arg, what="on_lost"):
    try:
        cb(arg)
    except Exception:
        log.exception("%s callback failed", what)


class Election:
    """Leader election on one key (etcd's concurrency.Election shape; the
    same object in the Go, Node and Java libraries).

    campaign() blocks until this process leads and returns the Lease (its
    value is the leader's identity); resign() gives the leadership up;
    proclaim() changes the leader's value (same token); leader() says who
    leads now; observe() yields the leader (a Holder) or None after every
    change of leadership.
    """

    def __init__(self, client: Client, key: str):
        self.client = client
        self.key = key
        self._lease: Optional[Lease] = None

    def campaign(self, value: _core.BytesLike, **kw) -> Lease:
        lease = self.client.lock(self.key, value=value, **kw)
        self._lease = lease
        return lease

    def resign(self, timeout: float = 10.0) -> bool:
        """Gives the leadership from the last campaign() up. True if this
        call released it; False without a leadership (none, lost, or
        resigned already)."""
        lease, self._lease = self._lease, None
        return lease.release(timeout) if lease is not None else False

    def proclaim(self, value: _core.BytesLike) -> None:
        """Changes the leader's value without giving the leadership up.
        Raises NotLeader without a leadership, LockLost once it is lost."""
        if self._lease is None:
            raise errors.NotLeader("not the leader of %s: campaign() first" % self.key)
        self._lease.set_value(value)

    def leader(self) -> Optional[Holder]:
        return self.client.get_lock(self.key).holder

    def observe(self, **kw) -> Iterator[Optional[Holder]]:
        last = object()
        for state in self.client.watch(self.key, **kw):
            h = state.holder
            ident = (h.session_id, h.value) if h else None
            if ident != last:
                last = ident
                yield h
