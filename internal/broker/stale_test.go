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

// staleKey is a broker on a real agent with key's watch parked on its
// first answer: a young lazy subscriber keeps it pending (a parked watch
// does not read the key again for a grant made here) for as long as the
// tests below need.
type staleKey struct {
	t     *testing.T
	b     *broker.Broker
	store *consulstore.Store
	key   string
}

func newStaleKey(t *testing.T, key string) *staleKey {
	_, store := startStore(t, consulstore.Options{WaitTime: 5 * time.Second})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	return &staleKey{t: t, b: b, store: store, key: key}
}

// park starts the key's watch with a young subscriber and waits until its
// first answer parked it.
func (s *staleKey) park() {
	parked := make(chan struct{}, 1)
	s.t.Cleanup(broker.SetParkedHook(func(k string) {
		if k == s.key {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
	}))
	_, _, closeSub := s.b.SubscribeLazy(s.key)
	s.t.Cleanup(closeSub)
	s.b.StartWatch(s.key)
	select {
	case <-parked:
	case <-time.After(5 * time.Second):
		s.t.Fatal("the watch never parked")
	}
}

// acquire starts a hold on the key that waits for ever.
func (s *staleKey) acquire() *testHold {
	return startHold(s.t, s.b, &broker.AcquireSpec{Key: s.key, WaitForever: true}, nil)
}

func (s *staleKey) writes() uint64 { return s.store.OpCounts()["kv_txn_write"] }

// handOff releases held's grant and checks that waiter got the lock from
// it in one transaction (the holder's clean-up, its record and session,
// may have come since: at most 2 writes).
func (s *staleKey) handOff(held broker.Event, waiter *testHold) broker.Event {
	s.t.Helper()
	before := s.writes()
	ok, err := s.b.Release(context.Background(), s.key, held.Sequencer.Session, held.Sequencer.Token)
	require.NoError(s.t, err)
	require.True(s.t, ok)
	got := waiter.next(broker.EventAcquired)
	assert.Greater(s.t, got.Sequencer.Token, held.Sequencer.Token)
	assert.LessOrEqual(s.t, s.writes()-before, uint64(2), "a hand-off, not a release and an attempt")
	return got
}

// A waiter that arrives behind a hold of this replica while the key's
// watch is parked on a listing from before the hold's grant (the listing
// shows the key free) makes no attempt: the key is busy for sure, and an
// attempt on that listing is bound to fail. It reads the key instead,
// takes its ticket in the key's shared queue (its one transaction), queues,
// and the holder's release hands it the lock in one transaction.
func TestWaiterBehindLocalHoldSkipsStaleFreeListing(t *testing.T) {
	s := newStaleKey(t, "hub/stale-free")
	s.park()
	holder := s.acquire()
	held := holder.next(broker.EventAcquired)

	before := s.writes()
	waiter := s.acquire()
	queued := waiter.next(broker.EventQueued)
	assert.Equal(t, before+1, s.writes(), "the waiter made one transaction before it queued: its ticket, no attempt")
	require.Len(t, queued.State.Holders, 1, "it queued behind the holder (a consistent read), not on the parked listing")
	assert.Equal(t, held.Sequencer.Session, queued.State.Holders[0].Session)
	s.handOff(held, waiter)
}

// The same with a parked listing that shows an earlier holder of this
// replica, gone since: it handed the lock over here, which the parked
// watch did not read. The next waiter queues behind the holder the key
// has (a consistent read), not behind the gone one, and gets the lock
// from it in one transaction.
func TestWaiterBehindLocalHoldSkipsStaleHolderListing(t *testing.T) {
	s := newStaleKey(t, "hub/stale-holder")
	first := s.acquire()
	h1 := first.next(broker.EventAcquired)
	s.park() // its listing shows h1

	second := s.acquire()
	q1 := second.next(broker.EventQueued)
	require.Len(t, q1.State.Holders, 1)
	require.Equal(t, h1.Sequencer.Session, q1.State.Holders[0].Session)
	h2 := s.handOff(h1, second)
	if !first.ended(5 * time.Second) { // first's clean-up is done: the writes below are the third's
		t.Fatal("the first hold did not end after its release")
	}

	before := s.writes()
	third := s.acquire()
	q2 := third.next(broker.EventQueued)
	assert.Equal(t, before+1, s.writes(), "the waiter made one transaction before it queued: its ticket, no attempt")
	require.Len(t, q2.State.Holders, 1)
	assert.Equal(t, h2.Sequencer.Session, q2.State.Holders[0].Session, "queued behind the holder the key has, not the gone one the parked listing shows")
	s.handOff(h2, third)
}
