package broker_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// lockForever is a lock on key with a session of its own, waiting for ever.
func lockForever(key string) *broker.AcquireSpec {
	return &broker.AcquireSpec{Key: key, WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second}}
}

// TestHandOffAnnouncesFirst: a release that hands the lock to a waiter of
// its replica returns once the waiter has sent `acquired`, so the new
// holder hears before the old one does (and a client that releases and
// then looks finds the lock taken). That holds for a Release and for a
// holder whose stream is cancelled. A waiter whose `acquired` cannot go
// out (its client does not read) holds the releaser up only so long.
func TestHandOffAnnouncesFirst(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	// Long enough that only the ordering can make the rounds pass, even
	// on a loaded machine under -race.
	restore := broker.SetAnnounceWait(10 * time.Second)
	defer restore()

	const key = "handoff/announce"
	holder := startHold(t, b, lockForever(key), nil)
	cur := holder.next(broker.EventAcquired).Sequencer
	for i := range 20 {
		w := startHold(t, b, lockForever(key), nil)
		w.next(broker.EventQueued)
		time.Sleep(time.Duration(i%4) * 5 * time.Millisecond) // a waiter just queued, or asleep a while
		var told bool
		var got broker.Event
		if i%2 == 0 {
			ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
			require.NoError(t, err, "round %d", i)
			require.True(t, ok, "round %d", i)
			got, told = w.sent(broker.EventAcquired)
			assert.True(t, told, "round %d: Release returned before the new holder's `acquired` was sent", i)
		} else {
			holder.cancel()
			if !holder.ended(10 * time.Second) {
				t.Fatalf("round %d: the cancelled holder did not end", i)
			}
			got, told = w.sent(broker.EventAcquired)
			assert.True(t, told, "round %d: the cancelled holder ended before the new holder's `acquired` was sent", i)
		}
		if !told {
			got = w.next(broker.EventAcquired)
		}
		assert.Greater(t, got.Sequencer.Token, cur.Token, "round %d", i)
		holder, cur = w, got.Sequencer
	}

	t.Run("blocked waiter", func(t *testing.T) {
		const wait = 200 * time.Millisecond
		restore := broker.SetAnnounceWait(wait)
		defer restore()
		key := fmt.Sprintf("%s/blocked", key)
		holder := startHold(t, b, lockForever(key), nil)
		cur := holder.next(broker.EventAcquired).Sequencer
		unblock := make(chan struct{})
		w := startHold(t, b, lockForever(key), func(e broker.Event) {
			if e.Kind == broker.EventAcquired {
				<-unblock
			}
		})
		w.next(broker.EventQueued)
		start := time.Now()
		ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
		took := time.Since(start)
		require.NoError(t, err)
		require.True(t, ok)
		_, told := w.sent(broker.EventAcquired)
		assert.False(t, told, "the waiter's send is still held")
		assert.GreaterOrEqual(t, took, wait, "Release waited for the new holder's `acquired`")
		assert.Less(t, took, wait+5*time.Second, "Release waited past its bound")
		close(unblock)
		got := w.next(broker.EventAcquired)
		assert.Greater(t, got.Sequencer.Token, cur.Token)
		t.Logf("Release took %s with the new holder's send held", took.Round(time.Millisecond))
	})
}

// TestWaiterWakesWhenCourtesyEnds: a waiter that the courtesy to Consul's
// own clients keeps from the free key sleeps until the courtesy ends,
// then takes the key, even when the courtesy ended between the look that
// refused the key and the sleep. That sleep had no timer then, and waited
// for a change of the key that nobody made: under -race,
// TestWaiterBehindLocalHolderSleepsWithoutWatch hung so in about one run
// in twenty (once in CI). Here the hook holds the waiter past the
// courtesy at that moment, every round.
func TestWaiterWakesWhenCourtesyEnds(t *testing.T) {
	t.Cleanup(broker.SetHandoffChain(0, 30*time.Millisecond)) // restored once the broker has closed
	var held atomic.Int32
	t.Cleanup(broker.SetCourtesyHook(func(string) {
		held.Add(1)
		time.Sleep(40 * time.Millisecond)
	}))
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	var took []time.Duration
	exercised := 0
	for i := range 5 {
		key := fmt.Sprintf("handoff/courtesy/%d", i)
		holder := startHold(t, b, lockForever(key), nil)
		cur := holder.next(broker.EventAcquired).Sequencer
		w := startHold(t, b, lockForever(key), nil)
		w.next(broker.EventQueued)
		before := held.Load()
		t0 := time.Now()
		ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
		require.NoError(t, err, "round %d", i)
		require.True(t, ok, "round %d", i)
		w.nextWithin(broker.EventAcquired, 3*time.Second)
		took = append(took, time.Since(t0))
		if held.Load() > before {
			exercised++ // (a waiter that first looks after the courtesy never meets it)
		}
		w.cancel()
		holder.cancel()
	}
	t.Logf("release -> grant, the courtesy ending before the waiter sleeps: %v (%d of 5 rounds met the courtesy)", took, exercised)
	assert.Positive(t, exercised, "no round met the courtesy")
}

// TestWaiterBehindLocalHolderSleepsWithoutWatch: a waiter next behind a
// holder of its own replica sleeps with no blocking query of the key (a
// hand-off then commits with no query answering at the same moment), and
// when the holder's release frees the key instead of handing it over
// (here the hand-off chain is over at once), the waiter still hears of
// it at once: the holder's end starts the key's watch. Without that it
// would sleep until its watch started on its own, 200 ms after the key's
// first subscription.
func TestWaiterBehindLocalHolderSleepsWithoutWatch(t *testing.T) {
	t.Cleanup(broker.SetHandoffChain(0, 5*time.Millisecond)) // restored once the broker has closed
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)

	const rounds = 10
	var took []time.Duration
	watchless := 0
	for i := range rounds {
		key := fmt.Sprintf("handoff/watchless/%d", i)
		began := time.Now()
		holder := startHold(t, b, lockForever(key), nil)
		cur := holder.next(broker.EventAcquired).Sequencer
		w := startHold(t, b, lockForever(key), nil)
		w.next(broker.EventQueued)
		time.Sleep(5 * time.Millisecond)
		// The key's first subscription is younger than its watch's delay:
		// only the waiter could have started the watch.
		if mode := b.WatchMode(key); time.Since(began) < 150*time.Millisecond {
			assert.Equal(t, "pending", mode, "round %d: the waiter next behind a local holder started the key's watch", i)
			watchless++
		}
		t0 := time.Now()
		ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
		require.NoError(t, err, "round %d", i)
		require.True(t, ok, "round %d", i)
		w.nextWithin(broker.EventAcquired, 5*time.Second)
		took = append(took, time.Since(t0))
		w.cancel()
		holder.cancel()
	}
	slices.Sort(took)
	t.Logf("release with no hand-off -> the waiter's grant: %v (%d rounds checked watch-less)", took, watchless)
	assert.Less(t, took[rounds/2], 100*time.Millisecond, "median")
	assert.Positive(t, watchless, "no round was quick enough to check the watch")
}
