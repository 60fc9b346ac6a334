package consulstore

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
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

// TestRenewNotFoundIsConfirmed: Consul's "not found" for a renewal is
// ErrSessionNotFound only when a consistent read agrees. A leader elected
// a moment ago answers renewals from a state that may lack the newest
// sessions (make chaos found one after a restart of every server); here a
// proxy in front of a real agent gives the first renewal of a live session
// that answer, Consul's own 404. It must be StoreUnavailable (retry), and
// the next renewal renews; a destroyed session is still ErrSessionNotFound.
func TestRenewNotFoundIsConfirmed(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	var stale atomic.Int32 // renewals still to answer "not found"
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if id, ok := strings.CutPrefix(r.URL.Path, "/v1/session/renew/"); ok && stale.Add(-1) >= 0 {
			http.Error(w, fmt.Sprintf("Session id '%s' not found", id), http.StatusNotFound)
			return
		}
		next.ServeHTTP(w, r)
	})
	s := openConfig(t, cfg, Options{})
	ctx := t.Context()

	id, err := s.CreateSession(ctx, broker.SessionSpec{TTL: 10 * time.Second})
	require.NoError(t, err)
	before := s.OpCounts()
	stale.Store(1)
	_, err = s.RenewSession(ctx, id)
	requireStoreError(t, err, broker.StoreUnavailable, "session renew")
	assert.NotErrorIs(t, err, broker.ErrSessionNotFound)
	assert.ErrorContains(t, err, "a consistent read finds it")
	after := s.OpCounts()
	assert.Equal(t, before["session_renew"]+1, after["session_renew"])
	assert.Equal(t, before["session_info"]+1, after["session_info"], "one consistent read confirms")
	renewals := func() [3]uint64 { // stale_not_found, unavailable, not_found
		return [3]uint64{gatherValue(t, s, "session_renew", "stale_not_found"), gatherValue(t, s, "session_renew", "unavailable"), gatherValue(t, s, "session_renew", "not_found")}
	}
	assert.Equal(t, [3]uint64{1, 0, 0}, renewals(), "counted as stale_not_found, not as an outage")

	info, err := s.RenewSession(ctx, id)
	require.NoError(t, err, "the next renewal renews")
	assert.Equal(t, id, info.ID)
	assert.Equal(t, after["session_info"], s.OpCounts()["session_info"], "a renewal that renews reads nothing")

	require.NoError(t, s.DestroySession(ctx, id))
	_, err = s.RenewSession(ctx, id)
	assert.ErrorIs(t, err, broker.ErrSessionNotFound, "a destroyed session is gone")
	assert.Equal(t, after["session_info"]+1, s.OpCounts()["session_info"])
	assert.Equal(t, [3]uint64{1, 0, 1}, renewals(), "a confirmed \"not found\" is not_found")
}
