"""Fixtures for the Python client tests.

The session fixture `broker` starts `bin/broker --dev` (which starts a
Consul dev agent from bin/consul) on free loopback ports, waits until it
serves, and stops both at the end. Nothing is mocked: the tests talk gRPC to
the broker through the stubs in gen/python, and plain HTTP to Consul when
they need to act behind the broker's back.

Run: PYTHONPATH=gen/python /usr/bin/python3 -m pytest test/python -q
"""

import json
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

from lockbroker.v1 import lock_pb2, lock_pb2_grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROKER_BIN = os.environ.get("LOCKBROKER_BIN", os.path.join(REPO, "bin", "broker"))
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A running broker with its Consul dev agent."""

    def __init__(self):
        self.addr = f"127.0.0.1:{free_port()}"
        self.http_addr = f"127.0.0.1:{free_port()}"
        self.consul_addr = f"127.0.0.1:{free_port()}"
        self.log = tempfile.NamedTemporaryFile(prefix="lockbroker-pytest-", suffix=".log", delete=False)
        self.proc = None
        self.channel = None

    def start(self):
        if not os.access(BROKER_BIN, os.X_OK):
            pytest.fail(f"{BROKER_BIN} is missing: build it with `go build -o bin/broker ./cmd/broker`")
        # A process group of its own: teardown can then end the Consul agent
        # too, even if the broker did not.
        self.proc = subprocess.Popen(
            [BROKER_BIN, "--dev",
             "--listen", self.addr,
             "--http-listen", self.http_addr,
             "--dev-consul-http", self.consul_addr],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.channel = grpc.insecure_channel(self.addr)
        self._wait_ready()

    def _wait_ready(self):
        stub = lock_pb2_grpc.LockServiceStub(self.channel)
        deadline = time.monotonic() + READY_TIMEOUT
        last = "nothing tried yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"broker exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                leader = self.consul("GET", "/v1/status/leader")
                if not leader:
                    last = "Consul has no leader yet"
                else:
                    stub.GetLock(lock_pb2.GetLockRequest(key="lockbroker-test/ready"), timeout=5)
                    return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # The server is up; the tests will report what it lacks.
                    return
                last = f"GetLock: {e.code().name}: {e.details()}"
            except (OSError, ValueError) as e:
                last = f"Consul HTTP: {e}"
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"broker not ready after {READY_TIMEOUT:.0f}s ({last}):\n{self.log_tail()}")

    def consul(self, method, path, body=None):
        """A plain HTTP call to the Consul agent; returns the decoded JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.consul_addr}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def pause(self):
        """SIGSTOP the broker (not its Consul agent): it stalls."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def log_tail(self, n=60):
        try:
            with open(self.log.name, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left in the group (the broker if it hung, the Consul
        # agent if the broker did not stop it) is killed.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


@pytest.fixture(scope="session")
def broker():
    b = Broker()
    b.start()
    try:
        yield b
    finally:
        b.stop()
        if os.environ.get("LOCKBROKER_KEEP_LOG"):
            print(f"broker log: {b.log.name}")
        else:
            os.unlink(b.log.name)


@pytest.fixture
def stub(broker):
    return lock_pb2_grpc.LockServiceStub(broker.channel)


@pytest.fixture
def key(request):
    """A key no other test uses."""
    return f"pytest/{request.node.name.replace('[', '-').replace(']', '')}/{uuid.uuid4().hex[:8]}"


_END = object()


class Stream:
    """A server stream read on a thread, so every wait has a bound."""

    def __init__(self, call):
        self.call = call
        self.items = queue.Queue()
        self.done = False
        self.error = None
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self):
        try:
            for msg in self.call:
                self.items.put(msg)
        except grpc.RpcError as e:
            self.items.put(e)
        self.items.put(_END)

    def next(self, timeout=10.0):
        """The next message; raises grpc.RpcError if the stream failed,
        EOFError if it ended, AssertionError after timeout seconds."""
        if self.done:
            raise EOFError("stream already ended")
        try:
            item = self.items.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing received within {timeout}s") from None
        if item is _END:
            self.done = True
            raise EOFError("stream ended")
        if isinstance(item, grpc.RpcError):
            self.error = item
            self.done = True
            # Leave the end marker to be read by a later next().
            raise item
        return item

    def wait_end(self, timeout=10.0):
        """Reads until the stream ends; returns the messages and the error
        (or None for a clean end)."""
        msgs = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"stream did not end within {timeout}s (got {msgs})")
            try:
                msgs.append(self.next(left))
            except EOFError:
                return msgs, self.error
            except grpc.RpcError as e:
                return msgs, e

    def cancel(self):
        self.call.cancel()
        self._thread.join(timeout=10)


class Hold:
    """One Acquire stream and what it was told."""

    def __init__(self, stub, key, value=b"", limit=0, **kw):
        self.key = key
        self.stream = Stream(stub.Acquire(lock_pb2.AcquireRequest(key=key, value=value, limit=limit, **kw)))
        self.session_id = None
        self.sequencer = None
        self.queued = []

    def next_event(self, timeout=10.0):
        """The next event other than a keepalive."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.stream.next(max(0.0, deadline - time.monotonic()))
            kind = ev.WhichOneof("event")
            if kind == "keepalive":
                continue
            if kind == "queued":
                self.queued.append(ev.queued)
                if ev.queued.session_id:
                    self.session_id = ev.queued.session_id
            if kind == "acquired":
                self.sequencer = ev.acquired.sequencer
                self.session_id = ev.acquired.sequencer.session_id
            return ev

    def wait_acquired(self, timeout=10.0):
        """Skips `queued` events until `acquired`; anything else fails."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.0, deadline - time.monotonic()))
            kind = ev.WhichOneof("event")
            if kind == "acquired":
                return ev.acquired
            assert kind == "queued", f"expected acquired on {self.key}, got {ev}"

    def wait_queued(self, timeout=10.0):
        ev = self.next_event(timeout)
        assert ev.WhichOneof("event") == "queued", f"expected queued on {self.key}, got {ev}"
        return ev.queued

    def close(self):
        self.stream.cancel()


@pytest.fixture
def holds():
    """Opens Acquire streams and closes whatever is left at the end."""
    opened = []

    def open_hold(stub, key, **kw):
        h = Hold(stub, key, **kw)
        opened.append(h)
        return h

    yield open_hold
    for h in opened:
        h.close()


class WatchReader:
    """A Watch stream; wait() skips states until one matches."""

    def __init__(self, stub, key):
        self.stream = Stream(stub.Watch(lock_pb2.WatchRequest(key=key)))

    def wait(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            try:
                state = self.stream.next(max(0.0, left)).state
            except AssertionError:
                raise AssertionError(f"no matching watch state within {timeout}s; saw {seen}") from None
            if pred(state):
                return state
            seen.append(state)

    def close(self):
        self.stream.cancel()


@pytest.fixture
def watches():
    """Opens Watch streams and closes them at the end."""
    opened = []

    def open_watch(stub, key):
        w = WatchReader(stub, key)
        opened.append(w)
        return w

    yield open_watch
    for w in opened:
        w.close()
