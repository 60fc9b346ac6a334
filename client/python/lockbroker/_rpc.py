"""google.rpc.Status and the error details the broker sends (AIP-193).

gRPC carries a status's details in the `grpc-status-details-bin` trailer: a
serialized google.rpc.Status whose `details` are google.protobuf.Any. The
message classes are built here from descriptors written out in code, in a
descriptor pool of their own: the package needs neither
googleapis-common-protos nor protoc, and cannot clash with another copy of
google/rpc/*.proto loaded in the same process. Only the fields the client
reads are declared; protobuf keeps the rest as unknown fields.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _field(name, number, ftype, label=_OPT, type_name=None):
    f = _F(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name
    return f


def _message(name, *fields, nested=(), map_entry=False):
    m = descriptor_pb2.DescriptorProto(name=name, field=list(fields), nested_type=list(nested))
    if map_entry:
        m.options.map_entry = True
    return m


def _build():
    pool = descriptor_pool.DescriptorPool()
    for wkt in (duration_pb2, ):
        fdp = descriptor_pb2.FileDescriptorProto()
        wkt.DESCRIPTOR.CopyToProto(fdp)
        pool.Add(fdp)
    any_file = descriptor_pb2.FileDescriptorProto(
        name="google/protobuf/any.proto", package="google.protobuf", syntax="proto3",
        message_type=[_message("Any", _field("type_url", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_BYTES))],
    )
    pool.Add(any_file)
    rpc = descriptor_pb2.FileDescriptorProto(
        name="google/rpc/lockbroker_client_status.proto",
        package="google.rpc",
        syntax="proto3",
        dependency=["google/protobuf/any.proto", "google/protobuf/duration.proto"],
        message_type=[
            _message("Status",
                     _field("code", 1, _F.TYPE_INT32),
                     _field("message", 2, _F.TYPE_STRING),
                     _field("details", 3, _F.TYPE_MESSAGE, _REP, ".google.protobuf.Any")),
            _message("ErrorInfo",
                     _field("reason", 1, _F.TYPE_STRING),
                     _field("domain", 2, _F.TYPE_STRING),
                     _field("metadata", 3, _F.TYPE_MESSAGE, _REP, ".google.rpc.ErrorInfo.MetadataEntry"),
                     nested=[_message("MetadataEntry",
                                      _field("key", 1, _F.TYPE_STRING),
                                      _field("value", 2, _F.TYPE_STRING),
                                      map_entry=True)]),
            _message("RetryInfo",
                     _field("retry_delay", 1, _F.TYPE_MESSAGE, type_name=".google.protobuf.Duration")),
            _message("BadRequest",
                     _field("field_violations", 1, _F.TYPE_MESSAGE, _REP, ".google.rpc.BadRequest.FieldViolation"),
                     nested=[_message("FieldViolation",
                                      _field("field", 1, _F.TYPE_STRING),
                                      _field("description", 2, _F.TYPE_STRING),
                                      _field("reason", 3, _F.TYPE_STRING))]),
            _message("QuotaFailure",
                     _field("violations", 1, _F.TYPE_MESSAGE, _REP, ".google.rpc.QuotaFailure.Violation"),
                     nested=[_message("Violation",
                                      _field("subject", 1, _F.TYPE_STRING),
                                      _field("description", 2, _F.TYPE_STRING))]),
        ],
    )
    pool.Add(rpc)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:  # protobuf < 4.22
        factory = message_factory.MessageFactory(pool)
        get = factory.GetPrototype
    return {name: get(pool.FindMessageTypeByName("google.rpc." + name))
            for name in ("Status", "ErrorInfo", "RetryInfo", "BadRequest", "QuotaFailure")}


_CLASSES = _build()
Status = _CLASSES["Status"]
ErrorInfo = _CLASSES["ErrorInfo"]
RetryInfo = _CLASSES["RetryInfo"]
BadRequest = _CLASSES["BadRequest"]
QuotaFailure = _CLASSES["QuotaFailure"]

#: Type names (the part of an Any's type_url after the last "/") → class.
DETAIL_TYPES = {f"google.rpc.{name}": cls for name, cls in _CLASSES.items() if name != "Status"}
