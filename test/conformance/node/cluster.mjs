// Real processes for the Node conformance runner: a Consul dev agent and
// broker replicas pointed at it. Nothing is mocked. The broker is built once
// with `go build -o <tmp>/broker ./cmd/broker` (LOCKBROKER_BIN overrides);
// Consul is bin/consul (LOCKBROKER_CONSUL overrides). Every process runs in
// a process group of its own and every wait has a bound.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, openSync, closeSync, readFileSync, readdirSync, accessSync, constants, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { createSocket } from "node:dgram";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client, LockbrokerError, UnimplementedError } from "../../../client/node/src/index.js";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const CONSUL_BIN = process.env.LOCKBROKER_CONSUL ?? join(REPO, "bin", "consul");
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 10_000;
const START_ATTEMPTS = 3;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let built;
export function brokerBinary() {
  if (process.env.LOCKBROKER_BIN) return process.env.LOCKBROKER_BIN;
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), "lockbroker-conformance-bin-"));
    process.once("exit", () => rmSync(dir, { recursive: true, force: true }));
    const out = join(dir, "broker");
    execFileSync("go", ["build", "-o", out, "./cmd/broker"], { cwd: REPO, stdio: ["ignore", "inherit", "inherit"], timeout: 600_000 });
    built = out;
  }
  return built;
}

function tcpPort() {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.once("error", rej);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
  });
}

function udpFree(port) {
  return new Promise((res) => {
    const s = createSocket("udp4");
    s.once("error", () => res(false));
    s.bind(port, "127.0.0.1", () => s.close(() => res(true)));
  });
}

// n distinct loopback ports free for TCP and UDP right now.
export async function freePorts(n) {
  const out = [];
  while (out.length < n) {
    const p = await tcpPort();
    if (!out.includes(p) && (await udpFree(p))) out.push(p);
  }
  return out;
}

class Proc {
  constructor(name, logDir) {
    this.name = name;
    this.logPath = join(logDir, `${name}.log`);
    this.proc = null;
    this.exit = null;
  }

  spawn(cmd, args, env) {
    const log = openSync(this.logPath, "a");
    this.proc = spawn(cmd, args, { cwd: REPO, detached: true, stdio: ["ignore", log, log], env });
    closeSync(log);
    this.exit = null;
    this.exited = new Promise((r) => this.proc.once("exit", (code, signal) => r((this.exit = { code, signal }))));
    this.onExit = () => this.signal("SIGKILL");
    process.once("exit", this.onExit);
  }

  alive() {
    return this.proc !== null && this.exit === null;
  }

  signal(sig) {
    if (!this.alive()) return;
    try {
      process.kill(-this.proc.pid, sig);
    } catch {
      return; // gone
    }
    if (sig === "SIGSTOP") waitStopped(this.proc.pid);
  }

  logTail(n = 40) {
    try {
      return readFileSync(this.logPath, "utf8").split("\n").slice(-n).join("\n");
    } catch {
      return "";
    }
  }

  async stop() {
    if (!this.proc) return;
    if (this.alive()) {
      this.signal("SIGCONT"); // a stopped process cannot act on SIGTERM
      this.signal("SIGTERM");
      await Promise.race([this.exited, sleep(STOP_TIMEOUT_MS)]);
    }
    this.signal("SIGKILL");
    try {
      process.kill(-this.proc.pid, "SIGKILL"); // whatever is left in the group
    } catch {
      // gone
    }
    await Promise.race([this.exited, sleep(STOP_TIMEOUT_MS)]);
    process.removeListener("exit", this.onExit);
  }
}

