// Plain values the library hands out: sequencers, holders, key states.

import { create } from "@bufbuild/protobuf";

import { LockKind, SequencerSchema, SessionBehavior } from "../gen/lockbroker/v1/types_pb.js";

const KIND_NAMES = {
  [LockKind.UNSPECIFIED]: "unspecified",
  [LockKind.NONE]: "none",
  [LockKind.LOCK]: "lock",
  [LockKind.SEMAPHORE]: "semaphore",
  [LockKind.FOREIGN]: "foreign",
  [LockKind.RWLOCK]: "rwlock",
};
const KIND_VALUES = Object.fromEntries(Object.entries(KIND_NAMES).map(([v, k]) => [k, Number(v)]));

/** Yielded once by a prefix watch after the state of every key under the prefix. */
export const SNAPSHOT_COMPLETE = Symbol.for("lockbroker.snapshotComplete");

export const kindName = (v) => KIND_NAMES[v] ?? "unspecified";

export function sequencerFromProto(p) {
  return Object.freeze({
    key: p.key,
    sessionId: p.sessionId,
    lockIndex: p.lockIndex,
    token: p.token,
    kind: kindName(p.kind),
    read: p.read,
  });
}

export function sequencerToProto(s) {
  return create(SequencerSchema, {
    key: s.key,
    sessionId: s.sessionId,
    lockIndex: BigInt(s.lockIndex ?? 0),
    token: BigInt(s.token),
    kind: KIND_VALUES[s.kind] ?? 0,
    read: Boolean(s.read),
  });
}

export function holderFromProto(p) {
  return Object.freeze({
    sessionId: p.sessionId,
    value: p.value,
    token: p.token,
    lockIndex: p.lockIndex,
    sessionName: p.sessionName,
    read: p.read,
  });
}

export function stateFromProto(p) {
  const holders = Object.freeze(p.holders.map(holderFromProto));
  return Object.freeze({
    key: p.key,
    kind: kindName(p.kind),
    limit: p.limit,
    holders,
    index: p.index,
    holder: holders[0] ?? null,
    held: holders.length > 0,
  });
}

export function queuedFromProto(p) {
  return Object.freeze({
    position: p.position,
    waiting: p.state?.waiting ?? 0,
    state: p.state ? stateFromProto(p.state) : null,
  });
}

const BEHAVIOR_NAMES = { [SessionBehavior.UNSPECIFIED]: "release", [SessionBehavior.RELEASE]: "release", [SessionBehavior.DELETE]: "delete" };

export function sessionInfoFromProto(p) {
  return Object.freeze({
    id: p.id,
    name: p.name,
    ttl: p.ttl ? Number(p.ttl.seconds) + p.ttl.nanos / 1e9 : 0,
    lockDelay: p.lockDelay ? Number(p.lockDelay.seconds) + p.lockDelay.nanos / 1e9 : 0,
    behavior: BEHAVIOR_NAMES[p.behavior] ?? "release",
    node: p.node,
    checks: Object.freeze([...p.checks]),
    createIndex: p.createIndex,
  });
}

export function sessionSummaryFromProto(p) {
  return Object.freeze({
    session: p.session ? sessionInfoFromProto(p.session) : undefined,
    brokerOwned: p.brokerOwned,
    holds: Object.freeze(p.holds.map(sequencerFromProto)),
  });
}
