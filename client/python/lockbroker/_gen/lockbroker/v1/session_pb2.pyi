# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
from lockbroker._gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from lockbroker._gen.lockbroker.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ["options"]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _types_pb2.SessionOptions
    def __init__(self, options: _Optional[_Union[_types_pb2.SessionOptions, _Mapping]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ["session"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class DestroySessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DestroySessionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ["session"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ["sessions"]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionSummary]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionSummary, _Mapping]]] = ...) -> None: ...

class RenewSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class RenewSessionResponse(_message.Message):
    __slots__ = ["guaranteed_for", "session"]
    GUARANTEED_FOR_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    guaranteed_for: _duration_pb2.Duration
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., guaranteed_for: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ["behavior", "checks", "create_index", "id", "lock_delay", "name", "node", "ttl"]
    BEHAVIOR_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    CREATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    behavior: _types_pb2.SessionBehavior
    checks: _containers.RepeatedScalarFieldContainer[str]
    create_index: int
    id: str
    lock_delay: _duration_pb2.Duration
    name: str
    node: str
    ttl: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., lock_delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., behavior: _Optional[_Union[_types_pb2.SessionBehavior, str]] = ..., node: _Optional[str] = ..., checks: _Optional[_Iterable[str]] = ..., create_index: _Optional[int] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ["broker_owned", "holds", "session"]
    BROKER_OWNED_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    broker_owned: bool
    holds: _containers.RepeatedCompositeFieldContainer[_types_pb2.Sequencer]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., broker_owned: bool = ..., holds: _Optional[_Iterable[_Union[_types_pb2.Sequencer, _Mapping]]] = ...) -> None: ...
