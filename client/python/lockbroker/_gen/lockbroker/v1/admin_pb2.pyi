# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
from lockbroker._gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from lockbroker._gen.lockbroker.v1 import key_pb2 as _key_pb2
from lockbroker._gen.lockbroker.v1 import session_pb2 as _session_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdminServiceListSessionsRequest(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class AdminServiceListSessionsResponse(_message.Message):
    __slots__ = ["sessions"]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[TenantSession]
    def __init__(self, sessions: _Optional[_Iterable[_Union[TenantSession, _Mapping]]] = ...) -> None: ...

class ForceReleaseRequest(_message.Message):
    __slots__ = ["key"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ForceReleaseResponse(_message.Message):
    __slots__ = ["released"]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class HoldInfo(_message.Message):
    __slots__ = ["key", "position", "read", "replica", "session_id", "session_name", "since", "tenant", "token", "waiting", "with_keys"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_NAME_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    WITH_KEYS_FIELD_NUMBER: _ClassVar[int]
    key: str
    position: int
    read: bool
    replica: str
    session_id: str
    session_name: str
    since: _timestamp_pb2.Timestamp
    tenant: str
    token: int
    waiting: bool
    with_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., session_id: _Optional[str] = ..., session_name: _Optional[str] = ..., token: _Optional[int] = ..., since: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., replica: _Optional[str] = ..., waiting: bool = ..., position: _Optional[int] = ..., read: bool = ..., with_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ListHoldsRequest(_message.Message):
    __slots__ = ["key_prefix"]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    key_prefix: str
    def __init__(self, key_prefix: _Optional[str] = ...) -> None: ...

class ListHoldsResponse(_message.Message):
    __slots__ = ["holds"]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    holds: _containers.RepeatedCompositeFieldContainer[HoldInfo]
    def __init__(self, holds: _Optional[_Iterable[_Union[HoldInfo, _Mapping]]] = ...) -> None: ...

class TenantSession(_message.Message):
    __slots__ = ["summary", "tenant"]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    summary: _session_pb2.SessionSummary
    tenant: str
    def __init__(self, tenant: _Optional[str] = ..., summary: _Optional[_Union[_session_pb2.SessionSummary, _Mapping]] = ...) -> None: ...
