package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestLockSessionService walks a client-owned session through its life:
// create with the defaults, hold a key past the stream, renew, release,
// destroy.
func TestLockSessionService(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)
	const key = "cron/nightly"

	created, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sess := created.GetSession()
	id := sess.GetId()
	assert.Equal(t, 15*time.Second, sess.GetTtl().AsDuration())
	assert.Equal(t, 15*time.Second, sess.GetLockDelay().AsDuration())
	assert.Equal(t, lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_RELEASE, sess.GetBehavior())
	assert.Equal(t, "lockbroker", sess.GetName())
	// Its checks (none asked for) are TestLockSessionOptionsReachConsul's.
	assert.NotZero(t, sess.GetCreateIndex())

	got, err := sessions.GetSession(lkCtx(t), &lockbrokerv1.GetSessionRequest{SessionId: id})
	require.NoError(t, err)
	assert.Equal(t, sess.GetTtl().AsDuration(), got.GetSession().GetTtl().AsDuration())
	assert.Equal(t, sess.GetCreateIndex(), got.GetSession().GetCreateIndex())
	se, _, err := agent.Client().Session().Info(id, nil)
	require.NoError(t, err)
	require.NotNil(t, se)
	assert.Equal(t, "15s", se.TTL)
	assert.Equal(t, 15*time.Second, se.LockDelay)
	assert.Equal(t, api.SessionBehaviorRelease, se.Behavior)

	// Hold with the session, then close the stream: the key stays held.
	s := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("job-1"), Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: id}})
	seq := s.acquired(5 * time.Second).GetSequencer()
	assert.Equal(t, id, seq.GetSessionId())
	s.cancel()
	assert.Equal(t, codes.Canceled, status.Code(s.end(5*time.Second)))
	h := lkHolder(t, lkGetLock(t, locks, key))
	assert.Equal(t, id, h.GetSessionId())
	assert.Equal(t, seq.GetToken(), h.GetToken())
	e, _, err := agent.Client().KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	assert.Equal(t, id, e.Session, "the hold outlives its stream")

	renewed, err := sessions.RenewSession(lkCtx(t), &lockbrokerv1.RenewSessionRequest{SessionId: id})
	require.NoError(t, err)
	assert.Equal(t, id, renewed.GetSession().GetId())
	assert.Equal(t, 15*time.Second, renewed.GetGuaranteedFor().AsDuration())

	rel, err := locks.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: id})
	require.NoError(t, err)
	assert.True(t, rel.GetReleased())
	assert.Empty(t, lkGetLock(t, locks, key).GetHolders())
	_, err = sessions.DestroySession(lkCtx(t), &lockbrokerv1.DestroySessionRequest{SessionId: id})
	require.NoError(t, err)
	_, err = sessions.GetSession(lkCtx(t), &lockbrokerv1.GetSessionRequest{SessionId: id})
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	_, err = sessions.RenewSession(lkCtx(t), &lockbrokerv1.RenewSessionRequest{SessionId: id})
	assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	_, err = sessions.DestroySession(lkCtx(t), &lockbrokerv1.DestroySessionRequest{SessionId: id})
	assert.NoError(t, err, "destroying an unknown session succeeds")

	// Nothing is left behind (release markers included).
	st := lkConsulState(t, agent.Client())
	require.Len(t, st.KV, 1, "KV: %v", st.KV)
	assert.Equal(t, key, st.KV[0].Key)
	assert.Empty(t, st.KV[0].Session)
	assert.Empty(t, st.Sessions)
}

// TestLockReleaseIdempotent: releasing again with the session that held
// the key succeeds with released=false (ReleaseResponse.released: "false
// when it was already released (Release is idempotent for the holder's
// session)"; Broker.Release's doc says the same).
//
// Regression test (fixed): Broker.release returns ErrNotHolder (FAILED_PRECONDITION) whenever
// the session is not the holder now (internal/broker/ops.go:142), so a
// second Release by the former holder fails.
func TestLockReleaseIdempotent(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)
	const key = "release/twice"

	created, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	id := created.GetSession().GetId()
	s := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: id}})
	s.acquired(5 * time.Second)

	rel, err := locks.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: id})
	require.NoError(t, err)
	assert.True(t, rel.GetReleased())
	s.next(5*time.Second, lkIsReleased)

	rel, err = locks.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: id})
	require.NoError(t, err, "a second Release by the holder's session")
	assert.False(t, rel.GetReleased())
}

