package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// TestElection: two candidates and an observer on one key. The first
// leads, the second waits; the observer sees the leader, a proclaimed
// value, the resignation (no leader) and the next leader; Leader agrees.
func TestElection(t *testing.T) {
	c, _ := newClient(t)
	const key = "election/go"
	opts := []client.LockOption{client.WithLockDelay(0)}
	a, b := c.Election(key, opts...), c.Election(key, opts...)
	assert.Equal(t, key, a.Key())

	octx, stop := context.WithCancel(ctx(t))
	obs, err := c.Election(key).Observe(octx)
	require.NoError(t, err)
	next := func() *lockbrokerv1.Holder {
		t.Helper()
		select {
		case h, ok := <-obs.C:
			require.True(t, ok, "observation ended: %v", obs.Err())
			return h
		case <-time.After(10 * time.Second):
			t.Fatal("no leader change observed within 10s")
			return nil
		}
	}
	assert.Nil(t, next(), "nobody leads yet")
	h, err := a.Leader(ctx(t))
	require.NoError(t, err)
	assert.Nil(t, h)
	assert.ErrorIs(t, a.Proclaim(ctx(t), []byte("x")), client.ErrNotLeader)
	assert.NoError(t, a.Resign(ctx(t)), "resigning without leading does nothing")

	leaseA, err := a.Campaign(ctx(t), []byte("alpha"))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(next().GetValue()))
	h, err = b.Leader(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, "alpha", string(h.GetValue()))
	assert.Equal(t, leaseA.Sequencer().GetToken(), h.GetToken())

	require.NoError(t, a.Proclaim(ctx(t), []byte("alpha-2")))
	got := next()
	assert.Equal(t, "alpha-2", string(got.GetValue()))
	assert.Equal(t, leaseA.Sequencer().GetToken(), got.GetToken(), "a proclamation keeps the token")

	type result struct {
		lease *client.Lease
		err   error
	}
	bLeads := make(chan result, 1)
	go func() {
		l, err := b.Campaign(ctx(t), []byte("beta"))
		bLeads <- result{l, err}
	}()
	select {
	case <-bLeads:
		t.Fatal("b leads while a does")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, a.Resign(ctx(t)))
	<-leaseA.Lost()
	var leaseB *client.Lease
	select {
	case r := <-bLeads:
		require.NoError(t, r.err)
		leaseB = r.lease
	case <-time.After(10 * time.Second):
		t.Fatal("b did not lead after a resigned")
	}
	assert.Greater(t, leaseB.Sequencer().GetToken(), leaseA.Sequencer().GetToken())
	for h := next(); h == nil || string(h.GetValue()) != "beta"; h = next() {
		// nil (a resigned) may come first, or not, if b took the key at once
	}
	require.NoError(t, b.Resign(ctx(t)))
	assert.Nil(t, next(), "b resigned: nobody leads")

	stop()
	for range obs.C {
	}
	<-obs.Done()
	assert.ErrorIs(t, obs.Err(), context.Canceled)
}
