package broker_test

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestRWDeadHolderCleanup: a read-write lock's writer whose session is
// destroyed in Consul leaves its entry, in its lock-delay, and K keeps
// listing it: the cleanup of the ended session (its broker's, or the
// janitor's) leaves both to the next grant, which deletes the entry under
// its lock-delay. With no grant, the cleanup deletes the entry only once
// deadHolderFor (longer than any lock-delay) has passed since it first
// saw it.
func TestRWDeadHolderCleanup(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	defer broker.SetDeadHolderFor(time.Second)()
	key := "rwdead/k"
	h := startHold(t, b, &broker.AcquireSpec{Key: key, Mode: broker.ModeWrite, NewSession: &broker.SessionSpec{TTL: 10 * time.Second, LockDelay: 30 * time.Second}}, nil)
	seq := h.nextWithin(broker.EventAcquired, 10*time.Second).Sequencer
	require.NotNil(t, seq)
	consul := agent.Client()
	_, err := consul.Session().Destroy(seq.Session, nil)
	require.NoError(t, err)
	h.nextWithin(broker.EventLost, 10*time.Second)
	entry := func() *api.KVPair {
		kv, _, err := consul.KV().Get(key+"/"+seq.Session, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		return kv
	}
	time.Sleep(300 * time.Millisecond) // the hold's own cleanup
	require.NotNil(t, entry(), "the dead holder's entry was deleted inside its lock-delay")
	assert.False(t, b.CleanSemaphore(key, seq.Session), "first seen: kept")
	require.NotNil(t, entry())
	assert.False(t, b.CleanSemaphore(key, seq.Session), "kept within deadHolderFor")
	require.NotNil(t, entry())
	time.Sleep(1100 * time.Millisecond)
	assert.True(t, b.CleanSemaphore(key, seq.Session))
	assert.Nil(t, entry(), "the dead holder's entry outlived deadHolderFor")
}

// TestRWManyDeadHolders: more dead holders than one grant deletes
// (rwDeadMax) are deleted by transactions of their own first, under their
// lock-delay (0 here), and the writer behind them is granted; none of
// their entries is left.
func TestRWManyDeadHolders(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop())
	t.Cleanup(b.Close)
	key := "rwdead/many"
	const readers = 40
	var sessions []string
	for range readers {
		h := startHold(t, b, &broker.AcquireSpec{Key: key, Mode: broker.ModeRead, WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second, LockDelay: 0}}, nil)
		seq := h.nextWithin(broker.EventAcquired, 10*time.Second).Sequencer
		require.NotNil(t, seq)
		sessions = append(sessions, seq.Session)
	}
	consul := agent.Client()
	for _, s := range sessions {
		_, err := consul.Session().Destroy(s, nil)
		require.NoError(t, err)
	}
	w := startHold(t, b, &broker.AcquireSpec{Key: key, Mode: broker.ModeWrite, WaitForever: true}, nil)
	seq := w.nextWithin(broker.EventAcquired, 20*time.Second).Sequencer
	require.NotNil(t, seq)
	assert.False(t, seq.Read)
	pairs, _, err := consul.KV().List(key+"/", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	for _, p := range pairs {
		assert.Contains(t, []string{key + "/.lock", key + "/" + seq.Session}, p.Key, "left: %s (session %q)", p.Key, p.Session)
	}
}
