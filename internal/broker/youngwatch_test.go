package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestHandOffChainRunsNoQuery: a hot key passed by hand-off from young
// hold to young hold runs no blocking query, however long the chain
// lasts, because no hold on it ever stops being young (each is checked
// every 5 ms instead). Before, the key's watch started when its first
// hold's 200 ms were up, long after that hold had gone, and Consul
// answered its query at each later hand-off, in the same moment as the
// hand-off's transaction: in BenchmarkHandOff half of the hand-offs ran
// so, and their transaction took 0.5-0.8 ms against 0.3-0.4 ms.
func TestHandOffChainRunsNoQuery(t *testing.T) {
	t.Cleanup(broker.SetHandoffChain(time.Minute, 50*time.Millisecond)) // restored once the broker has closed
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)

	const key = "youngwatch/chain"
	born := time.Now()
	holder := startHold(t, b, lockForever(key), nil)
	cur := holder.next(broker.EventAcquired).Sequencer
	before := store.OpCounts()
	start := time.Now()
	rounds := 0
	// The oldest any hold got (subscribed as a waiter, until its end):
	// one older than 200 ms needs the watch.
	var oldest time.Duration
	for time.Since(start) < 600*time.Millisecond { // three times a hold's young 200 ms
		wBorn := time.Now()
		w := startHold(t, b, lockForever(key), nil)
		w.next(broker.EventQueued)
		time.Sleep(15 * time.Millisecond)
		ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
		require.NoError(t, err)
		require.True(t, ok)
		got := w.next(broker.EventAcquired)
		require.Greater(t, got.Sequencer.Token, cur.Token)
		holder.next(broker.EventReleased)
		holder.cancel()
		require.True(t, holder.ended(10*time.Second))
		oldest = max(oldest, time.Since(born))
		holder, cur, born = w, got.Sequencer, wBorn
		rounds++
	}
	d := opsSince(store, before)
	t.Logf("%d hand-offs in %v, the oldest hold %v: Consul calls %v", rounds, time.Since(start).Round(time.Millisecond), oldest.Round(time.Millisecond), d)
	if oldest > 180*time.Millisecond {
		t.Skipf("the machine was too slow: a hold lived %v, and one older than 200 ms needs its watch", oldest)
	}
	assert.Zero(t, d["kv_watch"], "blocking queries of a key held only by young holds")
	assert.Equal(t, "pending", b.WatchMode(key))
	assert.NotZero(t, d["kv_txn_read"], "the young holds were checked")
}

// TestOldestYoungHoldIsWatchedOnTime: on a key whose holds are all young,
// the watch starts when the first of them stops being young (it is no
// longer checked from then on), not when the last does. Three slots of a
// semaphore are taken at 0, 20 and 190 ms; the first is released; the
// second's session is destroyed at 250 ms, 30 ms after its young 200 ms
// ended. Before, its loss was heard at 390 ms, when the youngest stopped
// being young, 140 ms late; now within the loss bound.
func TestOldestYoungHoldIsWatchedOnTime(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	consul := agent.Client()

	for i := range 5 {
		key := fmt.Sprintf("youngwatch/oldest/%d", i)
		sem := func() *broker.AcquireSpec {
			return &broker.AcquireSpec{Key: key, Limit: 3, WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second}}
		}
		t0 := time.Now()
		first := startHold(t, b, sem(), nil)
		first.next(broker.EventAcquired)
		time.Sleep(time.Until(t0.Add(20 * time.Millisecond)))
		second := startHold(t, b, sem(), nil)
		seq := second.next(broker.EventAcquired).Sequencer
		first.cancel()
		time.Sleep(time.Until(t0.Add(190 * time.Millisecond)))
		third := startHold(t, b, sem(), nil)
		third.next(broker.EventAcquired)
		time.Sleep(time.Until(t0.Add(250 * time.Millisecond)))
		if late := time.Since(t0) - 250*time.Millisecond; late > 40*time.Millisecond {
			t.Logf("round %d: the machine was too slow to set the scene (%v late); skipped", i, late)
			continue
		}
		destroyed := time.Now()
		_, err := consul.Session().Destroy(seq.Session, nil)
		require.NoError(t, err)
		second.nextWithin(broker.EventLost, 5*time.Second)
		took := time.Since(destroyed)
		t.Logf("round %d: the 230 ms old hold heard its loss %v after its session was destroyed", i, took.Round(time.Millisecond))
		assert.Less(t, took, 100*time.Millisecond, "round %d: the loss of a hold just past its young 200 ms", i)
		third.cancel()
	}
}
