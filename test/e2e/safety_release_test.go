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

// Issue 10, item 3: a same-replica Release races with loss detection (the
// watch sees the key released by the Release itself). Every stream must
// end with `released`, never `lost`, over many cycles. Workers use
// client-owned sessions (two Raft writes a cycle) and every fourth cycle a
// broker-owned one.
func TestReleaseAlwaysEndsReleased(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	sessions := r.Sessions(t)
	const workers = 8
	cycles := 20_000
	if lkRace {
		cycles = 2_000
	}
	var done, lostN atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		sess, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Hour), LockDelay: dur(0)}})
		require.NoError(t, err)
		sid := sess.GetSession().GetId()
		key := fmt.Sprintf("release-race/%d", w)
		wg.Go(func() {
			for i := range cycles / workers {
				req := &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}}
				if i%4 == 3 {
					req.Session = fast()
				}
				if !releaseCycle(t, c, req) {
					lostN.Add(1)
				}
				done.Add(1)
				if t.Failed() {
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d cycles in %s, %d ended otherwise than released", done.Load(), time.Since(start).Round(time.Millisecond), lostN.Load())
	assert.Zero(t, lostN.Load())
	assert.Equal(t, int64(cycles/workers*workers), done.Load())
}

// releaseCycle acquires, releases with the token and reports whether the
// stream then said `released`.
func releaseCycle(t *testing.T, c lockbrokerv1.LockServiceClient, req *lockbrokerv1.AcquireRequest) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Acquire(ctx, req)
	if err != nil {
		t.Errorf("acquire: %v", err)
		return false
	}
	var seq *lockbrokerv1.Sequencer
	for seq == nil {
		resp, err := st.Recv()
		if err != nil {
			t.Errorf("before acquired: %v", err)
			return false
		}
		seq = resp.GetAcquired().GetSequencer()
	}
	rel, err := c.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	if err != nil || !rel.GetReleased() {
		t.Errorf("release: %v (released %v)", err, rel.GetReleased())
		return false
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Errorf("stream ended without an event: %v", err)
			return false
		}
		switch {
		case resp.GetReleased() != nil:
			return true
		case resp.GetLost() != nil:
			t.Errorf("lost instead of released: %v", resp.GetLost())
			return false
		}
	}
}
