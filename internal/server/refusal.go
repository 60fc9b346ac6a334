package server

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// The refusals of the access layer, with their google.rpc details
// (AIP-193): an ErrorInfo always, QuotaFailure and RetryInfo for quotas.

// unauthenticated is UNAUTHENTICATED (reason UNAUTHENTICATED).
func unauthenticated(msg string) error {
	return withDetails(status.New(codes.Unauthenticated, msg), []protoadapt.MessageV1{
		&errdetails.ErrorInfo{Reason: string(broker.ReasonUnauthenticated), Domain: ErrorDomain},
	}).Err()
}

// denial is a PERMISSION_DENIED being built.
type denial struct {
	msg string
	key string
}

// permissionDenied is PERMISSION_DENIED (reason PERMISSION_DENIED).
func permissionDenied(format string, args ...any) *denial {
	return &denial{msg: fmt.Sprintf(format, args...)}
}

// withKey names the refused key in the ErrorInfo's metadata.
func (d *denial) withKey(key string) *denial {
	d.key = key
	return d
}

func (d *denial) status() *status.Status {
	info := &errdetails.ErrorInfo{Reason: string(broker.ReasonPermissionDenied), Domain: ErrorDomain}
	if d.key != "" {
		info.Metadata = map[string]string{"key": d.key}
	}
	return withDetails(status.New(codes.PermissionDenied, d.msg), []protoadapt.MessageV1{info})
}

func (d *denial) Error() string { return d.status().Err().Error() }

// GRPCStatus makes the denial a gRPC status error.
func (d *denial) GRPCStatus() *status.Status { return d.status() }

// quotaExceeded is RESOURCE_EXHAUSTED (reason QUOTA_EXCEEDED) with a
// QuotaFailure naming the tenant and quota, and a RetryInfo.
func quotaExceeded(tenant, quota, limit string, retry time.Duration) error {
	msg := fmt.Sprintf("tenant %q is over its %s quota (%s); retry in %v", tenant, quota, limit, retry.Round(time.Millisecond))
	return withDetails(status.New(codes.ResourceExhausted, msg), []protoadapt.MessageV1{
		&errdetails.ErrorInfo{Reason: string(broker.ReasonQuotaExceeded), Domain: ErrorDomain, Metadata: map[string]string{
			"tenant": tenant, "quota": quota, "retryAfterMs": strconv.FormatInt(retry.Milliseconds(), 10),
		}},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     "tenant:" + tenant,
			Description: quota + ": " + limit,
		}}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)},
	}).Err()
}
