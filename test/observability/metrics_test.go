// Package observability_test checks what an SRE reads about a broker
// process: the replica's metrics after real holds, waits and losses, and
// that every metric the Grafana dashboard and the Prometheus alert rules
// (deploy/) query is one the broker exports, with the label values they
// match.
package observability_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// token is the bearer token of the test's tenant.
const token = "observability-test-token"

// startBroker runs a broker process with a tenants file (one tenant,
// prefix obs/), so that the tenant metrics exist too, and returns it with
// a LockService client that sends the tenant's token.
func startBroker(t *testing.T) (*brokertest.Process, *consultest.Agent, lockbrokerv1.LockServiceClient, context.Context) {
	t.Helper()
	agent := consultest.Start(t)
	sum := sha256.Sum256([]byte(token))
	tenants := filepath.Join(t.TempDir(), "tenants.yaml")
	require.NoError(t, os.WriteFile(tenants, []byte("tenants:\n  - name: obs\n    identities: [\"token-sha256:"+
		hex.EncodeToString(sum[:])+"\"]\n    prefixes: [obs/]\n    max_holds: 100\n"), 0o600))
	p := brokertest.StartProcess(t, agent, brokertest.WithFlags("--tenants", tenants))
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token))
	t.Cleanup(cancel)
	return p, agent, lockbrokerv1.NewLockServiceClient(conn), ctx
}

// scrape reads the process's /metrics.
func scrape(t *testing.T, p *brokertest.Process) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// value is the value of the series of family name whose labels include
// want (a counter's, a gauge's, or a histogram's sample count).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "no metric %s", name)
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == k && l.GetValue() == v)
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series of %s with %v", name, want)
	return 0
}

// recvUntil reads the stream until an event for which ok is true.
func recvUntil(t *testing.T, s grpc.ServerStreamingClient[lockbrokerv1.AcquireResponse], ok func(*lockbrokerv1.AcquireResponse) bool) *lockbrokerv1.AcquireResponse {
	t.Helper()
	for range 100 {
		r, err := s.Recv()
		require.NoError(t, err)
		if ok(r) {
			return r
		}
	}
	t.Fatal("no such event in 100")
	return nil
}

// TestReplicaMetrics holds a key, queues a second stream behind it, then
// destroys the holder's session in Consul: the replica-wide gauges, the
// losses by reason and the grant and wait histograms follow, without any
// tenant label.
func TestReplicaMetrics(t *testing.T) {
	p, agent, locks, ctx := startBroker(t)

	holder, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "obs/k"})
	require.NoError(t, err)
	acq := recvUntil(t, holder, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil })
	waiter, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "obs/k"})
	require.NoError(t, err)
	recvUntil(t, waiter, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetQueued() != nil })

	fams := scrape(t, p)
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_holds", nil))
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_waiters", nil))
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_acquire_grant_seconds", nil))
	assert.Equal(t, 0.0, value(t, fams, "lockbroker_acquire_wait_seconds", nil))
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_tenant_holds", map[string]string{"tenant": "obs"}), "the tenant's gauges still count")

	_, err = agent.Client().Session().Destroy(acq.GetAcquired().GetSequencer().GetSessionId(), nil)
	require.NoError(t, err)
	lost := recvUntil(t, holder, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetLost() != nil })
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetLost().GetReason())
	recvUntil(t, waiter, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil })

	require.Eventually(t, func() bool {
		fams = scrape(t, p)
		return value(t, fams, "lockbroker_acquire_wait_seconds", nil) == 1
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_holds", nil))
	assert.Equal(t, 0.0, value(t, fams, "lockbroker_waiters", nil))
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_acquire_grant_seconds", nil))
	assert.Equal(t, 1.0, value(t, fams, "lockbroker_losses_total", map[string]string{"reason": "SESSION_INVALIDATED"}))
	assert.Equal(t, 0.0, value(t, fams, "lockbroker_losses_total", map[string]string{"reason": "RENEWAL_FAILED"}), "every reason is exported from zero")
	assert.Equal(t, 0.0, value(t, fams, "lockbroker_replica_cut_off", nil))
	assert.Positive(t, value(t, fams, "lockbroker_consul_request_duration_seconds", map[string]string{"op": "kv_txn_write"}))
	for _, m := range fams["lockbroker_consul_request_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			assert.False(t, l.GetName() == "op" && l.GetValue() == "kv_watch", "a blocking query's length is not a latency")
		}
	}
}
