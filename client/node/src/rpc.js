// google.rpc.Status details the broker sends with every error (AIP-193):
// ErrorInfo, RetryInfo, BadRequest, QuotaFailure. Connect already decodes
// the grpc-status-details-bin trailer into ConnectError.details ({ type,
// value }); the message schemas here decode each detail. They are built
// from descriptors written out in code, in a registry of their own, so the
// package needs no copy of googleapis and cannot clash with one. Only the
// fields the client reads are declared.

import { create, createFileRegistry } from "@bufbuild/protobuf";
import {
  FieldDescriptorProto_Label as Label,
  FieldDescriptorProto_Type as Type,
  FileDescriptorProtoSchema,
  file_google_protobuf_duration,
} from "@bufbuild/protobuf/wkt";

const field = (name, number, type, opts = {}) => ({
  name,
  number,
  type,
  label: opts.repeated ? Label.REPEATED : Label.OPTIONAL,
  typeName: opts.typeName,
  jsonName: name.replace(/_([a-z])/g, (_, c) => c.toUpperCase()),
});

const file = create(FileDescriptorProtoSchema, {
  name: "google/rpc/lockbroker_client_status.proto",
  package: "google.rpc",
  syntax: "proto3",
  dependency: ["google/protobuf/duration.proto"],
  messageType: [
    {
      name: "ErrorInfo",
      field: [
        field("reason", 1, Type.STRING),
        field("domain", 2, Type.STRING),
        field("metadata", 3, Type.MESSAGE, { repeated: true, typeName: ".google.rpc.ErrorInfo.MetadataEntry" }),
      ],
      nestedType: [
        {
          name: "MetadataEntry",
          field: [field("key", 1, Type.STRING), field("value", 2, Type.STRING)],
          options: { mapEntry: true },
        },
      ],
    },
    { name: "RetryInfo", field: [field("retry_delay", 1, Type.MESSAGE, { typeName: ".google.protobuf.Duration" })] },
    {
      name: "BadRequest",
      field: [field("field_violations", 1, Type.MESSAGE, { repeated: true, typeName: ".google.rpc.BadRequest.FieldViolation" })],
      nestedType: [
        {
          name: "FieldViolation",
          field: [field("field", 1, Type.STRING), field("description", 2, Type.STRING), field("reason", 3, Type.STRING)],
        },
      ],
    },
    {
      name: "QuotaFailure",
      field: [field("violations", 1, Type.MESSAGE, { repeated: true, typeName: ".google.rpc.QuotaFailure.Violation" })],
      nestedType: [{ name: "Violation", field: [field("subject", 1, Type.STRING), field("description", 2, Type.STRING)] }],
    },
  ],
});

export const registry = createFileRegistry(file, (name) =>
  name === "google/protobuf/duration.proto" ? file_google_protobuf_duration : undefined,
);

export const ErrorInfoSchema = registry.getMessage("google.rpc.ErrorInfo");
export const RetryInfoSchema = registry.getMessage("google.rpc.RetryInfo");
export const BadRequestSchema = registry.getMessage("google.rpc.BadRequest");
export const QuotaFailureSchema = registry.getMessage("google.rpc.QuotaFailure");
