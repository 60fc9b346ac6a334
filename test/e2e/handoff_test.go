package e2e

import (
	"errors"
	"fmt"
	"io"
	"slices"
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

// Issue 12: a Release on the replica where the next waiter waits hands
// the lock over in one transaction (unlock + the waiter's grant): with
// the old holder's clean-up (its record deleted, one write), two writes
// per hand-off, where release-then-acquire takes three. The release comes
// after the waiter has slept a while, or right after its `queued` (the
// waiter offers its slot before the broker sends `queued`).
func TestHandOffIsOneTransaction(t *testing.T) {
	for _, settle := range []time.Duration{20 * time.Millisecond, 0} {
		t.Run(fmt.Sprintf("settle=%s", settle), func(t *testing.T) {
			agent := consultest.Start(t)
			r := brokertest.Start(t, agent)
			c := r.Locks(t)
			key := "handoff/one-txn"
			holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
			cur := holder.acquired(5 * time.Second).GetSequencer()
			const n = 20
			before := r.Store.OpCounts()["kv_txn_write"]
			for i := range n {
				w := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast(), Value: fmt.Appendf(nil, "w%d", i)})
				w.next(5*time.Second, isQueued)
				time.Sleep(settle)
				_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: cur.GetSessionId(), Token: cur.GetToken()})
				require.NoError(t, err)
				got := w.acquired(5 * time.Second).GetSequencer()
				holder.next(5*time.Second, lkIsReleased)
				require.NoError(t, ignoreEOF(holder.end(5*time.Second)), "the old holder's stream ends after its clean-up")
				assert.Greater(t, got.GetToken(), cur.GetToken(), "hand-off %d: the token grows", i)
				st := lkGetLock(t, c, key)
				assert.Equal(t, got.GetSessionId(), lkHolder(t, st).GetSessionId(), "hand-off %d: Consul shows the waiter holding", i)
				resp, err := c.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: got})
				require.NoError(t, err)
				assert.True(t, resp.GetCurrent(), "hand-off %d: the handed-over grant is current (its record lists its token)", i)
				holder, cur = w, got
			}
			writes := r.Store.OpCounts()["kv_txn_write"] - before
			t.Logf("%d hand-offs, %d write transactions", n, writes)
			// Each waiter takes a ticket in the key's shared queue (one
			// write); the hand-off removes it in its own transaction.
			assert.LessOrEqual(t, writes, uint64(3*n+2), "one write per waiter's ticket, one per hand-off and one per old holder's clean-up")
		})
	}
}

// Waiters that go away while the lock is handed over never leave it held
// by nobody's stream, and never let two holders at once: many rounds of a
// release racing a waiter's cancel, checked in Consul.
func TestHandOffRacesWaiterCancel(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	key := "handoff/cancel-race"
	holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	cur := holder.acquired(5 * time.Second).GetSequencer()
	for i := range 30 {
		w1 := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		w1.next(5*time.Second, isQueued)
		w2 := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		w2.next(5*time.Second, isQueued)
		time.Sleep(time.Duration(5+i%10) * time.Millisecond)
		go w1.cancel() // races the release below
		_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: cur.GetSessionId(), Token: cur.GetToken()})
		require.NoError(t, err)
		holder.next(5*time.Second, lkIsReleased)
		// w2 gets the lock: at once, or once w1's grant (if it got one
		// before its cancel landed) is released.
		got := w2.acquired(20 * time.Second).GetSequencer()
		st := lkGetLock(t, c, key)
		require.Equal(t, got.GetSessionId(), lkHolder(t, st).GetSessionId(), "round %d", i)
		holder, cur = w2, got
	}
	_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: cur.GetSessionId(), Token: cur.GetToken()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(lkGetLock(t, c, key).GetHolders()) == 0 }, 5*time.Second, 20*time.Millisecond, "the lock ends free")
}

// ignoreEOF is nil for a stream's clean end.
func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// A holder whose stream is cancelled hands the lock to the next local
// waiter the same way: one transaction, the waiter's grant current in
// Consul at once.
func TestHandOffOnCancel(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	key := "handoff/cancel"
	holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	cur := holder.acquired(5 * time.Second).GetSequencer()
	for i := range 5 {
		w := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		w.next(5*time.Second, isQueued)
		time.Sleep(20 * time.Millisecond)
		before := r.Store.OpCounts()["kv_txn_write"]
		holder.cancel()
		got := w.acquired(5 * time.Second).GetSequencer()
		handing := r.Store.OpCounts()["kv_txn_write"] - before
		assert.Greater(t, got.GetToken(), cur.GetToken(), "round %d", i)
		assert.Equal(t, got.GetSessionId(), lkHolder(t, lkGetLock(t, c, key)).GetSessionId(), "round %d", i)
		// One write hands the lock over; the old holder's record deletion may
		// land before the waiter hears (release then grant would be three).
		assert.LessOrEqual(t, handing, uint64(2), "round %d: one write hands the lock over", i)
		holder, cur = w, got
	}
}

// A waiter next behind a holder of its own replica sleeps without the
// key's watch (the holder's release hands it the lock). When the holder
// ends another way, its loss (here the key deleted under it, a young
// hold) must still reach the waiter at once: the holder's end starts the
// watch. Without that the waiter would sleep until its watch started on
// its own, about 200 ms after the key's first subscription.
func TestHeadWaiterHearsLocalHolderLoss(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	cc := agent.Client()
	const rounds = 10
	var took []time.Duration
	for i := range rounds {
		key := fmt.Sprintf("handoff/loss/%d", i)
		holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		holder.acquired(5 * time.Second)
		waiter := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		waiter.next(5*time.Second, isQueued)
		time.Sleep(10 * time.Millisecond)
		t0 := time.Now()
		_, err := cc.KV().Delete(key, nil)
		require.NoError(t, err)
		holder.next(5*time.Second, isLost)
		waiter.acquired(5 * time.Second)
		took = append(took, time.Since(t0))
		holder.cancel()
		waiter.cancel()
	}
	slices.Sort(took)
	t.Logf("key deleted under the holder -> the next waiter's `acquired`: %v", took)
	assert.Less(t, took[rounds/2], 100*time.Millisecond, "median")
}