// waitStopped blocks until every thread of pid is stopped: kill(2) returns
// once SIGSTOP is queued, and a thread already running can still answer a
// request for a few milliseconds on a loaded machine. It blocks the event
// loop, for about a millisecond.
function waitStopped(pid, timeoutMs = 5_000) {
  const deadline = Date.now() + timeoutMs;
  const nap = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    let states;
    try {
      states = readdirSync(`/proc/${pid}/task`).flatMap((tid) => {
        try {
          const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "latin1");
          return [stat[stat.lastIndexOf(") ") + 2]];
        } catch {
          return []; // the thread exited
        }
      });
    } catch {
      return; // the process is gone
    }
    if (states.length > 0 && states.every((st) => st === "T" || st === "t")) return;
    if (Date.now() > deadline) throw new Error(`process ${pid} not stopped ${timeoutMs} ms after SIGSTOP`);
    Atomics.wait(nap, 0, 0, 1);
  }
}

export class Consul extends Proc {
  constructor(logDir) {
    super("consul", logDir);
    this.dataDir = mkdtempSync(join(tmpdir(), "lockbroker-conformance-consul-"));
  }

  async start() {
    accessSync(CONSUL_BIN, constants.X_OK);
    let last = "";
    for (let attempt = 0; attempt < START_ATTEMPTS; attempt++) {
      const [http, server, lan, wan] = await freePorts(4);
      this.addr = `127.0.0.1:${http}`;
      const hcl =
        'bind_addr = "127.0.0.1"\nclient_addr = "127.0.0.1"\nadvertise_addr = "127.0.0.1"\n' +
        'advertise_addr_wan = "127.0.0.1"\nlog_level = "warn"\n' +
        `ports { http = ${http} server = ${server} serf_lan = ${lan} serf_wan = ${wan} dns = -1 grpc = -1 grpc_tls = -1 https = -1 }`;
      this.spawn(CONSUL_BIN, ["agent", "-dev", "-node=conformance-node", `-data-dir=${this.dataDir}`, `-hcl=${hcl}`]);
      last = await this.waitReady();
      if (last === undefined) return this;
      await this.stop();
      if (!this.logTail().includes("address already in use")) break;
    }
    throw new Error(`consul not ready: ${last}\n${this.logTail()}`);
  }

  async waitReady() {
    const end = Date.now() + READY_TIMEOUT_MS;
    let last = "nothing tried";
    while (Date.now() < end) {
      if (!this.alive()) return `exited ${JSON.stringify(this.exit)}`;
      try {
        if (await this.http("GET", "/v1/status/leader")) {
          await this.http("PUT", "/v1/kv/_conformance/ready", "ok");
          return undefined;
        }
        last = "no leader yet";
      } catch (e) {
        last = e.message;
      }
      await sleep(100);
    }
    return `not ready after ${READY_TIMEOUT_MS / 1000}s (${last})`;
  }

