// Compiled (not run) by `npm run typecheck` (tsc): the declared API in use,
// as a TypeScript user would write it against the published package.

import {
  Client,
  ConflictError,
  LockHeldError,
  LockLostError,
  SNAPSHOT_COMPLETE,
  type Holder,
  type Lease,
  type Queued,
  type Sequencer,
  type State,
} from "@lockbroker/client";

export async function example(): Promise<bigint> {
  const client = new Client("127.0.0.1:8700", { targets: ["127.0.0.1:8710"], token: "t", tls: { ca: "PEM" } });
  const lease: Lease = await client.lock("jobs/nightly", { ttl: 15, wait: 30, value: "host-a", signal: AbortSignal.timeout(1000) });
  await fetch("http://127.0.0.1/", { signal: lease.signal });
  lease.onLost((err: LockLostError) => console.log(err.reason, err.detail));
  lease.check();
  const deadline: number = lease.deadline;
  void deadline;
  await lease.release();
  await lease[Symbol.asyncDispose]();

  const queued = await client.lock("k", { onQueued: (q: Queued) => console.log(q.position, q.waiting, q.state?.holder) });
  await queued.release();

  const maybe: Lease | null = await client.tryLock("k");
  if (maybe === null) console.log("busy");
  const slot = await client.semaphore("pool", 3, { fair: true });
  await slot.release({ timeoutMs: 500 });

  for await (const st of client.watch("k", { signal: AbortSignal.timeout(10) })) {
    if (st === SNAPSHOT_COMPLETE) continue;
    const s: State = st;
    const h: Holder | null = s.holder;
    void h;
  }
  const election = client.election("leader/k");
  const lead: Lease = await election.campaign("me");
  void lead;
  await election.proclaim("me-2");
  const resigned: boolean = await election.resign();
  void resigned;
  for await (const leader of election.observe()) void leader?.value;
  const n: number = await client.using("jobs/nightly", async (l: Lease) => {
    await fetch("http://127.0.0.1/", { signal: l.signal });
    return 1;
  }, { ttl: 15 });
  void n;

  try {
    await client.lock("k", { wait: 0 });
  } catch (e) {
    if (e instanceof LockHeldError) console.log(e.holders.map((h) => h.sessionId), e.reason, e.retryAfter);
  }
  {
    await using reader = await client.readLock("rw/k", { signal: AbortSignal.timeout(1000) });
    const read: boolean = reader.sequencer.read;
    const mode: string = reader.mode;
    void read, mode;
  }
  const writer: Lease | null = await client.tryWriteLock("rw/k");
  await writer?.release();
  const r2: Lease | null = await client.tryReadLock("rw/k", { value: "r" });
  await r2?.release();
  await (await client.writeLock("rw/k", { wait: 5 })).release();
  {
    await using all = await client.lockAll(["a", "b", "c"], { signal: AbortSignal.timeout(1000) });
    const tokens: readonly bigint[] = all.tokens;
    const keys: readonly string[] = all.keys;
    const seqs: readonly Sequencer[] = all.sequencers;
    all.signal.addEventListener("abort", () => console.log(all.lostKey, (all.signal.reason as LockLostError).key));
    void tokens, keys, seqs;
  }
  const none: Lease | null = await client.tryLockAll(["a", "b"]);
  void none;
  try {
    await client.tryReadLock("plain");
  } catch (e) {
    if (e instanceof ConflictError && e.reason === "LIMIT_CONFLICT") console.log(e.state?.kind, e.holders.map((h: Holder) => h.read));
  }
  const rs: Sequencer | null = await client.tryAcquire("rw/k", "00000000-0000-0000-0000-000000000000", { mode: "read" });
  void rs?.read;
  const seq = await client.tryAcquire("k", "00000000-0000-0000-0000-000000000000");
  await client.close();
  return seq?.token ?? 0n;
}
