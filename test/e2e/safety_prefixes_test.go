package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 10, item 1: holds spread over many top-level prefixes must not
// starve renewals. 1,000 holds on 1,000 distinct top-level prefixes are
// held past 2 x TTL with none lost; the replica keeps at most its cap of
// blocking queries; a hold without a blocking query of its own still
// learns of its loss within 1 s.
func TestManyTopLevelPrefixesHeldPastTwoTTL(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	n, ttl := 1000, 10*time.Second
	if lkRace {
		n = 300
	}
	conn := lkDial(t, r.Addr)
	c := lockbrokerv1.NewLockServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var acquired, lost, keepalives atomic.Int64
	seqs := make([]*lockbrokerv1.Sequencer, n)
	lostCh := make([]chan time.Time, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		lostCh[i] = make(chan time.Time, 1)
		st, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("tenant%04d/lock", i), Session: lkSession(ttl, 0)})
		require.NoError(t, err)
		wg.Go(func() {
			for {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				switch {
				case resp.GetAcquired() != nil:
					seqs[i] = resp.GetAcquired().GetSequencer()
					acquired.Add(1)
				case resp.GetKeepalive() != nil:
					keepalives.Add(1)
				case resp.GetLost() != nil:
					lost.Add(1)
					lostCh[i] <- time.Now()
					return
				}
			}
		})
	}
	require.Eventually(t, func() bool { return acquired.Load() == int64(n) }, 60*time.Second, 50*time.Millisecond, "all acquired")
	t.Logf("%d holds on %d top-level prefixes acquired in %s", n, n, time.Since(start).Round(time.Millisecond))
	hold := 2*ttl + 2*time.Second
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		assert.LessOrEqual(t, r.Store.OpenBlockingQueries(), int64(32), "blocking queries within the cap")
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("held %s: %d lost, %d keepalives", hold, lost.Load(), keepalives.Load())
	assert.Zero(t, lost.Load(), "holds lost while Consul was healthy")

	// The last hold has no blocking query of its own (the first 32 keys
	// took them): its loss is still noticed within 1 s.
	i := n - 1
	destroyed := time.Now()
	_, err := agent.Client().Session().Destroy(seqs[i].GetSessionId(), nil)
	require.NoError(t, err)
	select {
	case at := <-lostCh[i]:
		t.Logf("swept hold told lost %s after its session was destroyed", at.Sub(destroyed).Round(time.Millisecond))
		assert.Less(t, at.Sub(destroyed), time.Second)
	case <-time.After(5 * time.Second):
		t.Fatal("no lost within 5s")
	}
	cancel()
	wg.Wait()
}
