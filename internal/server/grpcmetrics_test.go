package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// TestGRPCMetrics checks the four grpc_server_* counters the way
// go-grpc-middleware's prometheus provider kept them, which the broker
// exported before it counted them itself: every method's counters exist
// at zero from the start (each code of handled_total too), a unary call
// counts one message each way when it succeeds and none sent when it
// fails, a stream counts what it sent and received, and each call ends in
// handled_total under its code (a cancelled stream as Canceled).
func TestGRPCMetrics(t *testing.T) {
	srv, conn := startPlain(t, zap.NewNop())
	locks := lockbrokerv1.NewLockServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const lockSvc = "lockbroker.v1.LockService"
	metric := func(name string, labels ...string) float64 {
		t.Helper()
		return metricValue(t, srv, name, labels...)
	}
	call := func(typ, method string) []string {
		return []string{"grpc_type", typ, "grpc_service", lockSvc, "grpc_method", method}
	}
	handled := func(typ, method string, c codes.Code) float64 {
		return metric("grpc_server_handled_total", append(call(typ, method), "grpc_code", c.String())...)
	}

	// Every method and code is there before any call.
	for _, m := range lockbrokerv1.LockService_ServiceDesc.Methods {
		assert.Equal(t, 0.0, metric("grpc_server_started_total", call("unary", m.MethodName)...), m.MethodName)
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			assert.Equal(t, 0.0, handled("unary", m.MethodName, c), "%s %s", m.MethodName, c)
		}
	}
	assert.Equal(t, 0.0, metric("grpc_server_started_total", call("server_stream", "Acquire")...))
	assert.Equal(t, 0.0, metric("grpc_server_msg_sent_total", call("server_stream", "Watch")...))

	// A unary call that succeeds, and one refused.
	cs, err := lockbrokerv1.NewSessionServiceClient(conn).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	ta, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "metrics/unary", SessionId: cs.GetSession().GetId()})
	require.NoError(t, err)
	_, err = locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "metrics/unary", SessionId: ta.GetSequencer().GetSessionId(), Token: ta.GetSequencer().GetToken()})
	require.NoError(t, err)
	_, err = locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "a//b", SessionId: ta.GetSequencer().GetSessionId()})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, 1.0, metric("grpc_server_started_total", call("unary", "TryAcquire")...))
	assert.Equal(t, 1.0, metric("grpc_server_msg_received_total", call("unary", "TryAcquire")...))
	assert.Equal(t, 1.0, metric("grpc_server_msg_sent_total", call("unary", "TryAcquire")...))
	assert.Equal(t, 1.0, handled("unary", "TryAcquire", codes.OK))
	assert.Equal(t, 2.0, metric("grpc_server_started_total", call("unary", "Release")...))
	assert.Equal(t, 2.0, metric("grpc_server_msg_received_total", call("unary", "Release")...))
	assert.Equal(t, 1.0, metric("grpc_server_msg_sent_total", call("unary", "Release")...), "no answer sent for the refused call")
	assert.Equal(t, 1.0, handled("unary", "Release", codes.OK))
	assert.Equal(t, 1.0, handled("unary", "Release", codes.InvalidArgument))

	// A stream: its request and events, then its cancel.
	sctx, scancel := context.WithCancel(ctx)
	stream, err := locks.Acquire(sctx, &lockbrokerv1.AcquireRequest{Key: "metrics/stream"})
	require.NoError(t, err)
	events := 0
	for {
		resp, err := stream.Recv()
		require.NoError(t, err)
		events++
		if resp.GetAcquired() != nil {
			break
		}
	}
	acquire := call("server_stream", "Acquire")
	require.Eventually(t, func() bool {
		return metric("grpc_server_msg_sent_total", acquire...) >= float64(events)
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, metric("grpc_server_started_total", acquire...))
	assert.Equal(t, 1.0, metric("grpc_server_msg_received_total", acquire...))
	assert.Equal(t, 0.0, handled("server_stream", "Acquire", codes.Canceled), "not ended yet")
	scancel()
	require.Eventually(t, func() bool {
		return handled("server_stream", "Acquire", codes.Canceled) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.0, handled("server_stream", "Acquire", codes.OK))
}

// BenchmarkGRPCMetricsUnary is the metrics interceptor's cost per unary
// call (with a handler that does nothing).
func BenchmarkGRPCMetricsUnary(b *testing.B) {
	g := grpc.NewServer()
	lockbrokerv1.RegisterLockServiceServer(g, &LockService{})
	m := newGRPCMetrics()
	m.init(g)
	info := &grpc.UnaryServerInfo{FullMethod: lockbrokerv1.LockService_Release_FullMethodName}
	handler := func(_ context.Context, req any) (any, error) { return req, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = m.unary(ctx, 1, info, handler)
	}
}
