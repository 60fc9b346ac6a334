package broker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A semaphore waiter that reads the state with another waiter's grant in
// it, and a slot still free, while that grantee has not yet left the
// replica's queue of waiters, counts it as ahead (rank 1, one slot free)
// and sleeps. Nothing changes in Consul after that, so no publication
// wakes it: only the grantee's leaving the queue can. It did not, and the
// waiter slept with a free slot until something else changed the prefix
// (e2e TestSemaphoreAcquireOnFreshPrefix, 8 contenders for 3 slots, failed
// so about once in a hundred runs on a loaded machine; in CI once). Here
// the hook holds the grantee in the queue until the waiter has queued.
func TestSemaphoreGranteeLeavingWakesTheNextWaiter(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	const prefix, limit = "queue/grantee-wakes", 3

	type hold struct {
		events chan broker.Event
		done   chan error
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	acquire := func(name string) *hold {
		h := &hold{events: make(chan broker.Event, 100), done: make(chan error, 1)}
		go func() {
			h.done <- b.Acquire(ctx, &broker.AcquireSpec{Key: prefix, Limit: limit, WaitForever: true, Value: []byte(name),
				NewSession: &broker.SessionSpec{Name: name, TTL: 30 * time.Second}},
				func(e broker.Event) error { h.events <- e; return nil })
		}()
		return h
	}
	// next waits for an event that matches want.
	next := func(h *hold, within time.Duration, want func(broker.Event) bool) (broker.Event, bool) {
		deadline := time.After(within)
		for {
			select {
			case e := <-h.events:
				if want(e) {
					return e, true
				}
			case err := <-h.done:
				t.Fatalf("the hold ended: %v", err)
			case <-deadline:
				return broker.Event{}, false
			}
		}
	}
	isAcquired := func(e broker.Event) bool { return e.Kind == broker.EventAcquired }

	first := acquire("first")
	_, ok := next(first, 10*time.Second, isAcquired)
	require.True(t, ok, "the first hold was not granted")

	var held atomic.Bool // only the first grantee is held in the queue
	inQueue, proceed := make(chan struct{}), make(chan struct{})
	t.Cleanup(broker.SetLeavingHook(func(key string, granted bool) {
		if key == prefix && granted && held.CompareAndSwap(false, true) {
			close(inQueue)
			<-proceed
		}
	}))
	grantee := acquire("grantee")
	select {
	case <-inQueue:
	case <-time.After(10 * time.Second):
		t.Fatal("the second hold was not granted")
	}

	// The waiter reads two holders and one slot free while the grantee is
	// still in this replica's local queue. Its place in the shared order
	// (its contender entry's CreateIndex, behind no waiter without a
	// slot) decides, so it takes the free slot at once rather than sleep
	// on it behind the grantee, as it did when the local order decided.
	waiter := acquire("waiter")
	_, ok = next(waiter, 5*time.Second, isAcquired)
	require.True(t, ok, "the waiter slept with a free slot while the grantee was still in the local queue")

	close(proceed)
	_, ok = next(grantee, 5*time.Second, isAcquired)
	require.True(t, ok, "the grantee did not announce its grant")
}
