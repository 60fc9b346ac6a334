# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
ERROR_REASON_BROKER_SHUTTING_DOWN: ErrorReason
ERROR_REASON_CONSUL_PERMISSION_DENIED: ErrorReason
ERROR_REASON_CONSUL_REJECTED: ErrorReason
ERROR_REASON_CONSUL_UNAVAILABLE: ErrorReason
ERROR_REASON_FOREIGN_FLAGS: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_LIMIT_CONFLICT: ErrorReason
ERROR_REASON_LOCK_DELAY: ErrorReason
ERROR_REASON_LOCK_HELD: ErrorReason
ERROR_REASON_MALFORMED_SEMAPHORE: ErrorReason
ERROR_REASON_NOT_HOLDER: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_QUOTA_EXCEEDED: ErrorReason
ERROR_REASON_REPLICA_CUT_OFF: ErrorReason
ERROR_REASON_RESUME_REFUSED: ErrorReason
ERROR_REASON_SESSION_LOST: ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_WAIT_TIMEOUT: ErrorReason

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
