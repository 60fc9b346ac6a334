package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// countingSink counts the writes the logger makes (each would be a
// write(2) on a file) and keeps the lines.
type countingSink struct {
	mu     sync.Mutex
	writes int
	buf    bytes.Buffer
}

func (s *countingSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.buf.Write(p)
}

func (s *countingSink) Sync() error { return nil }

func sinkLogger(level zapcore.Level) (*zap.Logger, *countingSink) {
	sink := &countingSink{}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, sink, level)), sink
}

var lockRelease = &grpc.UnaryServerInfo{FullMethod: "/lockbroker.v1.LockService/Release"}

// TestAccessLogDefaultLevelCostsNoWrite: at info, a successful call
// writes nothing and allocates nothing in the access log.
func TestAccessLogDefaultLevelCostsNoWrite(t *testing.T) {
	log, sink := sinkLogger(zapcore.InfoLevel)
	al := accessLog{log: log}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}})
	ok := func(context.Context, any) (any, error) { return nil, nil }
	allocs := testing.AllocsPerRun(200, func() { _, _ = al.unary(ctx, nil, lockRelease, ok) })
	assert.Zero(t, allocs)
	assert.Zero(t, sink.writes)

	refused := func(context.Context, any) (any, error) { return nil, status.Error(codes.InvalidArgument, "bad key") }
	_, _ = al.unary(ctx, nil, lockRelease, refused)
	assert.Equal(t, 1, sink.writes)
}

// TestAccessLogFields: the line carries the fields of go-grpc-middleware's
// logging interceptor, at the level accessLevel gives the code.
func TestAccessLogFields(t *testing.T) {
	log, sink := sinkLogger(zapcore.DebugLevel)
	al := accessLog{log: log}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}})
	tests := []struct {
		name  string
		err   error
		level string
	}{
		{"ok", nil, "debug"},
		{"not found", status.Error(codes.NotFound, "no such session"), "info"},
		{"unavailable", status.Error(codes.Unavailable, "consul"), "warn"},
		{"internal", status.Error(codes.Internal, "bug"), "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink.buf.Reset()
			_, _ = al.unary(ctx, nil, lockRelease, func(context.Context, any) (any, error) { return nil, tt.err })
			var line map[string]any
			require.NoError(t, json.Unmarshal(sink.buf.Bytes(), &line))
			assert.Equal(t, tt.level, line["level"])
			assert.Equal(t, "finished call", line["msg"])
			assert.Equal(t, "grpc", line["protocol"])
			assert.Equal(t, "server", line["grpc.component"])
			assert.Equal(t, "lockbroker.v1.LockService", line["grpc.service"])
			assert.Equal(t, "Release", line["grpc.method"])
			assert.Equal(t, "unary", line["grpc.method_type"])
			assert.Equal(t, "127.0.0.1:5", line["peer.address"])
			assert.Equal(t, status.Code(tt.err).String(), line["grpc.code"])
			assert.NotEmpty(t, line["grpc.start_time"])
			assert.NotEmpty(t, line["grpc.time_ms"])
			if tt.err != nil {
				assert.True(t, strings.HasSuffix(line["grpc.error"].(string), status.Convert(tt.err).Message()))
			} else {
				assert.NotContains(t, line, "grpc.error")
			}
		})
	}
}
