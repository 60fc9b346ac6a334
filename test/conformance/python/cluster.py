"""Real processes for the conformance runners: a Consul dev agent and
broker replicas pointed at it. Nothing is mocked.

The broker binary is built once with `go build -o <tmp>/broker ./cmd/broker`
(LOCKBROKER_BIN overrides it); Consul is bin/consul (LOCKBROKER_CONSUL
overrides it). Every process runs in a process group of its own, so a stop
also ends whatever it started, and every wait has a bound.
"""

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import lockbroker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONSUL_BIN = os.environ.get("LOCKBROKER_CONSUL", os.path.join(REPO, "bin", "consul"))
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
START_ATTEMPTS = 3

_built = None



def wait_stopped(pid, timeout=5.0):
    """Waits until every thread of pid is stopped: kill(2) returns once
    SIGSTOP is queued, and a thread already running can still answer a
    request for a few milliseconds on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue  # the thread exited
                states.append(stat[stat.rindex(b") ") + 2 : stat.rindex(b") ") + 3])
        except OSError:
            return  # the process is gone
        if states and all(st in (b"T", b"t") for st in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} not stopped {timeout}s after SIGSTOP")
        time.sleep(0.001)

class SetupError(Exception):
    pass


def broker_binary():
    """Builds cmd/broker once per test run (or uses LOCKBROKER_BIN); the
    build is removed when the process exits."""
    global _built
    if os.environ.get("LOCKBROKER_BIN"):
        return os.environ["LOCKBROKER_BIN"]
    if _built is None:
        bin_dir = tempfile.mkdtemp(prefix="lockbroker-conformance-bin-")
        atexit.register(shutil.rmtree, bin_dir, True)
        out = os.path.join(bin_dir, "broker")
        r = subprocess.run(["go", "build", "-o", out, "./cmd/broker"], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            raise SetupError(f"go build ./cmd/broker failed:\n{r.stdout}{r.stderr}")
        _built = out
    return _built


def free_ports(n):
    """n distinct loopback ports free for TCP and UDP right now."""
    held, ports = [], []
    try:
        while len(ports) < n:
            t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            t.bind(("127.0.0.1", 0))
            port = t.getsockname()[1]
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                u.bind(("127.0.0.1", port))
            except OSError:
                t.close()
                u.close()
                continue
            held += [t, u]
            ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


class _Process:
    def __init__(self, name, log_dir):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.proc = None

    def _spawn(self, args, env=None):
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()

    def log_tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.killpg(self.proc.pid, sig)
            if sig == signal.SIGSTOP:
                wait_stopped(self.proc.pid)

    def stop(self):
        if self.proc is None:
            return
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass


class Consul(_Process):
    """A `consul agent -dev` on free loopback ports."""

    def __init__(self, log_dir):
        super().__init__("consul", log_dir)
        self.addr = None
        self.data_dir = tempfile.mkdtemp(prefix="lockbroker-conformance-consul-")

    def start(self):
        if not os.access(CONSUL_BIN, os.X_OK):
            raise SetupError(f"{CONSUL_BIN} is missing (make deps builds it)")
        last = ""
        for _ in range(START_ATTEMPTS):
            http, server, lan, wan = free_ports(4)
            self.addr = f"127.0.0.1:{http}"
            hcl = ('bind_addr = "127.0.0.1"\nclient_addr = "127.0.0.1"\nadvertise_addr = "127.0.0.1"\n'
                   'advertise_addr_wan = "127.0.0.1"\nlog_level = "warn"\n'
                   f"ports {{ http = {http} server = {server} serf_lan = {lan} serf_wan = {wan} "
                   "dns = -1 grpc = -1 grpc_tls = -1 https = -1 }")
            self._spawn([CONSUL_BIN, "agent", "-dev", "-node=conformance", f"-data-dir={self.data_dir}",
                         f"-hcl={hcl}"])
            last = self._wait_ready()
            if last is None:
                return self
            self.stop()
            if "address already in use" not in self.log_tail():
                break
        raise SetupError(f"consul not ready: {last}\n{self.log_tail()}")

    def _wait_ready(self):
        end = time.monotonic() + READY_TIMEOUT
        last = "nothing tried"
        while time.monotonic() < end:
            if not self.alive():
                return f"exited with {self.proc.returncode}"
            try:
                if self.http("GET", "/v1/status/leader"):
                    self.http("PUT", "/v1/kv/_conformance/ready", raw=b"ok")
                    return None
                last = "no leader yet"
            except OSError as e:
                last = str(e)
            time.sleep(0.1)
        return f"not ready after {READY_TIMEOUT:.0f}s ({last})"

    def http(self, method, path, body=None, raw=None):
        """A plain HTTP call to the agent; the decoded JSON answer."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(f"http://{self.addr}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            out = resp.read()
        return json.loads(out) if out else None

    def destroy_session(self, session_id):
        return self.http("PUT", f"/v1/session/destroy/{session_id}")

    def session_info(self, session_id):
        return self.http("GET", f"/v1/session/info/{session_id}?consistent") or []


