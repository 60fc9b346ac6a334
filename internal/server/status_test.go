package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// statusDetails is what a client reads from a status's details.
type statusDetails struct {
	info       *errdetails.ErrorInfo
	badRequest *errdetails.BadRequest
	retry      *errdetails.RetryInfo
	state      *lockbrokerv1.LockState
	others     []any
}

func readDetails(t *testing.T, st *status.Status) statusDetails {
	t.Helper()
	var d statusDetails
	for _, x := range st.Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			require.Nil(t, d.info, "one ErrorInfo")
			d.info = x
		case *errdetails.BadRequest:
			d.badRequest = x
		case *errdetails.RetryInfo:
			d.retry = x
		case *lockbrokerv1.LockState:
			d.state = x
		case error:
			t.Fatalf("undecodable detail: %v", x)
		default:
			d.others = append(d.others, x)
		}
	}
	return d
}

func TestToStatus(t *testing.T) {
	held := &broker.State{Key: "jobs/a", Kind: broker.KindLock, Holders: []broker.Holder{{Session: "s-1", Value: []byte("host-1"), Token: 42, LockIndex: 1}}}
	busy := &broker.Error{Kind: broker.ErrBusy, Reason: broker.ReasonLockHeld, Msg: `key "jobs/a" held by session s-1`, State: held}
	tests := []struct {
		name      string
		err       error
		code      codes.Code
		reason    string // "" : no details expected
		meta      map[string]string
		field     string        // BadRequest field, for INVALID_ARGUMENT
		retry     time.Duration // 0: no RetryInfo
		withState bool
		logged    bool // logged as an error
	}{
		{name: "busy", err: busy, code: codes.Aborted, reason: "LOCK_HELD", meta: map[string]string{"key": "jobs/a"}, withState: true},
		{name: "busy wrapped", err: fmt.Errorf("acquire: %w", busy), code: codes.Aborted, reason: "LOCK_HELD", meta: map[string]string{"key": "jobs/a"}, withState: true},
		{name: "lock delay", err: &broker.Error{Kind: broker.ErrBusy, Reason: broker.ReasonLockDelay, Msg: "lock-delay", RetryAfter: 3 * time.Second},
			code: codes.Aborted, reason: "LOCK_DELAY", retry: 3 * time.Second},
		{name: "wait timeout", err: &broker.Error{Kind: broker.ErrTimeout, Reason: broker.ReasonWaitTimeout, Msg: "held", State: held},
			code: codes.DeadlineExceeded, reason: "WAIT_TIMEOUT", meta: map[string]string{"key": "jobs/a"}, withState: true},
		{name: "invalid field", err: &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "new_session.ttl", Msg: "new_session.ttl: must be at least 10s"},
			code: codes.InvalidArgument, reason: "INVALID_ARGUMENT", meta: map[string]string{"field": "new_session.ttl"}, field: "new_session.ttl"},
		{name: "bare invalid", err: broker.ErrInvalid, code: codes.InvalidArgument, reason: "INVALID_ARGUMENT"},
		{name: "foreign flags", err: &broker.Error{Kind: broker.ErrConflict, Reason: broker.ReasonForeignFlags, Msg: "flags"},
			code: codes.FailedPrecondition, reason: "FOREIGN_FLAGS"},
		{name: "limit conflict", err: &broker.Error{Kind: broker.ErrConflict, Reason: broker.ReasonLimitConflict, Msg: "limit 3, asked 2"},
			code: codes.FailedPrecondition, reason: "LIMIT_CONFLICT"},
		{name: "not holder", err: &broker.Error{Kind: broker.ErrNotHolder, Reason: broker.ReasonNotHolder, Msg: "s-2 does not hold it", State: held},
			code: codes.FailedPrecondition, reason: "NOT_HOLDER", meta: map[string]string{"key": "jobs/a"}, withState: true},
		{name: "resume refused", err: &broker.Error{Kind: broker.ErrConflict, Reason: broker.ReasonResumeRefused, Msg: "client-owned"},
			code: codes.FailedPrecondition, reason: "RESUME_REFUSED"},
		{name: "session lost", err: &broker.Error{Kind: broker.ErrAborted, Reason: broker.ReasonSessionLost, Msg: "invalidated"},
			code: codes.Aborted, reason: "SESSION_LOST"},
		{name: "session not found", err: fmt.Errorf("renew: %w", broker.ErrSessionNotFound), code: codes.NotFound, reason: "SESSION_NOT_FOUND"},
		{name: "shutdown", err: broker.ErrShutdown, code: codes.Unavailable, reason: "BROKER_SHUTTING_DOWN", retry: DefaultRetryDelay},
		{name: "consul unavailable", err: &broker.StoreError{Kind: broker.StoreUnavailable, Op: "kv txn", Err: errors.New("connection refused")},
			code: codes.Unavailable, reason: "CONSUL_UNAVAILABLE", meta: map[string]string{"consulOperation": "kv txn"}, retry: DefaultRetryDelay},
		{name: "consul 429 retry-after", err: fmt.Errorf("acquire: %w", &broker.StoreError{Kind: broker.StoreUnavailable, Op: "kv txn", RetryAfter: 5 * time.Second, Err: errors.New("429")}),
			code: codes.Unavailable, reason: "CONSUL_UNAVAILABLE", meta: map[string]string{"consulOperation": "kv txn"}, retry: 5 * time.Second},
		{name: "consul timeout is not the client's deadline", err: &broker.StoreError{Kind: broker.StoreUnavailable, Op: "session renew", Err: context.DeadlineExceeded},
			code: codes.Unavailable, reason: "CONSUL_UNAVAILABLE", meta: map[string]string{"consulOperation": "session renew"}, retry: DefaultRetryDelay},
		{name: "replica cut off", err: &broker.Error{Kind: broker.ErrUnavailable, Reason: broker.ReasonReplicaCutOff, Msg: "no answer for 3s"},
			code: codes.Unavailable, reason: "REPLICA_CUT_OFF", retry: DefaultRetryDelay},
		{name: "consul 403", err: &broker.StoreError{Kind: broker.StorePermissionDenied, Op: "session create", Err: errors.New("Permission denied")},
			code: codes.PermissionDenied, reason: "CONSUL_PERMISSION_DENIED", meta: map[string]string{"consulOperation": "session create"}},
		{name: "consul rejected", err: &broker.StoreError{Kind: broker.StoreRejected, Op: "kv txn", Err: errors.New("413 too large")},
			code: codes.FailedPrecondition, reason: "CONSUL_REJECTED", meta: map[string]string{"consulOperation": "kv txn"}},
		{name: "txn lock held", err: &broker.TxnError{Failures: []broker.TxnFailure{{Op: 0, Kind: broker.TxnLockHeld}}}, code: codes.Aborted, reason: "LOCK_HELD"},
		{name: "txn session invalid", err: &broker.TxnError{Failures: []broker.TxnFailure{{Op: 1, Kind: broker.TxnSessionInvalid}}}, code: codes.NotFound, reason: "SESSION_NOT_FOUND"},
		{name: "txn check failed", err: &broker.TxnError{Failures: []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}}, code: codes.Aborted, reason: "SESSION_LOST"},
		{name: "canceled", err: fmt.Errorf("wait: %w", context.Canceled), code: codes.Canceled},
		{name: "deadline", err: context.DeadlineExceeded, code: codes.DeadlineExceeded},
		{name: "status passes through", err: status.Error(codes.Unavailable, "transport closing"), code: codes.Unavailable},
		{name: "unknown", err: errors.New("nil map"), code: codes.Internal, reason: "INTERNAL", logged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.ErrorLevel)
			err := toStatus(zap.New(core), tt.err)
			st, ok := status.FromError(err)
			require.True(t, ok, "not a status: %v", err)
			assert.Equal(t, tt.code, st.Code(), st.Message())
			assert.Equal(t, tt.logged, logs.Len() == 1, "logged: %v", logs.All())
			if tt.reason != "" {
				assert.Equal(t, tt.err.Error(), st.Message())
			}
			d := readDetails(t, st)
			if tt.reason == "" {
				assert.Nil(t, d.info, "no ErrorInfo expected")
				return
			}
			require.NotNil(t, d.info, "every error carries an ErrorInfo")
			assert.Equal(t, tt.reason, d.info.GetReason())
			assert.Equal(t, "lockbroker.v1", d.info.GetDomain())
			assert.Equal(t, tt.meta, nilIfEmpty(d.info.GetMetadata()))
			_, inEnum := lockbrokerv1.ErrorReason_value["ERROR_REASON_"+tt.reason]
			assert.True(t, inEnum || tt.reason == string(broker.ReasonConsulRejected), "reason %s is not an ErrorReason", tt.reason)
			if tt.code == codes.InvalidArgument {
				require.NotNil(t, d.badRequest, "INVALID_ARGUMENT carries a BadRequest")
				require.Len(t, d.badRequest.GetFieldViolations(), 1)
				assert.Equal(t, tt.field, d.badRequest.GetFieldViolations()[0].GetField())
				assert.NotEmpty(t, d.badRequest.GetFieldViolations()[0].GetDescription())
			} else {
				assert.Nil(t, d.badRequest)
			}
			if tt.retry > 0 {
				require.NotNil(t, d.retry, "RetryInfo expected")
				assert.Equal(t, tt.retry, d.retry.GetRetryDelay().AsDuration())
			} else {
				assert.Nil(t, d.retry)
			}
			if tt.withState {
				require.NotNil(t, d.state, "LockState expected")
				assert.Equal(t, "jobs/a", d.state.GetKey())
				require.Len(t, d.state.GetHolders(), 1)
				assert.Equal(t, "s-1", d.state.GetHolders()[0].GetSessionId())
				assert.Equal(t, uint64(42), d.state.GetHolders()[0].GetToken())
			} else {
				assert.Nil(t, d.state)
			}
			assert.Empty(t, d.others)
		})
	}
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

// TestToStatusInvalidDescription checks that the field violation's
// description does not repeat the field name the message starts with.
func TestToStatusInvalidDescription(t *testing.T) {
	err := toStatus(zap.NewNop(), &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "limit", Msg: "limit: at most 1024"})
	d := readDetails(t, status.Convert(err))
	require.NotNil(t, d.badRequest)
	assert.Equal(t, "at most 1024", d.badRequest.GetFieldViolations()[0].GetDescription())
	assert.Equal(t, "invalid argument: limit: at most 1024", status.Convert(err).Message())
}

func TestToStatusNil(t *testing.T) {
	assert.NoError(t, toStatus(zap.NewNop(), nil))
}
