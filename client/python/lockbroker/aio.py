"""lockbroker for asyncio, over grpc.aio: the same API as lockbroker.Client
with coroutines.

    from lockbroker import aio

    async with aio.Client("127.0.0.1:8700", targets=[...]) as client:
        async with client.lock("jobs/nightly", ttl=15, wait=30) as lease:
            await do_work(fencing_token=lease.token)
            lease.check()
        lease = await client.read_lock("config/routes")   # or: await, release() later

`lease.lost` is an asyncio.Event; on_lost callbacks run on the event loop
(a coroutine function is scheduled as a task). Create the client inside
the event loop that uses it.
"""

import asyncio
import functools
import inspect
import logging
import warnings
import weakref
from typing import Callable, List, Optional, Tuple, Union

import grpc
import grpc.aio

from . import _core, errors
from ._gen.lockbroker.v1 import lock_pb2, lock_pb2_grpc, session_pb2, session_pb2_grpc
from ._sessions import SessionInfo, session_info, session_summary
from ._types import SNAPSHOT_COMPLETE, Holder, Queued, Sequencer, State

log = logging.getLogger("lockbroker")

_END = object()
_RELEASED = object()


class _Reader:
    """Reads one server stream in a task into a queue of (monotonic
    receive time, message | grpc.RpcError | _END)."""

    def __init__(self, call):
        self.call = call
        self.items = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self):
        try:
            while True:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    break
                self.items.put_nowait((_core.now(), msg))
        except asyncio.CancelledError:
            self.items.put_nowait((_core.now(), errors.Cancelled("stream cancelled")))
        except grpc.RpcError as e:
            self.items.put_nowait((_core.now(), e))
        except Exception as e:  # a bug or a closed channel: end the stream
            self.items.put_nowait((_core.now(), e))
        self.items.put_nowait((_core.now(), _END))

    async def get(self, timeout):
        """The next item, or None after timeout seconds (None: no bound)."""
        try:
            if timeout is None:
                return await self.items.get()
            if timeout <= 0 and self.items.empty():
                return None
            return await asyncio.wait_for(self.items.get(), max(0.0, timeout))
        except asyncio.TimeoutError:
            return None

    def cancel(self):
        self.call.cancel()


def _stream_error(item):
    if item is _END:
        return errors.Unavailable("the broker ended the stream without a result", code=grpc.StatusCode.UNAVAILABLE)
    if isinstance(item, grpc.RpcError):
        return errors.from_rpc_error(item)
    if isinstance(item, errors.LockbrokerError):
        return item
    return errors.Unavailable(f"stream failed: {item!r}", code=grpc.StatusCode.UNAVAILABLE)


class Acquiring:
    """What lock(), semaphore(), read_lock(), write_lock() and lock_all()
    return: await it for the Lease, or enter it directly with `async with`
    (the Lease is released when the block ends):

        lease = await client.read_lock("k")
        async with client.read_lock("k") as lease: ...
    """

    __slots__ = ("_coro", "_lease")

    def __init__(self, coro):
        self._coro = coro
        self._lease = None

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self) -> "Lease":
        self._lease = await self._coro
        return self._lease

    async def __aexit__(self, *exc):
        await self._lease.release()


def _acquiring(fn):
    """Makes the coroutine method fn return an Acquiring."""
    @functools.wraps(fn)
    def method(*args, **kw) -> Acquiring:
        return Acquiring(fn(*args, **kw))
    return method