class Broker(_Process):
    """One broker replica on free loopback ports, using `consul`."""

    def __init__(self, consul, log_dir, name, args=(), consul_addr=None):
        super().__init__(name, log_dir)
        self.consul = consul
        self.consul_addr = consul_addr or consul.addr
        self.args = list(args)
        self.addr = None
        self.http_addr = None

    def start(self):
        binary = broker_binary()
        last = ""
        for _ in range(START_ATTEMPTS):
            grpc_port, http_port = free_ports(2)
            self.addr, self.http_addr = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
            env = dict(os.environ, CONSUL_HTTP_ADDR=self.consul_addr)
            env.pop("CONSUL_HTTP_TOKEN", None)
            self._spawn([binary, "--listen", self.addr, "--http-listen", self.http_addr,
                         "--drain-timeout", "3s", *self.args], env=env)
            last = self._wait_healthz() if self.args else self._wait_ready()
            if last is None:
                return self
            self.stop()
            if "address already in use" not in self.log_tail():
                break
        raise SetupError(f"broker {self.name} not ready: {last}\n{self.log_tail()}")

    def _wait_ready(self):
        end = time.monotonic() + READY_TIMEOUT
        last = "nothing tried"
        with lockbroker.Client(self.addr, timeout=2.0) as c:
            while time.monotonic() < end:
                if not self.alive():
                    return f"exited with {self.proc.returncode}"
                try:
                    c.get_lock("conformance/ready")
                    return None
                except lockbroker.Unimplemented:
                    return None
                except lockbroker.LockbrokerError as e:
                    last = str(e)
                time.sleep(0.1)
        return f"not ready after {READY_TIMEOUT:.0f}s ({last})"

    def _wait_healthz(self):
        """Readiness of a broker started with flags (TLS, tenants), whose
        gRPC port a plaintext client without identity cannot use: /healthz
        on its HTTP port answers 200 (it serves, and Consul has a leader)."""
        end = time.monotonic() + READY_TIMEOUT
        last = "nothing tried"
        while time.monotonic() < end:
            if not self.alive():
                return f"exited with {self.proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://{self.http_addr}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return None
                    last = f"/healthz: {resp.status}"
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        return f"not ready after {READY_TIMEOUT:.0f}s ({last})"

    def help_text(self):
        r = subprocess.run([broker_binary(), "--help"], capture_output=True, text=True, timeout=30)
        return r.stdout + r.stderr



class Link:
    """A TCP relay on a free loopback port to `upstream` (host:port): a
    replica's link to its Consul agent. cut() closes the listener and every
    relayed connection, so the replica's calls are refused from then on."""

    def __init__(self, upstream):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.conns = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return  # cut
            try:
                up = socket.create_connection(self.upstream, timeout=5)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            with self.lock:
                self.conns += [down, up]
            threading.Thread(target=self._pipe, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        # shutdown wakes the accept() in progress; close alone would leave
        # the socket listening until it returns.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self.conns = []

class Cluster:
    """A Consul agent and the broker replicas started on it."""

    def __init__(self):
        self.log_dir = tempfile.mkdtemp(prefix="lockbroker-conformance-")
        self.consul = Consul(self.log_dir).start()
        self.brokers = []

    def broker(self, name=None, args=(), consul_addr=None):
        """Starts a replica; `args` are more broker flags (then readiness is
        /healthz on the HTTP port, not a plaintext gRPC call); consul_addr
        is where it reaches the agent (a Link to it, say)."""
        b = Broker(self.consul, self.log_dir, name or f"broker-{len(self.brokers)}", args, consul_addr)
        self.brokers.append(b)
        return b.start()

    def stop(self):
        """Stops every process; removes the logs and Consul's data unless
        LOCKBROKER_KEEP_LOG is set (then it prints where they are)."""
        for b in self.brokers:
            b.stop()
        self.consul.stop()
        shutil.rmtree(self.consul.data_dir, ignore_errors=True)
        if os.environ.get("LOCKBROKER_KEEP_LOG"):
            print(f"conformance logs: {self.log_dir}")
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)
