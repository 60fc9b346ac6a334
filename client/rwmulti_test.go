package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// RWMutex against a broker and Consul: readers share, a writer is busy
// beside them, kind conflicts are ErrKindConflict both ways, a semaphore
// limit mismatch is not.
func TestRWMutexAgainstBroker(t *testing.T) {
	c, r := newClient(t)
	other := client.New(dial(t, r.Addr))
	rw := c.RWLock("rwmutex/k")

	r1, err := rw.RLock(ctx(t), client.WithValue([]byte("r1")))
	require.NoError(t, err)
	r2, err := other.RWLock("rwmutex/k").TryRLock(ctx(t), client.WithValue([]byte("r2")))
	require.NoError(t, err, "readers share")
	assert.True(t, r1.Sequencer().GetRead())
	assert.Greater(t, r2.Sequencer().GetToken(), r1.Sequencer().GetToken())

	_, err = other.RWLock("rwmutex/k").TryLock(ctx(t))
	require.ErrorIs(t, err, client.ErrBusy, "a writer beside readers")
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.ElementsMatch(t, []string{r1.Sequencer().GetSessionId(), r2.Sequencer().GetSessionId()}, sessions(se.Holders))
	assert.NotErrorIs(t, err, client.ErrKindConflict)

	_, err = other.TryLock(ctx(t), "rwmutex/k")
	require.ErrorIs(t, err, client.ErrKindConflict, "a plain lock of a read-write key")
	require.ErrorIs(t, err, client.ErrConflict)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, se.State.GetKind())

	plain, err := c.Lock(ctx(t), "rwmutex/plain")
	require.NoError(t, err)
	_, err = other.RWLock("rwmutex/plain").TryRLock(ctx(t))
	require.ErrorIs(t, err, client.ErrKindConflict, "a read hold of a plain lock key")
	require.ErrorAs(t, err, &se)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_LOCK, se.State.GetKind())

	sem, err := c.Lock(ctx(t), "rwmutex/sem", client.WithLimit(3))
	require.NoError(t, err)
	_, err = other.TryLock(ctx(t), "rwmutex/sem", client.WithLimit(2))
	require.ErrorIs(t, err, client.ErrConflict, "another limit")
	assert.NotErrorIs(t, err, client.ErrKindConflict, "a limit mismatch is not a kind conflict")

	for _, l := range []*client.Lease{r1, r2, plain, sem} {
		require.NoError(t, l.Release(ctx(t)))
	}
	w, err := rw.TryLock(ctx(t))
	require.NoError(t, err, "free once the readers released")
	assert.False(t, w.Sequencer().GetRead())
	assert.Greater(t, w.Sequencer().GetToken(), r2.Sequencer().GetToken())
	require.NoError(t, w.Release(ctx(t)))
}

// resumedOn is whether lease holds through replica i with a deadline
// later than known: the resume there answered (Replica names the replica
// being tried while the resume runs).
func resumedOn(lease *client.Lease, i int, known time.Time) bool {
	return lease.Replica() == i && lease.Deadline().After(known)
}

// A read or write hold whose replica is killed resumes on the other as
// the same kind of hold, with the same grant.
func TestRWHoldResumesOnAnotherReplica(t *testing.T) {
	for _, write := range []bool{false, true} {
		name := map[bool]string{false: "read", true: "write"}[write]
		t.Run(name, func(t *testing.T) {
			agent := consultest.Start(t)
			a := brokertest.StartProcess(t, agent)
			b := brokertest.StartProcess(t, agent)
			c := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr)))
			observer := client.New(dial(t, b.Addr))
			rw := c.RWLock("rwmutex/resume-" + name)
			take := rw.RLock
			if write {
				take = rw.Lock
			}
			lease, err := take(ctx(t), client.WithTTL(10*time.Second))
			require.NoError(t, err)
			seq, known := lease.Sequencer(), lease.Deadline()
			a.Kill()
			require.True(t, waitUntil(15*time.Second, func() bool { return resumedOn(lease, 1, known) || lease.Err() != nil }), "not resumed on B")
			require.NoError(t, lease.Err())
			assert.Equal(t, seq.GetToken(), lease.Sequencer().GetToken())
			assert.Equal(t, !write, lease.Sequencer().GetRead())
			st, err := observer.GetLock(ctx(t), "rwmutex/resume-"+name)
			require.NoError(t, err)
			require.Len(t, st.GetHolders(), 1)
			assert.Equal(t, !write, st.GetHolders()[0].GetRead(), "still the same kind of hold")
			ok, _, err := observer.CheckSequencer(ctx(t), lease.Sequencer())
			require.NoError(t, err)
			assert.True(t, ok)
			_, err = observer.RWLock("rwmutex/resume-" + name).TryLock(ctx(t))
			assert.ErrorIs(t, err, client.ErrBusy, "a writer is still excluded")
			require.NoError(t, lease.Release(ctx(t)))
		})
	}
}

