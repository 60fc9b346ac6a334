"""Client-owned sessions as plain values."""

from dataclasses import dataclass, field
from typing import Tuple

from . import _core
from ._types import Sequencer

_BEHAVIOR_NAMES = {0: "release", 1: "release", 2: "delete"}


@dataclass(frozen=True)
class SessionInfo:
    """A Consul session (SessionService.GetSession)."""

    id: str
    name: str
    ttl: float
    lock_delay: float
    behavior: str
    node: str
    checks: Tuple[str, ...] = ()
    create_index: int = 0


@dataclass(frozen=True)
class SessionSummary:
    """A session the broker created and what it holds (ListSessions)."""

    session: SessionInfo
    broker_owned: bool
    holds: Tuple[Sequencer, ...] = field(default_factory=tuple)


def session_info(p) -> SessionInfo:
    return SessionInfo(id=p.id, name=p.name, ttl=_core.seconds(p.ttl), lock_delay=_core.seconds(p.lock_delay),
                       behavior=_BEHAVIOR_NAMES.get(p.behavior, "release"), node=p.node, checks=tuple(p.checks),
                       create_index=p.create_index)


def session_summary(p) -> SessionSummary:
    return SessionSummary(session=session_info(p.session), broker_owned=p.broker_owned,
                          holds=tuple(Sequencer.from_proto(s) for s in p.holds))