// TestLockSessionOptionsReachConsul: the options of a session, however the
// broker creates it, are what Consul stores.
//
// Regression test (fixed): Store.CreateSession (internal/consulstore/store.go:82-92) builds an
// api.SessionEntry and calls Session().Create, which leaves out a zero
// LockDelay and an empty NodeChecks (consul/api session.go:
// `if se.LockDelay != 0`, `if len(se.NodeChecks) > 0`). Consul then
// applies its defaults: a lock_delay of 0 becomes 15s, and every session
// gets the serfHealth check (the comment at store.go:82 means to prevent
// exactly that).
func TestLockSessionOptionsReachConsul(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)

	viaCreate := func(t *testing.T, o *lockbrokerv1.SessionOptions) string {
		resp, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: o})
		require.NoError(t, err)
		return resp.GetSession().GetId()
	}
	viaAcquire := func(t *testing.T, o *lockbrokerv1.SessionOptions) string {
		s := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "opts/" + lkUUID(t), Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: o}})
		return s.acquired(5 * time.Second).GetSequencer().GetSessionId()
	}
	tests := []struct {
		name      string
		create    func(*testing.T, *lockbrokerv1.SessionOptions) string
		opts      *lockbrokerv1.SessionOptions
		ttl       string
		lockDelay time.Duration
		behavior  string
		name_     string
	}{
		{name: "CreateSession, lock-delay 0", create: viaCreate, opts: &lockbrokerv1.SessionOptions{Ttl: dur(20 * time.Second), LockDelay: dur(0)},
			ttl: "20s", lockDelay: 0, behavior: api.SessionBehaviorRelease, name_: "lockbroker"},
		{name: "CreateSession, DELETE, 3s, named", create: viaCreate, opts: &lockbrokerv1.SessionOptions{
			Ttl: dur(30 * time.Second), LockDelay: dur(3 * time.Second), Behavior: lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE, Name: "cron"},
			ttl: "30s", lockDelay: 3 * time.Second, behavior: api.SessionBehaviorDelete, name_: "cron"},
		{name: "Acquire, lock-delay 0", create: viaAcquire, opts: &lockbrokerv1.SessionOptions{Ttl: dur(10 * time.Second), LockDelay: dur(0)},
			ttl: "10s", lockDelay: 0, behavior: api.SessionBehaviorRelease, name_: "lockbroker"},
		{name: "Acquire, defaults", create: viaAcquire, opts: nil,
			ttl: "15s", lockDelay: 15 * time.Second, behavior: api.SessionBehaviorRelease, name_: "lockbroker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.create(t, tt.opts)
			se, _, err := agent.Client().Session().Info(id, nil)
			require.NoError(t, err)
			require.NotNil(t, se)
			assert.Equal(t, tt.ttl, se.TTL)
			assert.Equal(t, tt.lockDelay, se.LockDelay, "lock-delay in Consul")
			assert.Equal(t, tt.behavior, se.Behavior)
			assert.Equal(t, tt.name_, se.Name)
			assert.Empty(t, se.NodeChecks, "no checks asked for: the TTL alone decides")
			assert.Empty(t, se.ServiceChecks)

			got, err := sessions.GetSession(context.Background(), &lockbrokerv1.GetSessionRequest{SessionId: id})
			require.NoError(t, err)
			assert.Equal(t, tt.lockDelay, got.GetSession().GetLockDelay().AsDuration(), "lock-delay from GetSession")
			assert.Empty(t, got.GetSession().GetChecks(), "checks from GetSession")
		})
	}
}
