"""Plain values the library hands out: sequencers, holders, key states."""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ._gen.lockbroker.v1 import types_pb2

_KINDS = {
    types_pb2.LOCK_KIND_UNSPECIFIED: "unspecified",
    types_pb2.LOCK_KIND_NONE: "none",
    types_pb2.LOCK_KIND_LOCK: "lock",
    types_pb2.LOCK_KIND_SEMAPHORE: "semaphore",
    types_pb2.LOCK_KIND_FOREIGN: "foreign",
    types_pb2.LOCK_KIND_RWLOCK: "rwlock",
}
_KIND_VALUES = {v: k for k, v in _KINDS.items()}


def kind_name(value):
    return _KINDS.get(value, "unspecified")


@dataclass(frozen=True)
class Sequencer:
    """One grant of a lock or semaphore slot (Chubby's sequencer).

    Pass `token` to the resources you protect: it strictly increases with
    every new grant of the key, so a resource that refuses tokens lower
    than the highest it has seen is safe even from a holder that lost its
    lease without knowing it yet.
    """

    key: str
    session_id: str
    lock_index: int
    token: int
    kind: str  # "lock", "semaphore" or "rwlock"
    #: A read-write lock's grant: True for a read (shared) hold, False for
    #: a write (exclusive) one; False for other kinds.
    read: bool = False

    @classmethod
    def from_proto(cls, p):
        return cls(key=p.key, session_id=p.session_id, lock_index=p.lock_index, token=p.token, kind=kind_name(p.kind),
                   read=p.read)

    def to_proto(self):
        return types_pb2.Sequencer(key=self.key, session_id=self.session_id, lock_index=self.lock_index,
                                   token=self.token, kind=_KIND_VALUES.get(self.kind, 0), read=self.read)


@dataclass(frozen=True)
class Holder:
    """A current holder of a key. `read` is True for a reader of a
    read-write lock (False for its writer, and for other kinds)."""

    session_id: str
    value: bytes
    token: int
    lock_index: int
    session_name: str = ""
    read: bool = False

    @classmethod
    def from_proto(cls, p):
        return cls(session_id=p.session_id, value=p.value, token=p.token, lock_index=p.lock_index,
                   session_name=p.session_name, read=p.read)


@dataclass(frozen=True)
class State:
    """The state of a key: what it is and who holds it.

    `kind` is "none" (nothing there: no holder), "lock", "semaphore",
    "rwlock" (a read-write lock: its readers, or its one writer; see
    Holder.read) or "foreign" (someone else's data). `holders` is empty when nobody holds
    the key — an explicit state, so a watcher sees a leader resign or fail.
    """

    key: str
    kind: str
    limit: int
    holders: Tuple[Holder, ...] = field(default_factory=tuple)
    index: int = 0

    @classmethod
    def from_proto(cls, p):
        return cls(key=p.key, kind=kind_name(p.kind), limit=p.limit,
                   holders=tuple(Holder.from_proto(h) for h in p.holders), index=p.index)

    @property
    def holder(self) -> Optional[Holder]:
        """The oldest holder, or None when nobody holds the key."""
        return self.holders[0] if self.holders else None

    @property
    def held(self) -> bool:
        return bool(self.holders)

    def session_ids(self) -> List[str]:
        return [h.session_id for h in self.holders]


@dataclass(frozen=True)
class Queued:
    """What a waiting lock() or semaphore() hears while it waits (the
    broker's `queued` event), handed to its `on_queued` callback.

    `position` is the request's place in the key's shared queue, which
    every broker replica serves in arrival order: 1 is next, 0 when the
    broker does not say. A wait that moves to another replica keeps it.
    `waiting` is how many broker requests wait for the key in all;
    `state` is who holds it now.
    """

    position: int
    waiting: int
    state: State

    @classmethod
    def from_proto(cls, p):
        return cls(position=p.position, waiting=p.state.waiting, state=State.from_proto(p.state))


class _SnapshotComplete:
    """Yielded once by a prefix watch after the state of every key under
    the prefix: every later state is a change."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "lockbroker.SNAPSHOT_COMPLETE"


SNAPSHOT_COMPLETE = _SnapshotComplete()
