package consulstore

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// gather returns lockbroker_consul_requests_total by op and result, read
// through a registry as a scrape would.
func gather(t *testing.T, s *Store) map[[2]string]uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(s.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[[2]string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "lockbroker_consul_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var k [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "op":
					k[0] = l.GetValue()
				case "result":
					k[1] = l.GetValue()
				}
			}
			out[k] = uint64(m.GetCounter().GetValue())
		}
	}
	return out
}

// gatherValue returns the counter for op and result.
func gatherValue(t *testing.T, s *Store, op, result string) uint64 {
	t.Helper()
	return gather(t, s)[[2]string{op, result}]
}

// gatherResult returns the sum of the counters for result over every op.
func gatherResult(t *testing.T, s *Store, result string) uint64 {
	t.Helper()
	var n uint64
	for k, v := range gather(t, s) {
		if k[1] == result {
			n += v
		}
	}
	return n
}

// TestMetricsPerOperation proves that every Consul call is counted once
// under its operation kind and result, in OpCounts and in the collector.
func TestMetricsPerOperation(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	id, err := s.CreateSession(ctx, broker.SessionSpec{TTL: 15 * time.Second})
	require.NoError(t, err)
	_, err = s.RenewSession(ctx, id)
	require.NoError(t, err)
	_, err = s.Session(ctx, id)
	require.NoError(t, err)
	_, err = s.Sessions(ctx)
	require.NoError(t, err)
	_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "m/k", Session: id}})
	require.NoError(t, err)
	_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "m/k", Session: "3f1c7a52-0000-4000-8000-000000000000"}})
	require.Error(t, err)
	_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpGet, Key: "m/k"}})
	require.NoError(t, err)
	_, _, err = s.List(ctx, "m/", true)
	require.NoError(t, err)
	_, _, err = s.Watch(ctx, "m/", 0)
	require.NoError(t, err)
	require.NoError(t, s.DestroySession(ctx, id))
	_, err = s.RenewSession(ctx, id)
	require.ErrorIs(t, err, broker.ErrSessionNotFound)
	require.NoError(t, s.Healthy(ctx))

	// The renewal of the destroyed session makes the second session_info
	// call: the consistent read that confirms Consul's "not found".
	assert.Equal(t, map[string]uint64{
		"session_create": 1, "session_renew": 2, "session_destroy": 1, "session_info": 2,
		"session_list": 1, "kv_list": 1, "kv_watch": 1, "kv_txn_write": 2, "kv_txn_read": 1,
		"status_leader": 1,
	}, s.OpCounts())

	got := gather(t, s)
	for k, v := range got {
		if v == 0 {
			delete(got, k)
		}
	}
	assert.Equal(t, map[[2]string]uint64{
		{"session_create", "ok"}: 1, {"session_renew", "ok"}: 1, {"session_renew", "not_found"}: 1,
		{"session_destroy", "ok"}: 1, {"session_info", "ok"}: 1, {"session_info", "not_found"}: 1, {"session_list", "ok"}: 1,
		{"kv_list", "ok"}: 1, {"kv_watch", "ok"}: 1, {"kv_txn_write", "ok"}: 1,
		{"kv_txn_write", "txn_rolled_back"}: 1, {"kv_txn_read", "ok"}: 1, {"status_leader", "ok"}: 1,
	}, got)
}

// BenchmarkCount measures the cost of counting one call.
func BenchmarkCount(b *testing.B) {
	var c counters
	b.ReportAllocs()
	for b.Loop() {
		c.add(opKVTxnWrite, resOK)
	}
}
