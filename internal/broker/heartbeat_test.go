package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestQueuedHeartbeat: a waiter whose key does not change hears `queued`
// again every QueuedHeartbeat, with the same holders and its session, so
// that its client can tell a live replica from a stalled one; one the
// lock-delay blocks hears how much of it is left now, not when it began.
// The heartbeats change nothing: the waiter still gets the key when it
// is released.
func TestQueuedHeartbeat(t *testing.T) {
	t.Parallel()
	agent, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	session := &broker.SessionSpec{TTL: 10 * time.Second, LockDelay: 6 * time.Second}

	t.Run("holders unchanged", func(t *testing.T) {
		spec := &broker.AcquireSpec{Key: "beat/held", WaitForever: true, NewSession: session}
		holder := startHold(t, b, spec, nil)
		held := holder.next(broker.EventAcquired)
		waiter := startHold(t, b, spec, nil)
		first := waiter.next(broker.EventQueued)
		at := time.Now()
		assert.Equal(t, broker.QueuedHeartbeat, first.Heartbeat)
		for i := range 2 {
			again := waiter.nextWithin(broker.EventQueued, broker.QueuedHeartbeat+2*time.Second)
			gap := time.Since(at)
			at = time.Now()
			t.Logf("heartbeat %d after %s", i+1, gap)
			assert.GreaterOrEqual(t, gap, broker.QueuedHeartbeat-100*time.Millisecond, "a heartbeat before its time")
			assert.Equal(t, first.Session, again.Session)
			assert.Equal(t, broker.QueuedHeartbeat, again.Heartbeat)
			require.Len(t, again.State.Holders, 1)
			assert.Equal(t, held.Sequencer.Session, again.State.Holders[0].Session)
			assert.Zero(t, again.LockDelayRemaining)
		}
		ok, err := b.Release(context.Background(), spec.Key, held.Sequencer.Session, held.Sequencer.Token)
		require.NoError(t, err)
		require.True(t, ok)
		waiter.next(broker.EventAcquired)
	})

	t.Run("lock-delay", func(t *testing.T) {
		spec := &broker.AcquireSpec{Key: "beat/delay", WaitForever: true, NewSession: session}
		holder := startHold(t, b, spec, nil)
		held := holder.next(broker.EventAcquired)
		waiter := startHold(t, b, spec, nil)
		waiter.next(broker.EventQueued)
		// The holder's session ends without a release: Consul applies
		// its lock-delay to the key.
		c, err := api.NewClient(agent.Config())
		require.NoError(t, err)
		_, err = c.Session().Destroy(held.Sequencer.Session, nil)
		require.NoError(t, err)
		var delayed broker.Event
		for delayed.LockDelayRemaining == 0 {
			delayed = waiter.next(broker.EventQueued)
		}
		again := waiter.nextWithin(broker.EventQueued, broker.QueuedHeartbeat+2*time.Second)
		t.Logf("lock-delay left %s, then %s a heartbeat later", delayed.LockDelayRemaining, again.LockDelayRemaining)
		require.Positive(t, again.LockDelayRemaining)
		assert.Less(t, again.LockDelayRemaining, delayed.LockDelayRemaining-broker.QueuedHeartbeat/2, "the heartbeat reports the lock-delay left now")
		assert.Empty(t, again.State.Holders)
		waiter.nextWithin(broker.EventAcquired, 10*time.Second)
	})
}
