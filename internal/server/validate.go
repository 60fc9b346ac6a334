package server

import (
	"errors"
	"strings"
	"sync"

	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// validation checks every request before a handler sees it: that it could
// be decoded (see requestCodec) and that it keeps the proto's rules
// (protovalidate's, or for the critical path's requests the same rules in
// plain Go: fastViolations). Both
// failures are INVALID_ARGUMENT with a BadRequest (one field violation per
// problem) and an ErrorInfo INVALID_ARGUMENT; nothing reaches the domain.
type validation struct {
	validator protovalidate.Validator
	codec     *requestCodec
}

// check returns nil or the INVALID_ARGUMENT status for req.
func (v *validation) check(req any) error {
	msg, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	if err := v.codec.takeError(msg); err != nil {
		return invalidStatus("request: cannot be decoded: "+err.Error(), &errdetails.BadRequest_FieldViolation{
			Description: "the request is not a valid protobuf encoding of " + string(msg.ProtoReflect().Descriptor().FullName()) + ": " + err.Error(),
			Reason:      "decode",
		}).Err()
	}
	if vs, ok := fastViolations(msg); ok {
		return fastStatus(vs)
	}
	return v.reference(msg)
}

// fastStatus is the INVALID_ARGUMENT status of vs, as reference words
// it for the same violations; nil for none.
func fastStatus(vs []violation) error {
	if len(vs) == 0 {
		return nil
	}
	fvs := make([]*errdetails.BadRequest_FieldViolation, 0, len(vs))
	var msg strings.Builder
	if len(vs) == 1 {
		msg.WriteString("validation error: ")
	} else {
		msg.WriteString("validation errors:")
	}
	for _, vi := range vs {
		fvs = append(fvs, &errdetails.BadRequest_FieldViolation{Field: vi.field, Description: vi.message, Reason: vi.rule})
		if len(vs) > 1 {
			msg.WriteString("\n - ")
		}
		msg.WriteString(vi.field + ": " + vi.message)
	}
	return invalidStatus(msg.String(), fvs...).Err()
}

// reference checks msg with protovalidate: every message fastViolations
// does not know, and the reference the fast checks are tested against.
func (v *validation) reference(msg proto.Message) error {
	err := v.validator.Validate(msg)
	if err == nil {
		return nil
	}
	var ve *protovalidate.ValidationError
	if !errors.As(err, &ve) {
		// A rule that does not compile: a bug in the proto's rules.
		return status.Error(codes.Internal, err.Error())
	}
	fvs := make([]*errdetails.BadRequest_FieldViolation, 0, len(ve.Violations))
	for _, vi := range ve.Violations {
		fvs = append(fvs, &errdetails.BadRequest_FieldViolation{
			Field:       protovalidate.FieldPathString(vi.Proto.GetField()),
			Description: vi.Proto.GetMessage(),
			Reason:      vi.Proto.GetRuleId(),
		})
	}
	return invalidStatus(ve.Error(), fvs...).Err()
}

// invalidStatus is INVALID_ARGUMENT with msg, an ErrorInfo naming the
// first field and a BadRequest with fvs.
func invalidStatus(msg string, fvs ...*errdetails.BadRequest_FieldViolation) *status.Status {
	info := &errdetails.ErrorInfo{Reason: string(broker.ReasonInvalidArgument), Domain: ErrorDomain}
	var fields []string
	for _, fv := range fvs {
		if fv.Field != "" {
			fields = append(fields, fv.Field)
		}
	}
	if len(fields) > 0 {
		info.Metadata = map[string]string{"field": strings.Join(fields, ",")}
	}
	return withDetails(status.New(codes.InvalidArgument, msg),
		[]protoadapt.MessageV1{info, &errdetails.BadRequest{FieldViolations: fvs}})
}

// requestCodec is grpc-go's proto codec, except that a request that does
// not decode (for instance a string field holding invalid UTF-8) is not
// refused by grpc-go as INTERNAL: the error is kept for the message, and
// the validation interceptor, which sees every request, answers
// INVALID_ARGUMENT. Encoding is unchanged.
type requestCodec struct {
	encoding.CodecV2
	mu     sync.Mutex
	failed map[proto.Message]error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{CodecV2: encoding.GetCodecV2(gproto.Name), failed: map[proto.Message]error{}}
}

// Unmarshal implements encoding.CodecV2.
func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	msg, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	proto.Reset(msg)
	c.mu.Lock()
	c.failed[msg] = err
	c.mu.Unlock()
	return nil
}

// takeError returns and forgets the decode error of msg, if any.
func (c *requestCodec) takeError(msg proto.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err, ok := c.failed[msg]
	if ok {
		delete(c.failed, msg)
	}
	return err
}
