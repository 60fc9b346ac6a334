package conformance

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/otlptest"
)

// TestTraceContextCrossLanguage: every library sends the W3C trace
// context its caller gives it. A broker process exports its spans to an
// OTLP receiver of the test's; the hold CLI of each language takes and
// releases a lock with LOCKBROKER_TRACEPARENT set (the CLIs hand it to
// the library: trace_context in Python, traceContext in Node and Java, the
// call's context in Go), and the broker's Acquire span must be a child of
// that span. Languages whose CLI cannot run here are skipped unless
// LOCKBROKER_S5_REQUIRE requires them.
func TestTraceContextCrossLanguage(t *testing.T) {
	recv := otlptest.Start(t)
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent, brokertest.WithEnv(recv.Env("lockbroker-conformance")...))
	for _, l := range []lang{goCLI(t), pythonCLI(t), nodeCLI(t), javaCLI(t)} {
		t.Run(l.name, func(t *testing.T) {
			if l.missing != "" {
				if s5Required(l.name) {
					t.Fatalf("the %s CLI is required (LOCKBROKER_S5_REQUIRE) but cannot run: %s", l.name, l.missing)
				}
				t.Skipf("no %s CLI: %s", l.name, l.missing)
			}
			header, traceID, parentID := otlptest.Traceparent(t)
			l.env = append(l.env, "LOCKBROKER_TRACEPARENT="+header)
			c, err := startCLI(t, l, b.Addr, testKey(t), 0, 30)
			require.NoError(t, err)
			_, err = c.wait("acquired", 30*time.Second)
			require.NoError(t, err, "%s CLI: %s", l.name, c.stderr.String())
			c.release()
			var acquire *tracepb.Span
			waitFor(t, 15*time.Second, "the broker's Acquire span in the caller's trace", func() bool {
				for _, s := range recv.Of(traceID) {
					if s.GetName() == "lockbroker.v1.LockService/Acquire" && s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
						acquire = s
					}
				}
				return acquire != nil
			})
			assert.Equal(t, parentID, acquire.GetParentSpanId(), "the Acquire span is a child of the caller's span")
		})
	}
}
