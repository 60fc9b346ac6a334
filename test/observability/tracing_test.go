package observability_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/otlptest"
)

// TestTracingSpanTree runs a broker process with OTEL_EXPORTER_OTLP_ENDPOINT
// pointing at an OTLP receiver of the test's own, makes a TryAcquire and
// a Release under a trace context the test sends as the W3C traceparent
// header, and checks the spans' tree: each RPC's server span is a child of
// the test's span, and each Consul call made for it a client span under
// the server span. Health checks make no spans.
func TestTracingSpanTree(t *testing.T) {
	recv := otlptest.Start(t)
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent, brokertest.WithEnv(recv.Env("lockbroker-trace-test")...))
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	locks := lockbrokerv1.NewLockServiceClient(conn)
	sessions := lockbrokerv1.NewSessionServiceClient(conn)

	// A client-owned session (no trace), then the traced calls.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	header, traceID, parentID := otlptest.Traceparent(t)
	tctx := metadata.AppendToOutgoingContext(ctx, "traceparent", header)
	got, err := locks.TryAcquire(tctx, &lockbrokerv1.TryAcquireRequest{Key: "trace/k", SessionId: sess.GetSession().GetId()})
	require.NoError(t, err)
	_, err = locks.Release(tctx, &lockbrokerv1.ReleaseRequest{Key: "trace/k", SessionId: sess.GetSession().GetId(), Token: got.GetSequencer().GetToken()})
	require.NoError(t, err)

	// The Go library under a trace of the caller's: its connection has
	// OpenTelemetry's client stats handler, which sends the traceparent.
	goTrace, goParent := goLibraryLease(t, p.Addr)

	var spans []*tracepb.Span
	require.Eventually(t, func() bool {
		spans = recv.Of(traceID)
		servers := 0
		for _, s := range spans {
			if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
				servers++
			}
		}
		return servers == 2
	}, 10*time.Second, 20*time.Millisecond, "two server spans of the trace")
	time.Sleep(200 * time.Millisecond) // a child ends before its parent: all are in
	spans = recv.Of(traceID)

	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[string(s.GetSpanId())] = s
	}
	children := map[string][]string{} // server span name -> its children's names
	for _, s := range spans {
		switch s.GetKind() {
		case tracepb.Span_SPAN_KIND_SERVER:
			assert.Equal(t, parentID, s.GetParentSpanId(), "server span %s is a child of the client's span", s.GetName())
			children[s.GetName()] = children[s.GetName()] // present even without children
		case tracepb.Span_SPAN_KIND_CLIENT:
			parent := byID[string(s.GetParentSpanId())]
			require.NotNil(t, parent, "span %s has a parent in the trace", s.GetName())
			assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, parent.GetKind(), "span %s is under an RPC's span", s.GetName())
			assert.True(t, strings.HasPrefix(s.GetName(), "consul "), s.GetName())
			assert.LessOrEqual(t, parent.GetStartTimeUnixNano(), s.GetStartTimeUnixNano())
			assert.LessOrEqual(t, s.GetEndTimeUnixNano(), parent.GetEndTimeUnixNano())
			children[parent.GetName()] = append(children[parent.GetName()], s.GetName())
		default:
			t.Errorf("unexpected span %s of kind %v", s.GetName(), s.GetKind())
		}
	}
	t.Logf("span tree: %v", children)
	require.Contains(t, children, "lockbroker.v1.LockService/TryAcquire")
	require.Contains(t, children, "lockbroker.v1.LockService/Release")
	assert.Contains(t, children["lockbroker.v1.LockService/TryAcquire"], "consul kv txn", "the grant's transaction")
	assert.NotEmpty(t, children["lockbroker.v1.LockService/Release"], "the release's Consul calls")

	// The Go library's Acquire stream: a server span under the caller's.
	require.Eventually(t, func() bool { return len(recv.Of(goTrace)) > 0 }, 10*time.Second, 20*time.Millisecond,
		"the Go library's Acquire carries the caller's trace")
	var acquire *tracepb.Span
	for _, s := range recv.Of(goTrace) {
		if s.GetName() == "lockbroker.v1.LockService/Acquire" {
			acquire = s
		}
	}
	require.NotNil(t, acquire, "a server span for the Go library's Acquire")
	assert.Equal(t, goParent, acquire.GetParentSpanId())

	assert.True(t, recv.Service("lockbroker-trace-test"), "OTEL_SERVICE_NAME names the service")
	for _, s := range recv.All() {
		assert.NotContains(t, s.GetName(), "grpc.health.v1", "health checks make no spans")
	}
}

// goLibraryLease takes and releases a lease with the Go client library
// inside a sampled trace context of the test's, on a connection with
// OpenTelemetry's gRPC client handler (no SDK: the handler's no-op span
// carries the caller's span context, which the propagator sends).
func goLibraryLease(t *testing.T, addr string) (traceID, spanID []byte) {
	t.Helper()
	_, traceID, spanID = otlptest.Traceparent(t)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID(traceID), SpanID: trace.SpanID(spanID), TraceFlags: trace.FlagsSampled})
	ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(context.Background(), sc), 30*time.Second)
	defer cancel()
	dopts, err := client.DialOptions()
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, append(dopts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithPropagators(propagation.TraceContext{}))))...)
	require.NoError(t, err)
	defer conn.Close()
	lease, err := client.New(conn).Lock(ctx, "trace/go")
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
	return traceID, spanID
}
