import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LockService } from "../../gen/es/lockbroker/v1/lock_pb.js";

// The job; it must give up as soon as signal aborts.
const work = (signal) => new Promise((done) => {
  const t = setTimeout(done, Number(process.env.WORK_SECONDS ?? 1) * 1000);
  signal.addEventListener("abort", () => { clearTimeout(t); done(); });
});
const addr = process.env.LOCKBROKER_ADDR ?? "127.0.0.1:8700";
const locks = createClient(LockService, createGrpcTransport({ baseUrl: `http://${addr}`, httpVersion: "2" }));
// The broker keeps the lock's session alive for as long as this stream is open; aborting it releases the lock.
const hold = new AbortController();
let deadline, done = false;
try {
  for await (const { event } of locks.acquire({ key: "jobs/nightly-report", value: new TextEncoder().encode("worker-1") }, { signal: hold.signal })) {
    if (event.case === "acquired") {
      console.log(`acquired token=${event.value.sequencer.token}`);
      work(hold.signal).then(() => { done = !hold.signal.aborted; hold.abort(); });
    }
    if (event.case === "acquired" || event.case === "keepalive") { // no keepalive within guaranteed_for: lost
      const { seconds, nanos } = event.value.guaranteedFor;
      clearTimeout(deadline);
      deadline = setTimeout(() => hold.abort(), Number(seconds) * 1000 + nanos / 1e6);
    } else if (event.case !== "queued") break; // lost (or released by someone else)
  }
} catch {} // aborted: the work is done or the deadline passed; or the broker is gone
clearTimeout(deadline);
hold.abort(); // stop working; closing the stream releases the lock
if (!done) { console.error("lost"); process.exitCode = 1; }