class Client:
    """An asyncio lockbroker client; arguments as for lockbroker.Client."""

    def __init__(self, target: str = "127.0.0.1:8700", *, targets=(), tls=None, token: Optional[str] = None,
                 timeout: float = 10.0, channel_options=(), trace_context=None):
        self.targets = _core.targets_list(target, targets)
        self._creds, opts = _core.channel_setup(tls)
        self._opts = list(opts) + list(channel_options)
        self._channels = [None] * len(self.targets)
        self._locks = [None] * len(self.targets)
        self._sessions = [None] * len(self.targets)
        self._metadata = _core.auth_metadata(token)
        self._trace_context = trace_context
        self.timeout = timeout
        self._preferred = 0
        self._leases = weakref.WeakSet()
        self._closed = False

    def _md(self):
        """The call's metadata: the token, and the caller's trace context."""
        return self._metadata + _core.trace_metadata(self._trace_context)

    def _stub(self, service, i):
        if self._channels[i] is None:
            t = self.targets[i]
            ch = (grpc.aio.secure_channel(t, self._creds, self._opts) if self._creds
                  else grpc.aio.insecure_channel(t, self._opts))
            self._channels[i] = ch
            self._locks[i] = lock_pb2_grpc.LockServiceStub(ch)
            self._sessions[i] = session_pb2_grpc.SessionServiceStub(ch)
        return (self._locks if service == "lock" else self._sessions)[i]

    def _order(self) -> List[int]:
        n = len(self.targets)
        return [(self._preferred + i) % n for i in range(n)]

    async def _unary(self, service, method, request, timeout=None):
        last = None
        for i in self._order():
            try:
                resp = await getattr(self._stub(service, i), method)(
                    request, timeout=timeout or self.timeout, metadata=self._md())
            except grpc.RpcError as e:
                last = errors.from_rpc_error(e)
                if _core.failover_ok(last):
                    continue
                raise last from None
            self._preferred = i
            return resp
        raise last

    # -- locks ------------------------------------------------------------

    @_acquiring
    async def lock(self, key: str, *, ttl=None, wait=None, value: _core.BytesLike = b"", lock_delay=None,
                   behavior=None, checks=(), session_name=None,
                   on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits until it holds the lock `key`; see lockbroker.Client.lock.
        on_queued runs on the event loop (a coroutine function is scheduled
        as a task)."""
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay,
                                    behavior=behavior, checks=checks, session_name=session_name)
        return await self._acquire(req, wait, on_queued)

    async def try_lock(self, key: str, **kw) -> Optional["Lease"]:
        kw["wait"] = 0
        try:
            return await self.lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    @_acquiring
    async def read_lock(self, key: str, *, ttl=None, wait=None, value: _core.BytesLike = b"", lock_delay=None,
                        behavior=None, checks=(), session_name=None,
                        on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for a read (shared) hold of the read-write lock `key`; see
        lockbroker.Client.read_lock."""
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay, behavior=behavior,
                                    checks=checks, session_name=session_name, mode="read")
        return await self._acquire(req, wait, on_queued)

    @_acquiring
    async def write_lock(self, key: str, *, ttl=None, wait=None, value: _core.BytesLike = b"", lock_delay=None,
                         behavior=None, checks=(), session_name=None,
                         on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for the write (exclusive) hold of the read-write lock
        `key`; see lockbroker.Client.write_lock."""
        req = _core.acquire_request(key, value=value, wait=wait, ttl=ttl, lock_delay=lock_delay, behavior=behavior,
                                    checks=checks, session_name=session_name, mode="write")
        return await self._acquire(req, wait, on_queued)

    async def try_read_lock(self, key: str, **kw) -> Optional["Lease"]:
        kw["wait"] = 0
        try:
            return await self.read_lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    async def try_write_lock(self, key: str, **kw) -> Optional["Lease"]:
        kw["wait"] = 0
        try:
            return await self.write_lock(key, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    @_acquiring
    async def lock_all(self, keys, *, ttl=None, wait=None, value: _core.BytesLike = b"", lock_delay=None,
                       behavior=None, checks=(), session_name=None,
                       on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits until it holds every lock in `keys` at once, all or
        nothing; see lockbroker.Client.lock_all."""
        keys = _core.lock_keys(keys)
        req = _core.acquire_request(keys[0], value=value, wait=wait, ttl=ttl, lock_delay=lock_delay,
                                    behavior=behavior, checks=checks, session_name=session_name, keys=keys[1:])
        return await self._acquire(req, wait, on_queued)

    async def try_lock_all(self, keys, **kw) -> Optional["Lease"]:
        kw["wait"] = 0
        try:
            return await self.lock_all(keys, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    @_acquiring
    async def semaphore(self, prefix: str, limit: int, *, ttl=None, wait=None, value: _core.BytesLike = b"",
                        lock_delay=None, behavior=None, checks=(), session_name=None, fair=False,
                        on_queued: Optional[Callable[[Queued], None]] = None) -> "Lease":
        """Waits for one of `limit` slots at `prefix`; see lockbroker.Client.semaphore."""
        if not isinstance(limit, int) or limit < 1:
            raise errors.InvalidArgument(f"semaphore limit must be a positive int, not {limit!r}")
        req = _core.acquire_request(prefix, value=value, limit=limit, semaphore=True, wait=wait, ttl=ttl,
                                    lock_delay=lock_delay, behavior=behavior, checks=checks,
                                    session_name=session_name, fair=fair)
        return await self._acquire(req, wait, on_queued)

    async def try_semaphore(self, prefix: str, limit: int, **kw) -> Optional["Lease"]:
        kw["wait"] = 0
        try:
            return await self.semaphore(prefix, limit, **kw)
        except (errors.LockHeld, errors.LockDelay):
            return None

    async def _acquire(self, req, wait, on_queued=None):
        if self._closed:
            raise errors.Cancelled("client closed")
        local_end = None if wait is None else _core.now() + wait + 10.0
        place = _core.WaitPlace(req, on_queued)  # see lockbroker.Client._acquire
        last = None
        for i in self._order():
            try:
                try:
                    lease = await self._wait_at(i, place.request(), place, local_end)
                except errors.LockbrokerError as e:
                    if not place.gone(e):
                        raise
                    lease = await self._wait_at(i, req, place, local_end)
            except errors.LockbrokerError as e:
                last = e
                if _core.failover_ok(e):
                    continue
                raise
            self._preferred = i
            return lease
        raise last

    async def _wait_at(self, i, sent, place, local_end):
        call = self._stub("lock", i).Acquire(sent, metadata=self._md())
        reader = _Reader(call)
        try:
            return await self._await_grant(i, place, call, reader, local_end)
        except BaseException:  # a refusal, or cancelled while waiting
            call.cancel()
            raise

    async def _await_grant(self, i, place, call, reader, local_end):
        req = place.req
        silence = _core.WaitSilence(other_replicas=len(self.targets) > 1)
        while True:
            now = _core.now()
            timeout = None if local_end is None else local_end - now
            if timeout is not None and timeout <= 0:
                raise errors.WaitTimeout(f"no answer from {self.targets[i]} within the wait", reason="WAIT_TIMEOUT")
            if silence.passed(now):
                raise silence.error()
            if silence.at != float("inf"):
                timeout = silence.at - now if timeout is None else min(timeout, silence.at - now)
            item = await reader.get(timeout)
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
                    try:
                        err.state = await self.get_lock(req.key)
                    except errors.LockbrokerError:
                        pass
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

    # -- reads ------------------------------------------------------------

    async def get_lock(self, key: str) -> State:
        resp = await self._unary("lock", "GetLock", lock_pb2.GetLockRequest(key=key))
        return State.from_proto(resp.state)

    async def check_sequencer(self, sequencer: Sequencer) -> bool:
        resp = await self._unary("lock", "CheckSequencer",
                                 lock_pb2.CheckSequencerRequest(sequencer=sequencer.to_proto()))
        return resp.current

    def watch(self, key: str, *, prefix: bool = False, retry_for: float = 15.0) -> "Watch":
        """An async iterator of the states of `key`; see lockbroker.Client.watch."""
        return Watch(self, lock_pb2.WatchRequest(key=key, prefix=prefix), retry_for)

    def election(self, key: str) -> "Election":
        """Leader election on `key`; see lockbroker.Election."""
        return Election(self, key)

    def leader(self, key: str) -> "Election":
        """Deprecated: use election(key)."""
        warnings.warn("lockbroker: Client.leader(key) is deprecated; use Client.election(key)",
                      DeprecationWarning, stacklevel=2)
        return Election(self, key)

    # -- client-owned sessions ---------------------------------------------

    async def create_session(self, *, ttl=None, lock_delay=None, behavior=None, checks=(), name=None) -> SessionInfo:
        req = _core.session_request(ttl, lock_delay, behavior, checks, name)
        return session_info((await self._unary("session", "CreateSession", req)).session)

    async def renew_session(self, session_id: str) -> float:
        resp = await self._unary("session", "RenewSession", session_pb2.RenewSessionRequest(session_id=session_id))
        return _core.seconds(resp.guaranteed_for)

    async def destroy_session(self, session_id: str) -> None:
        await self._unary("session", "DestroySession", session_pb2.DestroySessionRequest(session_id=session_id))

    async def get_session(self, session_id: str) -> SessionInfo:
        resp = await self._unary("session", "GetSession", session_pb2.GetSessionRequest(session_id=session_id))
        return session_info(resp.session)

    async def list_sessions(self):
        resp = await self._unary("session", "ListSessions", session_pb2.ListSessionsRequest())
        return [session_summary(s) for s in resp.sessions]

    async def try_acquire(self, key: str, session_id: str, *, value: _core.BytesLike = b"", limit: int = 0,
                          semaphore: bool = False, mode: Optional[str] = None) -> Optional[Sequencer]:
        req = lock_pb2.TryAcquireRequest(
            key=key, session_id=session_id, value=_core.as_bytes(value), limit=limit,
            kind=_core.acquire_kind(semaphore, mode))
        try:
            return Sequencer.from_proto((await self._unary("lock", "TryAcquire", req)).sequencer)
        except (errors.LockHeld, errors.LockDelay):
            return None

    async def release(self, key: str, session_id: str, token: int = 0) -> bool:
        req = lock_pb2.ReleaseRequest(key=key, session_id=session_id, token=token)
        return (await self._unary("lock", "Release", req)).released

    # -- lifetime ---------------------------------------------------------

    async def close(self) -> None:
        """Releases this client's leases and closes its connections."""
        self._closed = True
        for lease in list(self._leases):
            try:
                await lease.release(timeout=2.0)
            except Exception:
                log.debug("release on close failed", exc_info=True)
        for ch in self._channels:
            if ch is not None:
                await ch.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class Watch:
    """Async iterator of a watched key's states; aclose() (or `async with`)
    stops it."""

    def __init__(self, client: Client, req, retry_for: float):
        self._client = client
        self._req = req
        self._retry_for = retry_for
        self._call = None
        self._closed = False
        self._gen = self._run()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Union[State, object]:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        try:
            await self._gen.aclose()
        except RuntimeError:  # being iterated by another task: it ends on the cancelled call
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def _run(self):
        client = self._client
        failing_since = None
        backoff = 0.1
        while True:
            for i in client._order():
                if self._closed:
                    return
                call = self._call = client._stub("lock", i).Watch(self._req, metadata=client._md())
                try:
                    while True:
                        resp = await call.read()
                        if resp is grpc.aio.EOF:
                            break
                        failing_since, backoff = None, 0.1
                        client._preferred = i
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
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


class Lease:
    """A held lock, semaphore slot, read-write lock hold or lock_all()
    keys; see lockbroker.Lease (mode, keys, sequencers, tokens, lost_key
    alike). `lost` is an asyncio.Event; release() is a coroutine;
    `async with lease:` releases at the end of the block."""

    def __init__(self, client: Client, replica: int, req, seqs, call, reader, deadline: float):
        self._client = client
        self._req = req
        self.key: str = req.key
        self.value: bytes = req.value
        self.sequencers: Tuple[Sequencer, ...] = tuple(seqs)
        self.sequencer: Sequencer = self.sequencers[0]
        self.mode: str = _core.lease_mode(req)
        self._replica = replica
        self._call = call
        self._deadline = deadline
        self._releasing = False
        self._released = False
        self._error: Optional[errors.LockLost] = None
        self._callbacks: List[Callable] = []
        self.lost = asyncio.Event()
        self._done = asyncio.Event()
        self._wake = asyncio.Event()
        self.resumes = 0
        self._task = asyncio.get_running_loop().create_task(self._run(reader))

    token = property(lambda self: self.sequencer.token, doc="The fencing token of this grant.")
    session_id = property(lambda self: self.sequencer.session_id)
    keys = property(lambda self: tuple(s.key for s in self.sequencers),
                    doc="Every key the lease holds, in the order asked for.")
    tokens = property(lambda self: tuple(s.token for s in self.sequencers),
                      doc="The fencing token of each key, in the order of `keys`.")
    lost_key = property(lambda self: self._error.key if self._error is not None else None,
                        doc="Once lost, the key whose loss ended the lease when the broker named it, else None.")
    deadline = property(lambda self: self._deadline,
                        doc="time.monotonic() value until which the hold is guaranteed.")
    target = property(lambda self: self._client.targets[self._replica])
    error = property(lambda self: self._error)
    released = property(lambda self: self._released)

    def check(self) -> None:
        """Raises LockLost unless the hold is still guaranteed now."""
        if self._error is not None:
            raise self._error
        if self._released:
            raise errors.LockLost("RELEASED", "released by this client")
        if _core.now() >= self._deadline - _core.CLIENT_MARGIN:
            raise errors.LockLost("KEEPALIVE_TIMEOUT", "no keepalive from the broker before the guaranteed deadline")

    def on_lost(self, callback: Callable) -> None:
        """Calls callback(LockLost) once when the lease is lost (at once if
        it already is). Not called after release()."""
        if self._error is None:
            self._callbacks.append(callback)
        else:
            _call(callback, self._error)

    async def wait_lost(self, timeout: Optional[float] = None) -> Optional[errors.LockLost]:
        try:
            await asyncio.wait_for(self.lost.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self._error

    async def set_value(self, value: _core.BytesLike) -> None:
        self.check()
        req = lock_pb2.SetValueRequest(key=self.key, session_id=self.session_id, value=_core.as_bytes(value),
                                       token=self.token)
        await self._client._unary("lock", "SetValue", req)
        self.value = req.value

    async def release(self, timeout: float = 10.0) -> bool:
        """Gives the hold up; True if this call released it."""
        if self._error is not None or self._released or self._releasing:
            return False
        self._releasing = True
        end = _core.now() + timeout
        req = lock_pb2.ReleaseRequest(key=self.key, session_id=self.session_id, token=self.token)
        released = True
        try:
            released = (await self._client._unary("lock", "Release", req,
                                                  timeout=max(0.1, min(timeout, self._client.timeout)))).released
        except errors.NotHolder:  # another grant holds it now: not ours to release
            released = False
            self._call.cancel()
        except errors.LockbrokerError as e:
            log.debug("Release of %s failed (%s); closing the stream", self.key, e)
            self._call.cancel()
        self._wake.set()
        try:
            await asyncio.wait_for(self._done.wait(), max(0.0, end - _core.now()))
        except asyncio.TimeoutError:
            self._call.cancel()
            try:
                await asyncio.wait_for(self._done.wait(), 1.0)
            except asyncio.TimeoutError:
                self._task.cancel()
        self._released = self._error is None
        return released

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.release()

    def __repr__(self):
        state = "lost" if self.lost.is_set() else "released" if self._released else "held"
        keys = repr(self.key) if len(self.sequencers) == 1 else repr(list(self.keys))
        mode = "" if self.mode == "lock" else f" {self.mode}"
        return f"<lockbroker.aio.Lease {keys}{mode} token={self.token} {state}>"

    # -- the lease's task ---------------------------------------------------

    def _give_up_at(self):
        return self._deadline - _core.CLIENT_MARGIN

    def _stall_at(self, last_word, guaranteed):
        if len(self._client.targets) < 2:
            return float("inf")
        return last_word + _core.STALL_SHARE * guaranteed

    async def _run(self, reader):
        try:
            while True:
                outcome = await self._follow(reader)
                if outcome is None:
                    reader = await self._resume()
                    if reader is not None:
                        continue
                    return
                self._finish(outcome)
                return
        except asyncio.CancelledError:
            self._finish(errors.LockLost("KEEPALIVE_TIMEOUT", "lease task cancelled"))
            raise
        except Exception as e:
            log.exception("lease task failed")
            self._finish(errors.LockLost("KEEPALIVE_TIMEOUT", f"client error: {e!r}"))
        finally:
            self._done.set()

    async def _follow(self, reader):
        stall_at = self._stall_at(_core.now(), self._deadline - _core.now())
        while True:
            give_up = self._give_up_at()
            t = _core.now()
            if t >= give_up:
                return errors.LockLost("KEEPALIVE_TIMEOUT",
                                       "no keepalive from the broker before the guaranteed deadline")
            if t >= stall_at:
                return None
            item = await reader.get(min(give_up, stall_at) - t)
            if item is None:
                continue
            t, msg = item
            if not isinstance(msg, lock_pb2.AcquireResponse):
                if self._releasing:
                    return _RELEASED
                log.info("lease %s: stream to %s broke (%s); resuming", self.key, self.target, _stream_error(msg))
                return None
            kind = msg.WhichOneof("event")
            if kind == "keepalive":
                g = _core.seconds(msg.keepalive.guaranteed_for)
                self._deadline = t + g
                stall_at = self._stall_at(t, g)
            elif kind == "released":
                if self._releasing:
                    return _RELEASED
                return errors.LockLost("RELEASED", "released through the Release call from elsewhere")
            elif kind == "lost":
                reason = _core.lost_reason_name(msg.lost.reason)
                if reason in _core.RESUME_REASONS:
                    if msg.lost.HasField("guaranteed_for"):  # the drain (or the last renewal) may end before the TTL would
                        self._deadline = min(self._deadline, t + _core.seconds(msg.lost.guaranteed_for))
                    return None
                return errors.LockLost(reason, msg.lost.detail, key=msg.lost.key)

    async def _resume(self):
        client = self._client
        n = len(client.targets)
        old_call, start = self._call, self._replica
        req = _core.resume_request(self._req, self.sequencer)
        attempt = 0
        while True:
            if self._releasing:
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
            call = client._stub("lock", i).Acquire(req, metadata=client._md())
            reader = _Reader(call)
            result = await self._await_resume(reader, _core.now() + min(remaining, _core.RESUME_ATTEMPT))
            if isinstance(result, float):
                self._call, self._replica, self._deadline = call, i, result
                self.resumes += 1
                old_call.cancel()
                log.info("lease %s: resumed on %s", self.key, client.targets[i])
                if self._releasing:
                    call.cancel()
                return reader
            call.cancel()
            if isinstance(result, errors.LockLost):
                old_call.cancel()
                self._finish(result)
                return None
            if attempt % n == 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), min(0.2, max(0.0, self._give_up_at() - _core.now())))
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()

    async def _await_resume(self, reader, bound):
        while True:
            left = min(bound, self._give_up_at()) - _core.now()
            if left <= 0:
                return errors.Unavailable("resume attempt timed out")
            item = await reader.get(left)
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
        if self._error is not None or self._released:
            return
        if self._releasing:
            outcome = _RELEASED
        self._call.cancel()
        if outcome is _RELEASED:
            self._released = True
            return
        self._error = outcome
        callbacks, self._callbacks = self._callbacks, []
        log.warning("lease %s (token %d) lost: %s", self.key, self.token, outcome)
        self.lost.set()
        for cb in callbacks:
            _call(cb, outcome)


def _call(cb, arg, what="on_lost"):
    try:
        r = cb(arg)
        if inspect.isawaitable(r):
            asyncio.ensure_future(r)
    except Exception:
        log.exception("%s callback failed", what)


class Election:
    """Leader election on one key; see lockbroker.Election."""

    def __init__(self, client: Client, key: str):
        self.client = client
        self.key = key
        self._lease: Optional[Lease] = None

    async def campaign(self, value: _core.BytesLike, **kw) -> Lease:
        lease = await self.client.lock(self.key, value=value, **kw)
        self._lease = lease
        return lease

    async def resign(self, timeout: float = 10.0) -> bool:
        lease, self._lease = self._lease, None
        return await lease.release(timeout) if lease is not None else False

    async def proclaim(self, value: _core.BytesLike) -> None:
        if self._lease is None:
            raise errors.NotLeader("not the leader of %s: campaign() first" % self.key)
        await self._lease.set_value(value)

    async def leader(self) -> Optional[Holder]:
        return (await self.client.get_lock(self.key)).holder

    async def observe(self, **kw):
        last = object()
        async with self.client.watch(self.key, **kw) as w:
            async for state in w:
                h = state.holder
                ident = (h.session_id, h.value) if h else None
                if ident != last:
                    last = ident
                    yield h


from ._core import TLS  # noqa: E402  (re-exported for `from lockbroker import aio; aio.TLS`)

__all__ = ["Client", "Lease", "Acquiring", "Watch", "Election", "TLS"]
