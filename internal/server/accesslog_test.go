package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// startPlain runs a single-tenant server without TLS on a real agent, and
// dials it.
func startPlain(t *testing.T, log *zap.Logger) (*Server, *grpc.ClientConn) {
	t.Helper()
	return startPlainWith(t, log, nil)
}

// startPlainWith is startPlain with register, if not nil, called before
// the server serves (to add a service of the test's own).
func startPlainWith(t *testing.T, log *zap.Logger, register func(*grpc.Server)) (*Server, *grpc.ClientConn) {
	t.Helper()
	agent := consultest.Start(t)
	store, err := consulstore.Open(agent.Config(), consulstore.Options{})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := broker.New(store, log)
	srv, err := New(b, store, log)
	require.NoError(t, err)
	if register != nil {
		register(srv.GRPC)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.GRPC.Serve(lis) }()
	t.Cleanup(func() { srv.GRPC.Stop(); <-served; b.Close() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return srv, conn
}

// TestAccessLogQuietWhenOK checks that at the default info level a
// successful call writes no log line and a refused one writes one.
func TestAccessLogQuietWhenOK(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	_, conn := startPlain(t, zap.New(core))
	locks := lockbrokerv1.NewLockServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	finished := func() []observer.LoggedEntry { return logs.FilterMessage("finished call").All() }
	for range 3 {
		_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "accesslog/ok"})
		require.NoError(t, err)
	}
	assert.Empty(t, finished(), "no line per successful call at info")

	_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a//b"})
	require.Error(t, err)
	require.Eventually(t, func() bool { return len(finished()) == 1 }, 5*time.Second, 10*time.Millisecond)
	e := finished()[0]
	assert.Equal(t, zapcore.InfoLevel, e.Level)
	assert.Equal(t, "InvalidArgument", e.ContextMap()["grpc.code"])
}
