package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestReleaseTokenRule: one rule for Release and SetValue without a
// token, whatever the session pool did before: on a session the broker
// made (pooled or not, new to the key or not) it is INVALID_ARGUMENT
// naming `token` and the hold stays; on a client-owned session it acts on
// the session's hold. Before, a token-less Release of a pooled grant was
// OK when the session had not held the key before, and INVALID_ARGUMENT
// when it had.
func TestReleaseTokenRule(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent, brokertest.WithBrokerOptions(broker.WithSessionPool()))
	c, sessions := r.Locks(t), r.Sessions(t)
	poolFilled(t, agent)

	tokenless := func(t *testing.T, s *stream, seq *lockbrokerv1.Sequencer, what string) {
		t.Helper()
		_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId()})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: token-less Release: %v", what, err)
		assert.Contains(t, fmt.Sprint(err), "token", "%s: the error names the field", what)
		_, err = c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Value: []byte("x")})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: token-less SetValue: %v", what, err)
		cs, err := c.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
		require.NoError(t, err)
		assert.True(t, cs.GetCurrent(), "%s: the hold stays", what)
		rel, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
		require.NoError(t, err, "%s: with its token", what)
		assert.True(t, rel.GetReleased(), what)
		s.next(5*time.Second, lkIsReleased)
	}

	// Pooled sessions on keys they never held, a hot key (sessions given
	// it again), and sessions made for the request's own options: all the
	// same.
	for i := range 10 {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("rule/fresh/%d", i)})
		tokenless(t, s, s.acquired(5*time.Second).GetSequencer(), fmt.Sprintf("fresh key %d", i))
	}
	for i := range 20 {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "rule/hot"})
		tokenless(t, s, s.acquired(5*time.Second).GetSequencer(), fmt.Sprintf("hot key, cycle %d", i))
		time.Sleep(5 * time.Millisecond) // the session goes back to the pool after `released`
	}
	s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "rule/own-options", Session: fast()})
	tokenless(t, s, s.acquired(5*time.Second).GetSequencer(), "a session made with the request's options")

	// A client-owned session: the token is optional.
	cs, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := cs.GetSession().GetId()
	_, err = c.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "rule/client", SessionId: sid})
	require.NoError(t, err)
	_, err = c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: "rule/client", SessionId: sid, Value: []byte("x")})
	require.NoError(t, err, "client-owned: token-less SetValue")
	rel, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: "rule/client", SessionId: sid})
	require.NoError(t, err, "client-owned: token-less Release")
	assert.True(t, rel.GetReleased())
}

// TestReleaseRetryAfterSuccess: a Release retried after it succeeded is
// OK with released false, on the replica that released or another, even
// once the key has a new holder: another session, or (a pooled session
// given the key again) the same one. The new holder keeps the key. Before,
// with pooled sessions (alive after the release), both retries were
// FAILED_PRECONDITION.
func TestReleaseRetryAfterSuccess(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.Start(t, agent, brokertest.WithBrokerOptions(broker.WithSessionPool()))
	b := brokertest.Start(t, agent)
	ca, cb := a.Locks(t), b.Locks(t)
	poolFilled(t, agent)

	const key = "retry/hot"
	sameSession, otherSession := 0, 0
	for i := 0; i < 200 && (sameSession < 3 || otherSession < 3); i++ {
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key})
		seq := first.acquired(5 * time.Second).GetSequencer()
		rel, err := ca.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
		require.NoError(t, err)
		require.True(t, rel.GetReleased())
		first.next(5*time.Second, lkIsReleased)
		time.Sleep(5 * time.Millisecond) // the session goes back to the pool after `released`

		next := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key})
		now := next.acquired(5 * time.Second).GetSequencer()
		if now.GetSessionId() == seq.GetSessionId() {
			sameSession++
		} else {
			otherSession++
		}
		for name, c := range map[string]lockbrokerv1.LockServiceClient{"same replica": ca, "other replica": cb} {
			rel, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
			if assert.NoError(t, err, "%s: retry after success, key now held by %s (earlier %s)", name, now.GetSessionId(), seq.GetSessionId()) {
				assert.False(t, rel.GetReleased(), name)
			}
		}
		cs, err := ca.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: now})
		require.NoError(t, err)
		require.True(t, cs.GetCurrent(), "the new grant survives the retries")
		rel, err = ca.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: now.GetSessionId(), Token: now.GetToken()})
		require.NoError(t, err)
		require.True(t, rel.GetReleased())
		next.next(5*time.Second, lkIsReleased)
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("retries with the key held again by the same session: %d, by another: %d", sameSession, otherSession)
	assert.GreaterOrEqual(t, sameSession, 1, "no grant came on the same session again")
	assert.GreaterOrEqual(t, otherSession, 1, "no grant came on another session")
}

// poolFilled waits until the broker's session pool has filled (16
// sessions), so that grants take pooled sessions.
func poolFilled(t *testing.T, agent *consultest.Agent) {
	t.Helper()
	require.Eventually(t, func() bool {
		ss, _, err := agent.Client().Session().List(nil)
		return err == nil && len(ss) >= 16
	}, 10*time.Second, 50*time.Millisecond, "the pool fills")
}
