// Package server is the thin gRPC layer of lockbroker: it converts
// requests, calls internal/broker, maps errors and sends results.
package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// ErrorDomain is the domain of every google.rpc.ErrorInfo the broker sends.
const ErrorDomain = "lockbroker.v1"

// DefaultRetryDelay is the RetryInfo sent with UNAVAILABLE when neither
// Consul nor the domain said how long to wait.
const DefaultRetryDelay = time.Second

// sentinelCodes gives the code of each domain sentinel, and the reason to
// use when the error does not carry one of its own. The order matters only
// for errors that wrap more than one sentinel: the first match wins.
var sentinelCodes = []struct {
	err    error
	code   codes.Code
	reason broker.Reason
}{
	{broker.ErrInvalid, codes.InvalidArgument, broker.ReasonInvalidArgument},
	{broker.ErrBusy, codes.Aborted, broker.ReasonLockHeld},
	{broker.ErrAborted, codes.Aborted, broker.ReasonSessionLost},
	{broker.ErrTimeout, codes.DeadlineExceeded, broker.ReasonWaitTimeout},
	{broker.ErrConflict, codes.FailedPrecondition, broker.ReasonLimitConflict},
	{broker.ErrNotHolder, codes.FailedPrecondition, broker.ReasonNotHolder},
	{broker.ErrSessionNotFound, codes.NotFound, broker.ReasonSessionNotFound},
	{broker.ErrPermission, codes.PermissionDenied, broker.ReasonConsulPermissionDenied},
	{broker.ErrShutdown, codes.Unavailable, broker.ReasonBrokerShuttingDown},
	{broker.ErrUnavailable, codes.Unavailable, broker.ReasonConsulUnavailable},
}

// toStatus maps any error of the domain to a gRPC status error with
// google.rpc details (AIP-193): ErrorInfo (reason, domain "lockbroker.v1",
// metadata) always; BadRequest for INVALID_ARGUMENT; the key's LockState
// when the error carries one; RetryInfo for UNAVAILABLE and LOCK_DELAY.
//
// The choice of code follows grpc-go codes.go: UNAVAILABLE when retrying
// the same call may work, ABORTED when the caller should start again at a
// higher level, FAILED_PRECONDITION when something must change first. A
// Consul failure is never INTERNAL: Consul unreachable, 429 or 5xx is
// UNAVAILABLE, an ACL denial PERMISSION_DENIED, and a request Consul
// refused as malformed or too large FAILED_PRECONDITION (retrying cannot
// help until the broker or Consul's limits change; logged as an error).
// Context errors go through status.FromContextError. An error that is
// already a status passes through. Anything else is a broker bug: INTERNAL,
// logged here once.
func toStatus(log *zap.Logger, err error) error {
	if err == nil {
		return nil
	}
	return statusOf(log, err).Err()
}

// statusOf is toStatus's status. err must not be nil.
func statusOf(log *zap.Logger, err error) *status.Status {
	code, reason, known := classify(err)
	if !known {
		if st, ok := status.FromError(err); ok {
			return st
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return status.FromContextError(err)
		}
		log.Error("internal error", zap.Error(err), zap.String("error_type", fmt.Sprintf("%T", err)))
		code, reason = codes.Internal, broker.ReasonInternal
	}
	return withDetails(status.New(code, err.Error()), details(err, code, reason))
}

// classify picks the code and reason of err; known is false for errors
// the broker does not produce (statuses, context errors, bugs).
func classify(err error) (code codes.Code, reason broker.Reason, known bool) {
	own, hasOwn := broker.ReasonOf(err)
	for _, s := range sentinelCodes {
		if errors.Is(err, s.err) {
			if !hasOwn {
				own = s.reason
			}
			return s.code, own, true
		}
	}
	var se *broker.StoreError
	if errors.As(err, &se) {
		// StoreUnavailable and StorePermissionDenied matched a sentinel.
		return codes.FailedPrecondition, broker.ReasonConsulRejected, true
	}
	var te *broker.TxnError
	if errors.As(err, &te) {
		// The domain decides what a rolled-back transaction means; one that
		// reaches this layer is mapped by what failed in it.
		switch {
		case te.Has(broker.TxnSessionInvalid):
			return codes.NotFound, broker.ReasonSessionNotFound, true
		case te.Has(broker.TxnLockHeld):
			return codes.Aborted, broker.ReasonLockHeld, true
		case te.Has(broker.TxnLockDelay):
			return codes.Aborted, broker.ReasonLockDelay, true
		case te.Has(broker.TxnNotHeld):
			return codes.FailedPrecondition, broker.ReasonNotHolder, true
		default: // an index moved under us: start again
			return codes.Aborted, broker.ReasonSessionLost, true
		}
	}
	return codes.Unknown, "", false
}

// details builds the google.rpc details of err.
func details(err error, code codes.Code, reason broker.Reason) []protoadapt.MessageV1 {
	info := &errdetails.ErrorInfo{Reason: string(reason), Domain: ErrorDomain}
	meta := map[string]string{}
	var (
		de         *broker.Error
		se         *broker.StoreError
		retryAfter time.Duration
		out        []protoadapt.MessageV1
	)
	if errors.As(err, &de) {
		retryAfter = de.RetryAfter
		if de.Field != "" {
			meta["field"] = de.Field
		}
		if de.State != nil && de.State.Key != "" {
			meta["key"] = de.State.Key
		}
	}
	if errors.As(err, &se) {
		meta["consulOperation"] = se.Op
		retryAfter = max(retryAfter, se.RetryAfter)
	}
	if len(meta) > 0 {
		info.Metadata = meta
	}
	out = append(out, info)
	if code == codes.InvalidArgument {
		fv := &errdetails.BadRequest_FieldViolation{Description: err.Error(), Reason: string(reason)}
		if de != nil {
			fv.Field = de.Field
			fv.Description = strings.TrimPrefix(de.Msg, de.Field+": ")
		}
		out = append(out, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{fv}})
	}
	if de != nil && de.State != nil {
		out = append(out, protoadapt.MessageV1Of(stateToProto(de.State)))
	}
	switch {
	case code == codes.Unavailable:
		if retryAfter <= 0 {
			retryAfter = DefaultRetryDelay
		}
		out = append(out, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	case retryAfter > 0:
		out = append(out, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	return out
}

// withDetails attaches ds to st. Details are plain messages, so attaching
// cannot fail; if it ever did, the status goes without them.
func withDetails(st *status.Status, ds []protoadapt.MessageV1) *status.Status {
	if withD, err := st.WithDetails(ds...); err == nil {
		return withD
	}
	return st
}
