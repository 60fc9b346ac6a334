package broker_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A renewer renews its session every TTL/3 with a timer (no goroutine
// waits in between), reports each new safe deadline, reports the
// session's end once, and after Stop renews nothing more.
func TestRenewer(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 10 * time.Second
	newSession := func() (string, time.Time) {
		start := time.Now()
		id, err := store.CreateSession(ctx, broker.SessionSpec{TTL: ttl})
		require.NoError(t, err)
		return id, start
	}

	id, start := newSession()
	stoppedID, stoppedStart := newSession()
	g0 := runtime.NumGoroutine()
	live := broker.NewRenewer(store, id, ttl, start)
	stopped := broker.NewRenewer(store, stoppedID, ttl, stoppedStart)
	const many = 200 // renewers between renewals hold no goroutine
	var idle []broker.Renewer
	for range many {
		r := broker.NewRenewer(store, stoppedID, ttl, stoppedStart)
		r.Start()
		idle = append(idle, r)
	}
	live.Start()
	stopped.Start()
	assert.Less(t, runtime.NumGoroutine()-g0, many/10, "goroutines while %d renewers wait", many+2)
	for _, r := range idle {
		r.Stop()
	}
	stopped.Stop()
	stopped.Stop() // idempotent

	sent := time.Now()
	select {
	case d := <-live.Renewed():
		at := time.Now()
		assert.GreaterOrEqual(t, at.Sub(sent), ttl/3-100*time.Millisecond, "not before TTL/3")
		// The deadline counts from when the renewal was sent, less the
		// safety margin (1 s for a 10 s TTL).
		assert.WithinRange(t, d, sent.Add(ttl/3+ttl-time.Second-500*time.Millisecond), at.Add(ttl-time.Second))
	case err := <-live.Failed():
		t.Fatalf("renewal failed: %v", err)
	case <-time.After(ttl/3 + 2*time.Second):
		t.Fatal("no renewal within TTL/3 + 2 s")
	}

	// The session ends in Consul: the next renewal says so, once.
	require.NoError(t, store.DestroySession(ctx, id))
	select {
	case err := <-live.Failed():
		assert.ErrorIs(t, err, broker.ErrSessionNotFound)
	case <-time.After(ttl/3 + 2*time.Second):
		t.Fatal("the session's end not reported within TTL/3 + 2 s")
	}
	live.Stop()

	// The renewer stopped before its first renewal reported nothing.
	select {
	case d := <-stopped.Renewed():
		t.Fatalf("a stopped renewer renewed (deadline %s)", d)
	case err := <-stopped.Failed():
		t.Fatalf("a stopped renewer reported %v", err)
	default:
	}
}

// Issue 41 (suspicion: little slack on a pooled session): the pool hands
// a session out up to TTL/2 after its last renewal. Its hold's first
// renewal must come TTL/3 after that renewal, not TTL/3 after the hand-out
// (which left 1 s before the safe deadline, 2.5 s before Consul's TTL for
// the default 15 s).
func TestRenewerOfASessionRenewedLongAgo(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	const ttl = 15 * time.Second
	id, err := store.CreateSession(t.Context(), broker.SessionSpec{TTL: ttl})
	require.NoError(t, err)
	lastRenewed := time.Now().Add(-ttl / 2) // as the pool may hand it out
	r := broker.NewRenewer(store, id, ttl, lastRenewed)
	began := time.Now()
	r.Start()
	t.Cleanup(r.Stop)
	select {
	case d := <-r.Renewed():
		assert.Less(t, time.Since(began), time.Second, "renewed at once: its last renewal is more than TTL/3 old")
		assert.WithinRange(t, d, began.Add(ttl-2*time.Second), time.Now().Add(ttl))
	case err := <-r.Failed():
		t.Fatalf("renewal failed: %v", err)
	case <-time.After(ttl / 3):
		t.Fatal("no renewal within TTL/3 of the hand-out")
	}
}