  // A plain HTTP call to the agent; the decoded JSON answer.
  async http(method, path, body) {
    const resp = await fetch(`http://${this.addr}${path}`, {
      method,
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    const text = await resp.text();
    if (!resp.ok) throw new Error(`Consul ${method} ${path}: ${resp.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  destroySession(id) {
    return this.http("PUT", `/v1/session/destroy/${id}`);
  }

  async sessionInfo(id) {
    return (await this.http("GET", `/v1/session/info/${id}?consistent`)) ?? [];
  }
}

export class Broker extends Proc {
  // args: more broker flags (TLS, tenants); then readiness is /healthz on
  // the HTTP port, not a plaintext gRPC call.
  constructor(consul, logDir, name, args = [], consulAddr = undefined) {
    super(name, logDir);
    this.consul = consul;
    this.consulAddr = consulAddr ?? consul.addr;
    this.args = args;
  }

  async start() {
    const bin = brokerBinary();
    let last = "";
    for (let attempt = 0; attempt < START_ATTEMPTS; attempt++) {
      const [grpcPort, httpPort] = await freePorts(2);
      this.addr = `127.0.0.1:${grpcPort}`;
      this.httpAddr = `127.0.0.1:${httpPort}`;
      const env = { ...process.env, CONSUL_HTTP_ADDR: this.consulAddr };
      delete env.CONSUL_HTTP_TOKEN;
      this.spawn(bin, ["--listen", this.addr, "--http-listen", this.httpAddr, "--drain-timeout", "3s", ...this.args], env);
      last = await (this.args.length ? this.waitHealthz() : this.waitReady());
      if (last === undefined) return this;
      await this.stop();
      if (!this.logTail().includes("address already in use")) break;
    }
    throw new Error(`broker ${this.name} not ready: ${last}\n${this.logTail()}`);
  }

  async waitReady() {
    const end = Date.now() + READY_TIMEOUT_MS;
    let last = "nothing tried";
    const c = new Client(this.addr, { timeoutMs: 2000 });
    try {
      while (Date.now() < end) {
        if (!this.alive()) return `exited ${JSON.stringify(this.exit)}`;
        try {
          await c.getLock("conformance/ready");
          return undefined;
        } catch (e) {
          if (e instanceof UnimplementedError) return undefined;
          last = e instanceof LockbrokerError ? `${e.codeName}: ${e.message}` : String(e);
        }
        await sleep(100);
      }
    } finally {
      await c.close();
    }
    return `not ready after ${READY_TIMEOUT_MS / 1000}s (${last})`;
  }

  // Readiness of a broker whose gRPC port needs TLS or an identity:
  // /healthz answers 200 (it serves, and Consul has a leader).
  async waitHealthz() {
    const end = Date.now() + READY_TIMEOUT_MS;
    let last = "nothing tried";
    while (Date.now() < end) {
      if (!this.alive()) return `exited ${JSON.stringify(this.exit)}`;
      try {
        const resp = await fetch(`http://${this.httpAddr}/healthz`, { signal: AbortSignal.timeout(2000) });
        await resp.arrayBuffer();
        if (resp.ok) return undefined;
        last = `/healthz: ${resp.status}`;
      } catch (e) {
        last = e.message;
      }
      await sleep(50);
    }
    return `not ready after ${READY_TIMEOUT_MS / 1000}s (${last})`;
  }
}

// Link is a TCP relay on a free loopback port to upstream (host:port): a
// replica's link to its Consul agent. cut() closes the listener and every
// relayed connection, so the replica's calls are refused from then on.
export class Link {
  static async open(upstream) {
    const l = new Link();
    const [host, port] = [upstream.slice(0, upstream.lastIndexOf(":")), Number(upstream.slice(upstream.lastIndexOf(":") + 1))];
    l.sockets = new Set();
    l.server = createServer((down) => {
      const up = connect(port, host);
      for (const s of [down, up]) {
        l.sockets.add(s);
        s.on("error", () => {});
        s.on("close", () => l.sockets.delete(s));
      }
      down.pipe(up);
      up.pipe(down);
      down.on("close", () => up.destroy());
      up.on("close", () => down.destroy());
    });
    await new Promise((resolve) => l.server.listen(0, "127.0.0.1", resolve));
    l.addr = `127.0.0.1:${l.server.address().port}`;
    return l;
  }

  cut() {
    this.server.close();
    for (const s of this.sockets) s.destroy();
  }
}

export class Cluster {
  async start() {
    this.logDir = mkdtempSync(join(tmpdir(), "lockbroker-conformance-node-"));
    this.consul = await new Consul(this.logDir).start();
    this.brokers = [];
    return this;
  }

  // consulAddr: where the replica reaches the agent (a Link to it, say).
  async broker(name, args = [], consulAddr = undefined) {
    const b = new Broker(this.consul, this.logDir, name ?? `broker-${this.brokers.length}`, args, consulAddr);
    this.brokers.push(b);
    return b.start();
  }

  // Stops every process; removes the logs and Consul's data unless
  // LOCKBROKER_KEEP_LOG is set (then it prints where they are).
  async stop() {
    for (const b of this.brokers ?? []) await b.stop();
    await this.consul?.stop();
    if (this.consul) rmSync(this.consul.dataDir, { recursive: true, force: true });
    if (process.env.LOCKBROKER_KEEP_LOG) console.log(`conformance logs: ${this.logDir}`);
    else if (this.logDir) rmSync(this.logDir, { recursive: true, force: true });
  }
}
