import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LockService } from "../../gen/es/lockbroker/v1/lock_pb.js";

const addr = process.env.LOCKBROKER_ADDR ?? "127.0.0.1:8700";
const locks = createClient(LockService, createGrpcTransport({ baseUrl: `http://${addr}`, httpVersion: "2" }));
// The broker keeps the lock's session alive for as long as this stream is open.
const hold = new AbortController();
const events = locks.acquire({ key: "jobs/nightly-report", value: new TextEncoder().encode("worker-1") }, { signal: hold.signal });
for await (const { event } of events) {
  if (event.case === "acquired") {
    console.log(`acquired token=${event.value.sequencer.token}`);
    break; // do the work here; a "lost" event on the stream means stop
  }
}
hold.abort(); // closing the stream releases the lock
