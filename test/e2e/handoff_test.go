package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// rolledBack counts the write transactions Consul rolled back for r.
func rolledBack(t testing.TB, r *brokertest.Replica) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(r.Store.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "lockbroker_consul_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == "kv_txn_write" && labels["result"] == "txn_rolled_back" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// Issue 12: one release wakes one waiter. Waiters of a replica get the
// lock in arrival order, and a hand-off costs no failed transactions (a
// stampede costs one failed grant per other waiter).
func TestHandOffWakesOneWaiterInOrder(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	key := "handoff/fifo"
	holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast(), Value: []byte("w-first")})
	cur := holder.acquired(5 * time.Second).GetSequencer()
	const n = 10
	waiters := make([]*stream, n)
	for i := range n {
		waiters[i] = acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast(), Value: fmt.Appendf(nil, "w%d", i)})
		waiters[i].next(5*time.Second, isQueued)
	}
	before := rolledBack(t, r)
	prev := holder
	for i := range n {
		_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: cur.GetSessionId(), Token: cur.GetToken()})
		require.NoError(t, err)
		prev.next(5*time.Second, lkIsReleased)
		got := waiters[i].acquired(5 * time.Second).GetSequencer()
		assert.Greater(t, got.GetToken(), cur.GetToken(), "waiter %d", i)
		cur, prev = got, waiters[i]
	}
	failed := rolledBack(t, r) - before
	t.Logf("%d hand-offs, %v rolled-back transactions", n, failed)
	assert.LessOrEqual(t, failed, float64(2), "no stampede: the next waiter alone tries")
}
