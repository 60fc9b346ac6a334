# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
from lockbroker._gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from lockbroker._gen.lockbroker.v1 import key_pb2 as _key_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
LOCK_KIND_FOREIGN: LockKind
LOCK_KIND_LOCK: LockKind
LOCK_KIND_NONE: LockKind
LOCK_KIND_RWLOCK: LockKind
LOCK_KIND_SEMAPHORE: LockKind
LOCK_KIND_UNSPECIFIED: LockKind
SESSION_BEHAVIOR_DELETE: SessionBehavior
SESSION_BEHAVIOR_RELEASE: SessionBehavior
SESSION_BEHAVIOR_UNSPECIFIED: SessionBehavior

class Holder(_message.Message):
    __slots__ = ["lock_index", "read", "session_id", "session_name", "token", "value"]
    LOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    lock_index: int
    read: bool
    session_id: str
    session_name: str
    token: int
    value: bytes
    def __init__(self, session_id: _Optional[str] = ..., value: _Optional[bytes] = ..., token: _Optional[int] = ..., lock_index: _Optional[int] = ..., session_name: _Optional[str] = ..., read: bool = ...) -> None: ...

class LockState(_message.Message):
    __slots__ = ["holders", "index", "key", "kind", "limit", "waiting"]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[Holder]
    index: int
    key: str
    kind: LockKind
    limit: int
    waiting: int
    def __init__(self, key: _Optional[str] = ..., kind: _Optional[_Union[LockKind, str]] = ..., limit: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., index: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class Sequencer(_message.Message):
    __slots__ = ["key", "kind", "lock_index", "read", "session_id", "token"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    kind: LockKind
    lock_index: int
    read: bool
    session_id: str
    token: int
    def __init__(self, key: _Optional[str] = ..., session_id: _Optional[str] = ..., lock_index: _Optional[int] = ..., token: _Optional[int] = ..., kind: _Optional[_Union[LockKind, str]] = ..., read: bool = ...) -> None: ...

class SessionOptions(_message.Message):
    __slots__ = ["behavior", "checks", "lock_delay", "name", "ttl"]
    BEHAVIOR_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    behavior: SessionBehavior
    checks: _containers.RepeatedScalarFieldContainer[str]
    lock_delay: _duration_pb2.Duration
    name: str
    ttl: _duration_pb2.Duration
    def __init__(self, ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., lock_delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., behavior: _Optional[_Union[SessionBehavior, str]] = ..., checks: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ...) -> None: ...

class SessionBehavior(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class LockKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
