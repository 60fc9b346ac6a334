package broker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A grant that comes after its session's safe deadline is not announced
// (chaos seed 262436254 found a replica stopped between its granting
// transaction and `acquired`: resumed after the deadline, it sent
// `acquired` with guaranteed_for 0 while another client held the key).
// Here the agent is stopped right after the grant and the hold announces
// it only once the deadline has passed: the stream must say `lost`
// (RENEWAL_FAILED) and never `acquired`.
func TestGrantPastSafeDeadlineIsNotAnnounced(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{CallTimeout: time.Second})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)

	const key = "grant/late"
	granted, proceed := make(chan struct{}), make(chan struct{})
	defer broker.SetGrantedHook(func(k string) {
		if k == key {
			close(granted)
			<-proceed
		}
	})()
	var mu sync.Mutex
	var events []broker.Event
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- b.Acquire(ctx, &broker.AcquireSpec{Key: key, WaitForever: true,
			NewSession: &broker.SessionSpec{Name: "late", TTL: 10 * time.Second}},
			func(e broker.Event) error {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
				return nil
			})
	}()
	select {
	case <-granted:
	case <-time.After(10 * time.Second):
		t.Fatal("no grant")
	}
	grantedAt := time.Now()
	agent.Stop() // renewals fail from now on (the first is due 3.3 s after the session was made)
	// The session was made before the grant: its safe deadline (its TTL
	// less a second after it was made) is before grantedAt + 9 s.
	time.Sleep(time.Until(grantedAt.Add(10*time.Second - time.Second + 500*time.Millisecond)))
	close(proceed)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the hold did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, events)
	for _, e := range events {
		assert.NotEqual(t, broker.EventAcquired, e.Kind, "a grant past its safe deadline is announced (guaranteed_for %s)", e.GuaranteedFor)
	}
	last := events[len(events)-1]
	assert.Equal(t, broker.EventLost, last.Kind)
	assert.Equal(t, broker.LostRenewalFailed, last.Reason)
	assert.Contains(t, last.Detail, "safe deadline")
}
