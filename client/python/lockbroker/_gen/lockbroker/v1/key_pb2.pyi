# Copied from gen/python by client/python/tools/sync_gen.py. DO NOT EDIT.
from lockbroker._gen.buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
LOCK_KEY_FIELD_NUMBER: _ClassVar[int]
lock_key: _descriptor.FieldDescriptor
