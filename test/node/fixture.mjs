// Test fixture for the Node client tests: starts `bin/broker --dev` (which
// starts a Consul dev agent from bin/consul) on free loopback ports, waits
// until it serves, and stops both. Also small helpers that put a bound on
// every wait of a stream. Nothing is mocked.

import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { accessSync, constants, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { LockService } from "../../gen/es/lockbroker/v1/lock_pb.js";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BROKER_BIN = process.env.LOCKBROKER_BIN ?? join(REPO, "bin", "broker");
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 15_000;

export function freePort() {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.once("error", rej);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Broker {
  async start() {
    try {
      accessSync(BROKER_BIN, constants.X_OK);
    } catch {
      throw new Error(`${BROKER_BIN} is missing: build it with \`go build -o bin/broker ./cmd/broker\``);
    }
    this.addr = `127.0.0.1:${await freePort()}`;
    this.httpAddr = `127.0.0.1:${await freePort()}`;
    this.consulAddr = `127.0.0.1:${await freePort()}`;
    this.logDir = mkdtempSync(join(tmpdir(), "lockbroker-node-test-"));
    this.logPath = join(this.logDir, "broker.log");
    const log = openSync(this.logPath, "w");
    // A process group of its own (detached), so stop() can also end the
    // Consul agent if the broker did not.
    this.proc = spawn(
      BROKER_BIN,
      ["--dev", "--listen", this.addr, "--http-listen", this.httpAddr, "--dev-consul-http", this.consulAddr, "--drain-timeout", "3s"],
      { cwd: REPO, detached: true, stdio: ["ignore", log, log] },
    );
    closeSync(log);
    this.exited = new Promise((res) => this.proc.once("exit", (code, signal) => res({ code, signal })));
    this.exitInfo = null;
    this.exited.then((info) => (this.exitInfo = info));
    // Last resort if the test process goes away without running after().
    this.onExit = () => this.killGroup();
    process.once("exit", this.onExit);

    this.transport = createGrpcTransport({ baseUrl: `http://${this.addr}`, httpVersion: "2" });
    this.client = createClient(LockService, this.transport);
    await this.waitReady();
  }

  async waitReady() {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    let last = "nothing tried yet";
    while (Date.now() < deadline) {
      if (this.exitInfo) {
        const info = this.exitInfo;
        await this.stop();
        throw new Error(`broker exited (${JSON.stringify(info)}) while starting:\n${this.logTail()}`);
      }
      try {
        const leader = await this.consul("GET", "/v1/status/leader");
        if (!leader) {
          last = "Consul has no leader yet";
        } else {
          await this.client.getLock({ key: "lockbroker-test/ready" }, { timeoutMs: 5000 });
          return;
        }
      } catch (e) {
        if (e instanceof ConnectError) {
          // The server is up; the tests will report what it lacks.
          if (e.code === Code.Unimplemented) return;
          last = `GetLock: ${Code[e.code]}: ${e.rawMessage}`;
        } else {
          last = `Consul HTTP: ${e.message}`;
        }
      }
      await sleep(200);
    }
    await this.stop();
    throw new Error(`broker not ready after ${READY_TIMEOUT_MS / 1000}s (${last}):\n${this.logTail()}`);
  }

  // A plain HTTP call to the Consul agent; returns the decoded JSON.
  async consul(method, path, body) {
    const resp = await fetch(`http://${this.consulAddr}${path}`, {
      method,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    const text = await resp.text();
    if (!resp.ok) throw new Error(`Consul ${method} ${path}: ${resp.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  logTail(n = 60) {
    try {
      return readFileSync(this.logPath, "utf8").split("\n").slice(-n).join("\n");
    } catch {
      return "";
    }
  }

  // SIGSTOP the broker (not its Consul agent): it stalls.
  pause() {
    process.kill(this.proc.pid, "SIGSTOP");
  }

  resume() {
    try {
      process.kill(this.proc.pid, "SIGCONT");
    } catch {
      // already gone
    }
  }

  killGroup() {
    try {
      process.kill(-this.proc.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }

  async stop() {
    if (!this.proc) return;
    if (!this.exitInfo) {
      this.resume();
      try {
        this.proc.kill("SIGTERM");
      } catch {
        // already gone
      }
      let timer;
      await Promise.race([this.exited, new Promise((r) => (timer = setTimeout(r, STOP_TIMEOUT_MS)))]);
      clearTimeout(timer);
    }
    // Whatever is left in the group (a hung broker, the Consul agent) goes.
    this.killGroup();
    let timer;
    await Promise.race([this.exited, new Promise((r) => (timer = setTimeout(r, STOP_TIMEOUT_MS)))]);
    clearTimeout(timer);
    process.removeListener("exit", this.onExit);
    if (process.env.LOCKBROKER_KEEP_LOG) {
      console.log(`broker log: ${this.logPath}`);
    } else {
      rmSync(this.logDir, { recursive: true, force: true });
    }
    this.proc = null;
  }
}

// A key no other test uses.
export function uniqueKey(name) {
  return `node/${name.replace(/[^A-Za-z0-9_-]+/g, "-")}/${randomUUID().slice(0, 8)}`;
}

const END = Symbol("end");

// A server stream read in the background, so every wait has a bound.
export class Stream {
  constructor(open) {
    this.abort = new AbortController();
    this.items = [];
    this.waiter = null;
    this.done = false;
    this.error = undefined;
    this.pump(open(this.abort.signal));
  }

  async pump(iterable) {
    try {
      for await (const msg of iterable) this.push(msg);
    } catch (e) {
      this.push(e instanceof Error ? e : new Error(String(e)));
    }
    this.push(END);
  }

  push(item) {
    this.items.push(item);
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w();
    }
  }

  // The next message. Throws the stream's error if it failed, an Error
  // with .eof if it ended, and an Error after timeoutMs.
  async next(timeoutMs = 10_000) {
    if (this.done) throw Object.assign(new Error("stream already ended"), { eof: true });
    if (this.items.length === 0) {
      let timer;
      const arrived = await Promise.race([
        new Promise((r) => (this.waiter = () => r(true))),
        new Promise((r) => (timer = setTimeout(() => r(false), Math.max(0, timeoutMs)))),
      ]);
      clearTimeout(timer);
      if (!arrived) {
        this.waiter = null;
        throw new Error(`nothing received within ${timeoutMs}ms`);
      }
    }
    const item = this.items.shift();
    if (item === END) {
      this.done = true;
      throw Object.assign(new Error("stream ended"), { eof: true });
    }
    if (item instanceof Error) {
      this.done = true;
      this.error = item;
      throw item;
    }
    return item;
  }

  // Reads until the stream ends: { msgs, err } (err undefined on a clean end).
  async waitEnd(timeoutMs = 10_000) {
    const msgs = [];
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`stream did not end within ${timeoutMs}ms (got ${msgs.length} messages)`);
      try {
        msgs.push(await this.next(left));
      } catch (e) {
        if (e.eof) return { msgs, err: this.error };
        if (e === this.error) return { msgs, err: e };
        throw e;
      }
    }
  }

  close() {
    this.abort.abort();
  }
}

// One Acquire stream and what it was told.
export class Hold {
  constructor(client, req) {
    this.key = req.key;
    this.stream = new Stream((signal) => client.acquire(req, { signal }));
    this.sessionId = undefined;
    this.sequencer = undefined;
  }

  // The next event other than a keepalive: { case, value }.
  async nextEvent(timeoutMs = 10_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const ev = (await this.stream.next(deadline - Date.now())).event;
      if (ev.case === "keepalive") continue;
      if (ev.case === "queued" && ev.value.sessionId) this.sessionId = ev.value.sessionId;
      if (ev.case === "acquired") {
        this.sequencer = ev.value.sequencer;
        this.sessionId = ev.value.sequencer.sessionId;
      }
      return ev;
    }
  }

  // Skips `queued` until `acquired`; anything else fails.
  async acquired(timeoutMs = 10_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const ev = await this.nextEvent(deadline - Date.now());
      if (ev.case === "acquired") return ev.value;
      if (ev.case !== "queued") throw new Error(`expected acquired on ${this.key}, got ${ev.case}`);
    }
  }

  async queued(timeoutMs = 10_000) {
    const ev = await this.nextEvent(timeoutMs);
    if (ev.case !== "queued") throw new Error(`expected queued on ${this.key}, got ${ev.case}`);
    return ev.value;
  }

  close() {
    this.stream.close();
  }
}

// A Watch stream; wait() skips states until one matches.
export class WatchReader {
  constructor(client, key) {
    this.stream = new Stream((signal) => client.watch({ key }, { signal }));
  }

  async wait(pred, timeoutMs = 5000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const { state } = await this.stream.next(deadline - Date.now());
      if (pred(state)) return state;
    }
  }

  close() {
    this.stream.close();
  }
}
