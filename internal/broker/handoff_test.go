package broker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// handOffHold is one Broker.Acquire run on a goroutine of its own, with
// what its send saw.
type handOffHold struct {
	cancel   context.CancelFunc
	queued   chan struct{}         // one per `queued`
	granted  chan broker.Sequencer // the `acquired`
	told     atomic.Bool           // `acquired` was sent
	done     chan struct{}         // closed when Acquire returned
	err      error                 // what it returned
	sendHold chan struct{}         // if not nil, sending `acquired` waits for it to close
}

func startHandOffHold(t *testing.T, b *broker.Broker, key string, sendHold chan struct{}) *handOffHold {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &handOffHold{cancel: cancel, queued: make(chan struct{}, 64), granted: make(chan broker.Sequencer, 1), done: make(chan struct{}), sendHold: sendHold}
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Errorf("hold of %s did not end", key)
		}
	})
	spec := &broker.AcquireSpec{Key: key, WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second}}
	go func() {
		defer close(h.done)
		h.err = b.Acquire(ctx, spec, func(e broker.Event) error {
			switch e.Kind {
			case broker.EventQueued:
				h.queued <- struct{}{}
			case broker.EventAcquired:
				if h.sendHold != nil {
					<-h.sendHold
				}
				h.told.Store(true)
				h.granted <- e.Sequencer
			}
			return nil
		})
	}()
	return h
}

func (h *handOffHold) waitQueued(t *testing.T) {
	t.Helper()
	select {
	case <-h.queued:
	case <-time.After(10 * time.Second):
		t.Fatal("no `queued`")
	}
}

func (h *handOffHold) waitGranted(t *testing.T) broker.Sequencer {
	t.Helper()
	select {
	case seq := <-h.granted:
		return seq
	case <-h.done:
		t.Fatalf("the hold ended before its grant: %v", h.err)
	case <-time.After(10 * time.Second):
		t.Fatal("no `acquired`")
	}
	return broker.Sequencer{}
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
	holder := startHandOffHold(t, b, key, nil)
	cur := holder.waitGranted(t)
	for i := range 20 {
		w := startHandOffHold(t, b, key, nil)
		w.waitQueued(t)
		time.Sleep(time.Duration(i%4) * 5 * time.Millisecond) // a waiter just queued, or asleep a while
		if i%2 == 0 {
			ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
			require.NoError(t, err, "round %d", i)
			require.True(t, ok, "round %d", i)
			assert.True(t, w.told.Load(), "round %d: Release returned before the new holder's `acquired` was sent", i)
		} else {
			holder.cancel()
			select {
			case <-holder.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the cancelled holder did not end", i)
			}
			assert.True(t, w.told.Load(), "round %d: the cancelled holder ended before the new holder's `acquired` was sent", i)
		}
		got := w.waitGranted(t)
		assert.Greater(t, got.Token, cur.Token, "round %d", i)
		holder, cur = w, got
	}

	t.Run("blocked waiter", func(t *testing.T) {
		const wait = 200 * time.Millisecond
		restore := broker.SetAnnounceWait(wait)
		defer restore()
		key := fmt.Sprintf("%s/blocked", key)
		holder := startHandOffHold(t, b, key, nil)
		cur := holder.waitGranted(t)
		unblock := make(chan struct{})
		w := startHandOffHold(t, b, key, unblock)
		w.waitQueued(t)
		start := time.Now()
		ok, err := b.Release(context.Background(), key, cur.Session, cur.Token)
		took := time.Since(start)
		require.NoError(t, err)
		require.True(t, ok)
		assert.False(t, w.told.Load(), "the waiter's send is still held")
		assert.GreaterOrEqual(t, took, wait, "Release waited for the new holder's `acquired`")
		assert.Less(t, took, wait+5*time.Second, "Release waited past its bound")
		close(unblock)
		got := w.waitGranted(t)
		assert.Greater(t, got.Token, cur.Token)
		t.Logf("Release took %s with the new holder's send held", took.Round(time.Millisecond))
	})
}
