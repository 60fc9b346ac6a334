package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// panics is a service of the test's own whose stream handler panics once
// it has the request.
var panics = grpc.ServiceDesc{
	ServiceName: "lockbroker.test.Panics",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			var req lockbrokerv1.WatchRequest
			if err := ss.RecvMsg(&req); err != nil {
				return err
			}
			panic("the handler panics on " + req.GetKey())
		},
	}},
}

// TestStreamPanic: a stream handler's panic ends its stream INTERNAL,
// logged with the panic; the access log and grpc_server_handled_total
// have the call; and the server goes on serving.
func TestStreamPanic(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	srv, conn := startPlainWith(t, zap.New(core), func(g *grpc.Server) { g.RegisterService(&panics, struct{}{}) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	s, err := conn.NewStream(ctx, &panics.Streams[0], "/lockbroker.test.Panics/Stream")
	require.NoError(t, err)
	require.NoError(t, s.SendMsg(&lockbrokerv1.WatchRequest{Key: "panics"}))
	require.NoError(t, s.CloseSend())
	err = s.RecvMsg(new(lockbrokerv1.WatchResponse))
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	assert.Equal(t, "internal error", status.Convert(err).Message())

	panicked := logs.FilterMessage("panic in handler").All()
	require.Len(t, panicked, 1)
	assert.Equal(t, "the handler panics on panics", panicked[0].ContextMap()["panic"])
	require.Eventually(t, func() bool { return logs.FilterMessage("finished call").Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	line := logs.FilterMessage("finished call").All()[0]
	assert.Equal(t, zapcore.ErrorLevel, line.Level)
	assert.Equal(t, "Internal", line.ContextMap()["grpc.code"])
	assert.Equal(t, "Stream", line.ContextMap()["grpc.method"])
	assert.Equal(t, 1.0, metricValue(t, srv, "grpc_server_handled_total", "grpc_service", "lockbroker.test.Panics", "grpc_code", "Internal"))
	assert.Equal(t, 1.0, metricValue(t, srv, "grpc_server_msg_received_total", "grpc_service", "lockbroker.test.Panics"))

	_, err = lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "panics"})
	require.NoError(t, err, "the server still serves")
}