// A multi-key lock against a broker: a grant per key in order, each key
// held by the one session; a loss of one key names it and ends the lease;
// WithKeys on a read-write lock or a semaphore is invalid.
func TestMultiKeyLockAgainstBroker(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c, other := client.New(dial(t, r.Addr)), client.New(dial(t, r.Addr))
	keys := []string{"multi/x", "multi/y", "multi/z"}

	lease, err := c.Lock(ctx(t), keys[0], client.WithKeys(keys[1:]...))
	require.NoError(t, err)
	assert.Equal(t, keys, lease.Keys())
	seqs := lease.Sequencers()
	require.Len(t, seqs, 3)
	for i, s := range seqs {
		assert.Equal(t, keys[i], s.GetKey())
		assert.Equal(t, lease.Sequencer().GetSessionId(), s.GetSessionId())
		ok, _, err := other.CheckSequencer(ctx(t), s)
		require.NoError(t, err)
		assert.True(t, ok, "the grant of %s is current", s.GetKey())
	}
	_, err = other.TryLock(ctx(t), keys[2])
	require.ErrorIs(t, err, client.ErrBusy)
	_, err = other.TryLock(ctx(t), "multi/w", client.WithKeys(keys[2]))
	require.ErrorIs(t, err, client.ErrBusy, "a multi-key try over a held key")
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.Contains(t, sessions(se.Holders), lease.Sequencer().GetSessionId(), "the busy error names the holder of the held key")
	st, err := other.GetLock(ctx(t), "multi/w")
	require.NoError(t, err)
	assert.Empty(t, st.GetHolders(), "the free key of a refused try is not held")

	_, err = agent.Client().KV().Delete(keys[1], nil)
	require.NoError(t, err)
	select {
	case <-lease.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the loss of a key was not reported")
	}
	assert.Equal(t, keys[1], lease.LostKey())
	require.True(t, waitUntil(5*time.Second, func() bool {
		st, err := other.GetLock(ctx(t), keys[2])
		return err == nil && len(st.GetHolders()) == 0
	}), "the other keys are released")

	_, err = c.RWLock("multi/rw").TryLock(ctx(t), client.WithKeys("multi/rw2"))
	assert.ErrorIs(t, err, client.ErrInvalidArgument, "WithKeys on a read-write lock")
	_, err = c.TryLock(ctx(t), "multi/sem", client.WithLimit(2), client.WithKeys("multi/sem2"))
	assert.ErrorIs(t, err, client.ErrInvalidArgument, "WithKeys on a semaphore")
}

// A multi-key lease whose replica is killed resumes on the other with
// every key, and Release there releases them all.
func TestMultiKeyLeaseResumesOnAnotherReplica(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	c := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr)))
	observer := client.New(dial(t, b.Addr))
	keys := []string{"multi/resume-a", "multi/resume-b"}
	lease, err := c.Lock(ctx(t), keys[0], client.WithKeys(keys[1]), client.WithTTL(10*time.Second))
	require.NoError(t, err)
	before, known := lease.Sequencers(), lease.Deadline()
	a.Kill()
	require.True(t, waitUntil(15*time.Second, func() bool { return resumedOn(lease, 1, known) || lease.Err() != nil }), "not resumed on B")
	require.NoError(t, lease.Err())
	after := lease.Sequencers()
	require.Len(t, after, 2)
	for i := range before {
		assert.Equal(t, before[i].GetToken(), after[i].GetToken())
		st, err := observer.GetLock(ctx(t), keys[i])
		require.NoError(t, err)
		assert.Equal(t, []string{before[i].GetSessionId()}, sessions(st.GetHolders()), "%s still held", keys[i])
	}
	require.NoError(t, lease.Release(ctx(t)))
	for _, k := range keys {
		st, err := observer.GetLock(ctx(t), k)
		require.NoError(t, err)
		assert.Empty(t, st.GetHolders(), "%s released", k)
	}
}
