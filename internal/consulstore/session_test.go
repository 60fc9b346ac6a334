package consulstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestSessionLifecycle proves what the session methods promise against a
// real agent: a zero lock-delay and no checks are kept as asked (not
// Consul's 15s and serfHealth defaults), an unknown session is
// ErrSessionNotFound for renew and info, destroying one succeeds, and a
// spec Consul refuses is StoreRejected, not unavailable.
func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	id, err := s.CreateSession(ctx, broker.SessionSpec{Name: "life", TTL: 20 * time.Second, Delete: true})
	require.NoError(t, err)
	info, err := s.Session(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, id, info.ID)
	assert.Equal(t, "life", info.Name)
	assert.Equal(t, 20*time.Second, info.TTL)
	assert.Zero(t, info.LockDelay)
	assert.Empty(t, info.Checks)
	assert.True(t, info.Delete)
	assert.NotZero(t, info.CreateIndex)

	delayed, err := s.CreateSession(ctx, broker.SessionSpec{TTL: 10 * time.Second, LockDelay: 1500 * time.Millisecond, Checks: []string{"serfHealth"}})
	require.NoError(t, err)
	info, err = s.RenewSession(ctx, delayed)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, info.LockDelay)
	assert.Equal(t, []string{"serfHealth"}, info.Checks)
	assert.False(t, info.Delete)

	all, err := s.Sessions(ctx)
	require.NoError(t, err)
	var ids []string
	for _, si := range all {
		ids = append(ids, si.ID)
	}
	assert.ElementsMatch(t, []string{id, delayed}, ids)

	require.NoError(t, s.DestroySession(ctx, id))
	require.NoError(t, s.DestroySession(ctx, id), "destroying an unknown session succeeds")
	_, err = s.RenewSession(ctx, id)
	assert.ErrorIs(t, err, broker.ErrSessionNotFound)
	_, err = s.Session(ctx, id)
	assert.ErrorIs(t, err, broker.ErrSessionNotFound)

	_, err = s.CreateSession(ctx, broker.SessionSpec{TTL: 15 * time.Second, Checks: []string{"no-such-check"}})
	requireStoreError(t, err, broker.StoreRejected, "session create")
	t.Log(err)
	_, err = s.CreateSession(ctx, broker.SessionSpec{TTL: time.Second})
	requireStoreError(t, err, broker.StoreRejected, "session create")
	t.Log(err)
	_, err = s.RenewSession(ctx, "")
	requireStoreError(t, err, broker.StoreRejected, "session renew")
	t.Log(err)
}
