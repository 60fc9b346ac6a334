from buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from lockbroker.v1 import key_pb2 as _key_pb2
from lockbroker.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ACQUIRE_KIND_LOCK: AcquireKind
ACQUIRE_KIND_READ: AcquireKind
ACQUIRE_KIND_SEMAPHORE: AcquireKind
ACQUIRE_KIND_UNSPECIFIED: AcquireKind
ACQUIRE_KIND_WRITE: AcquireKind
DESCRIPTOR: _descriptor.FileDescriptor
LOST_REASON_BROKER_SHUTDOWN: LostReason
LOST_REASON_DELETED_BY_OTHER: LostReason
LOST_REASON_LIMIT_CONFLICT: LostReason
LOST_REASON_RELEASED_BY_OTHER: LostReason
LOST_REASON_RENEWAL_FAILED: LostReason
LOST_REASON_REPLICA_CUT_OFF: LostReason
LOST_REASON_RESUMED_ELSEWHERE: LostReason
LOST_REASON_SESSION_INVALIDATED: LostReason
LOST_REASON_UNSPECIFIED: LostReason

class AcquireAcquired(_message.Message):
    __slots__ = ["guaranteed_for", "resumed", "sequencer", "sequencers"]
    GUARANTEED_FOR_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    guaranteed_for: _duration_pb2.Duration
    resumed: bool
    sequencer: _types_pb2.Sequencer
    sequencers: _containers.RepeatedCompositeFieldContainer[_types_pb2.Sequencer]
    def __init__(self, sequencer: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ..., guaranteed_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., resumed: bool = ..., sequencers: _Optional[_Iterable[_Union[_types_pb2.Sequencer, _Mapping]]] = ...) -> None: ...

class AcquireKeepalive(_message.Message):
    __slots__ = ["guaranteed_for"]
    GUARANTEED_FOR_FIELD_NUMBER: _ClassVar[int]
    guaranteed_for: _duration_pb2.Duration
    def __init__(self, guaranteed_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AcquireLost(_message.Message):
    __slots__ = ["detail", "guaranteed_for", "key", "reason"]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FOR_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    detail: str
    guaranteed_for: _duration_pb2.Duration
    key: str
    reason: LostReason
    def __init__(self, reason: _Optional[_Union[LostReason, str]] = ..., detail: _Optional[str] = ..., guaranteed_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class AcquireQueued(_message.Message):
    __slots__ = ["heartbeat", "lock_delay_remaining", "position", "session_id", "state"]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_REMAINING_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    heartbeat: _duration_pb2.Duration
    lock_delay_remaining: _duration_pb2.Duration
    position: int
    session_id: str
    state: _types_pb2.LockState
    def __init__(self, state: _Optional[_Union[_types_pb2.LockState, _Mapping]] = ..., lock_delay_remaining: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., session_id: _Optional[str] = ..., heartbeat: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., position: _Optional[int] = ...) -> None: ...

class AcquireReleased(_message.Message):
    __slots__ = ["sequencer", "sequencers"]
    SEQUENCERS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    sequencer: _types_pb2.Sequencer
    sequencers: _containers.RepeatedCompositeFieldContainer[_types_pb2.Sequencer]
    def __init__(self, sequencer: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ..., sequencers: _Optional[_Iterable[_Union[_types_pb2.Sequencer, _Mapping]]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ["fair", "key", "keys", "kind", "limit", "new_session", "resume", "session_id", "value", "wait_timeout"]
    FAIR_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NEW_SESSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    fair: bool
    key: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    kind: AcquireKind
    limit: int
    new_session: _types_pb2.SessionOptions
    resume: _types_pb2.Sequencer
    session_id: str
    value: bytes
    wait_timeout: _duration_pb2.Duration
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., limit: _Optional[int] = ..., wait_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., new_session: _Optional[_Union[_types_pb2.SessionOptions, _Mapping]] = ..., session_id: _Optional[str] = ..., resume: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ..., fair: bool = ..., kind: _Optional[_Union[AcquireKind, str]] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ["acquired", "keepalive", "lost", "queued", "released"]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    acquired: AcquireAcquired
    keepalive: AcquireKeepalive
    lost: AcquireLost
    queued: AcquireQueued
    released: AcquireReleased
    def __init__(self, queued: _Optional[_Union[AcquireQueued, _Mapping]] = ..., acquired: _Optional[_Union[AcquireAcquired, _Mapping]] = ..., keepalive: _Optional[_Union[AcquireKeepalive, _Mapping]] = ..., lost: _Optional[_Union[AcquireLost, _Mapping]] = ..., released: _Optional[_Union[AcquireReleased, _Mapping]] = ...) -> None: ...

class CheckSequencerRequest(_message.Message):
    __slots__ = ["sequencer"]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    sequencer: _types_pb2.Sequencer
    def __init__(self, sequencer: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ...) -> None: ...

class CheckSequencerResponse(_message.Message):
    __slots__ = ["current", "state"]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    current: bool
    state: _types_pb2.LockState
    def __init__(self, current: bool = ..., state: _Optional[_Union[_types_pb2.LockState, _Mapping]] = ...) -> None: ...

class GetLockRequest(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class GetLockResponse(_message.Message):
    __slots__ = ["state"]
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _types_pb2.LockState
    def __init__(self, state: _Optional[_Union[_types_pb2.LockState, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["key", "session_id", "token"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    session_id: str
    token: int
    def __init__(self, key: _Optional[str] = ..., session_id: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ["released"]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: bool = ...) -> None: ...

class SetValueRequest(_message.Message):
    __slots__ = ["key", "session_id", "token", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    session_id: str
    token: int
    value: bytes
    def __init__(self, key: _Optional[str] = ..., session_id: _Optional[str] = ..., value: _Optional[bytes] = ..., token: _Optional[int] = ...) -> None: ...

class SetValueResponse(_message.Message):
    __slots__ = ["sequencer"]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    sequencer: _types_pb2.Sequencer
    def __init__(self, sequencer: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ...) -> None: ...

class TryAcquireRequest(_message.Message):
    __slots__ = ["key", "kind", "limit", "session_id", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: AcquireKind
    limit: int
    session_id: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., limit: _Optional[int] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[AcquireKind, str]] = ...) -> None: ...

class TryAcquireResponse(_message.Message):
    __slots__ = ["sequencer"]
    SEQUENCER_FIELD_NUMBER: _ClassVar[int]
    sequencer: _types_pb2.Sequencer
    def __init__(self, sequencer: _Optional[_Union[_types_pb2.Sequencer, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["key", "prefix"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    key: str
    prefix: bool
    def __init__(self, key: _Optional[str] = ..., prefix: bool = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ["skipped", "snapshot_complete", "state"]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    skipped: int
    snapshot_complete: bool
    state: _types_pb2.LockState
    def __init__(self, state: _Optional[_Union[_types_pb2.LockState, _Mapping]] = ..., skipped: _Optional[int] = ..., snapshot_complete: bool = ...) -> None: ...

class AcquireKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class LostReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
