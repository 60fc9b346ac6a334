package server_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// details is what a client reads from an error's google.rpc details.
type details struct {
	code       codes.Code
	msg        string
	info       *errdetails.ErrorInfo
	badRequest *errdetails.BadRequest
	retry      *errdetails.RetryInfo
	state      *lockbrokerv1.LockState
}

// detailsOf reads err as a client does, with status.FromError(...).Details().
func detailsOf(t *testing.T, err error) details {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a gRPC status: %v", err)
	d := details{code: st.Code(), msg: st.Message()}
	for _, x := range st.Details() {
		switch x := x.(type) {
		case *errdetails.ErrorInfo:
			d.info = x
		case *errdetails.BadRequest:
			d.badRequest = x
		case *errdetails.RetryInfo:
			d.retry = x
		case *lockbrokerv1.LockState:
			d.state = x
		case error:
			t.Errorf("detail the client cannot decode: %v", x)
		}
	}
	require.NotNil(t, d.info, "every error carries an ErrorInfo: %v", err)
	assert.Equal(t, "lockbroker.v1", d.info.GetDomain())
	return d
}

// streamErr reads an Acquire stream until it fails and returns the error.
func streamErr(t *testing.T, s grpc.ServerStreamingClient[lockbrokerv1.AcquireResponse]) error {
	t.Helper()
	for range 100 {
		resp, err := s.Recv()
		if err != nil {
			require.False(t, errors.Is(err, io.EOF), "the stream ended without an error")
			return err
		}
		require.Nil(t, resp.GetAcquired(), "must not acquire")
	}
	t.Fatal("no error after 100 events")
	return nil
}

// TestErrorDetails calls a real replica as a client would and reads the
// google.rpc details of each error.
func TestErrorDetails(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const key = "errors/held"
	hold, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("holder-1")})
	require.NoError(t, err)
	var holder *lockbrokerv1.Sequencer
	for holder == nil {
		resp, err := hold.Recv()
		require.NoError(t, err)
		holder = resp.GetAcquired().GetSequencer()
	}

	t.Run("BusyTry", func(t *testing.T) {
		s, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(0)})
		require.NoError(t, err)
		d := detailsOf(t, streamErr(t, s))
		assert.Equal(t, codes.Aborted, d.code, d.msg)
		assert.Equal(t, "LOCK_HELD", d.info.GetReason())
		assert.Equal(t, key, d.info.GetMetadata()["key"])
		require.NotNil(t, d.state, "ABORTED carries the LockState")
		require.Len(t, d.state.GetHolders(), 1)
		assert.Equal(t, holder.GetSessionId(), d.state.GetHolders()[0].GetSessionId())
		assert.Equal(t, holder.GetToken(), d.state.GetHolders()[0].GetToken())
		assert.Equal(t, []byte("holder-1"), d.state.GetHolders()[0].GetValue())
		assert.Contains(t, d.msg, holder.GetSessionId(), "the message names the holder")
	})

	t.Run("WaitTimeout", func(t *testing.T) {
		s, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(300 * time.Millisecond)})
		require.NoError(t, err)
		d := detailsOf(t, streamErr(t, s))
		assert.Equal(t, codes.DeadlineExceeded, d.code, d.msg)
		assert.Equal(t, "WAIT_TIMEOUT", d.info.GetReason())
		require.NotNil(t, d.state, "DEADLINE_EXCEEDED carries the LockState")
		require.Len(t, d.state.GetHolders(), 1)
		assert.Equal(t, holder.GetSessionId(), d.state.GetHolders()[0].GetSessionId())
	})

	t.Run("BadField", func(t *testing.T) {
		tests := []struct {
			name, field string
			call        func() error
		}{
			{"key", "key", func() error {
				_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a//b"})
				return err
			}},
			{"ttl", "new_session.ttl", func() error {
				s, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "errors/ttl",
					Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(time.Second)}}})
				require.NoError(t, err)
				_, err = s.Recv()
				return err
			}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				d := detailsOf(t, tt.call())
				assert.Equal(t, codes.InvalidArgument, d.code, d.msg)
				assert.Equal(t, "INVALID_ARGUMENT", d.info.GetReason())
				assert.Contains(t, d.msg, tt.field+": ", "the message names the field")
				require.NotNil(t, d.badRequest, "INVALID_ARGUMENT carries a BadRequest")
				require.NotEmpty(t, d.badRequest.GetFieldViolations())
				fv := d.badRequest.GetFieldViolations()[0]
				assert.Equal(t, tt.field, fv.GetField())
				assert.NotEmpty(t, fv.GetDescription())
			})
		}
	})

	t.Run("InvalidUTF8", func(t *testing.T) {
		// GetLockRequest.key (field 1) holding bytes that are not UTF-8: the
		// Go stubs refuse to send it, so it goes out as raw bytes.
		req := protowire.AppendTag(nil, 1, protowire.BytesType)
		req = protowire.AppendBytes(req, []byte("bad\xffkey"))
		var reply []byte
		err := r.Conn(t).Invoke(ctx, lockbrokerv1.LockService_GetLock_FullMethodName, &req, &reply, grpc.ForceCodecV2(rawCodec{}))
		d := detailsOf(t, err)
		assert.Equal(t, codes.InvalidArgument, d.code, d.msg)
		assert.Equal(t, "INVALID_ARGUMENT", d.info.GetReason())
		require.NotNil(t, d.badRequest)
		assert.Contains(t, d.msg, "UTF-8")
	})

	t.Run("UnknownSession", func(t *testing.T) {
		const unknown = "6f1f0b52-8d1c-4b8e-9a9e-1d2f3a4b5c6d"
		_, err := sessions.RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: unknown})
		d := detailsOf(t, err)
		assert.Equal(t, codes.NotFound, d.code, d.msg)
		assert.Equal(t, "SESSION_NOT_FOUND", d.info.GetReason())
		assert.Nil(t, d.retry, "an unknown session is never retried")
	})

	require.NoError(t, hold.CloseSend())
	cancel()

	t.Run("ConsulStopped", func(t *testing.T) {
		// The replica's own agent is gone: another replica, with its own
		// agent, may serve the request (test/e2e TestRequestOnCutOffReplica;
		// TestRequestWithoutConsulLeader has CONSUL_UNAVAILABLE).
		agent.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
		d := detailsOf(t, err)
		assert.Equal(t, codes.Unavailable, d.code, d.msg)
		assert.Equal(t, "REPLICA_CUT_OFF", d.info.GetReason())
		require.NotNil(t, d.retry, "UNAVAILABLE carries a RetryInfo")
		assert.Positive(t, d.retry.GetRetryDelay().AsDuration())
	})
}

// rawCodec sends and receives messages as the bytes given.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
