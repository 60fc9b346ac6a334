package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A waiter that arrives behind a hold of this replica while the key's
// watch is parked on a listing from before the hold's grant (the listing
// shows the key free: a parked watch does not read a key again for a grant
// made here) makes no transaction: the key is busy for sure, and an
// attempt on that listing is bound to fail. It reads the key instead,
// queues, and the holder's release hands it the lock in one transaction.
func TestWaiterBehindLocalHoldSkipsStaleFreeListing(t *testing.T) {
	_, store := startStore(t, consulstore.Options{WaitTime: 5 * time.Second})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	key := "hub/stale-free"
	parked := make(chan struct{}, 1)
	t.Cleanup(broker.SetParkedHook(func(k string) {
		if k == key {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
	}))

	// A young subscriber and a started watch: its first answer lists the
	// key free, and it parks (its only subscriber is young) for 200 ms.
	_, _, closeSub := b.SubscribeLazy(key)
	t.Cleanup(closeSub)
	b.StartWatch(key)
	select {
	case <-parked:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch never parked")
	}

	acquire := func() (<-chan broker.Event, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		events := make(chan broker.Event, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = b.Acquire(ctx, broker.AcquireSpec{Key: key, WaitForever: true}, func(e broker.Event) error {
				events <- e
				return nil
			})
		}()
		t.Cleanup(func() { cancel(); <-done })
		return events, cancel
	}
	next := func(events <-chan broker.Event, kind broker.EventKind) broker.Event {
		t.Helper()
		for {
			select {
			case e := <-events:
				if e.Kind == kind {
					return e
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no event %v", kind)
			}
		}
	}
	holder, _ := acquire()
	held := next(holder, broker.EventAcquired)

	writes := func() uint64 { return store.OpCounts()["kv_txn_write"] }
	before := writes()
	waiter, _ := acquire()
	queued := next(waiter, broker.EventQueued)
	assert.Equal(t, before, writes(), "the waiter made no transaction before it queued")
	require.Len(t, queued.State.Holders, 1, "it queued behind the holder (a consistent read), not on the parked listing")
	assert.Equal(t, held.Sequencer.Session, queued.State.Holders[0].Session)

	ok, err := b.Release(context.Background(), key, held.Sequencer.Session, held.Sequencer.Token)
	require.NoError(t, err)
	require.True(t, ok)
	got := next(waiter, broker.EventAcquired)
	assert.Greater(t, got.Sequencer.Token, held.Sequencer.Token)
	// One transaction released the holder and granted the waiter; the
	// holder's clean-up (its record, its session) may have come since.
	assert.LessOrEqual(t, writes()-before, uint64(2), "a hand-off, not a release and an attempt")
}
