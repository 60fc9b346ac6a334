package consulstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 41 (suspicion: a false cut-off during a leader election): calls
// that Consul holds up, as it holds renewals while it elects a leader,
// can take every connection of the plain calls' pool. The reach probe
// must not wait behind them: the broker counts a replica as cut off when
// no probe is answered for 3 s, and during an election every replica
// would then tell its holds REPLICA_CUT_OFF with nowhere to go. The probe
// has a connection of its own; on main it queued behind the pool (here
// MaxConns 2, both held by blocking reads) until its context ended.
func TestReachableBesideAFullPool(t *testing.T) {
	agent := consultest.Start(t)
	s, err := Open(agent.Config(), Options{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	kv := s.Client().KV()
	_, meta, err := kv.Get("probe/held", nil)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range 2 {
		wg.Go(func() {
			// Answered only when the key changes or after the wait.
			_, _, _ = kv.Get("probe/held", (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 30 * time.Second}).WithContext(ctx))
		})
	}
	require.NotNil(t, s.pool, "the plain calls go over the pool")
	require.Eventually(t, func() bool { return len(s.pool.tokens) == 0 }, 5*time.Second, 5*time.Millisecond, "both connections taken")

	for range 3 {
		pctx, pcancel := context.WithTimeout(context.Background(), time.Second)
		began := time.Now()
		err := s.Reachable(pctx)
		pcancel()
		require.NoError(t, err, "the probe is answered while the pool is full")
		assert.Less(t, time.Since(began), 500*time.Millisecond)
	}
	require.NoError(t, s.Healthy(context.Background()))
}
