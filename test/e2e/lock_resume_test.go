package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestLockSetValueKeepsSequencer: SetValue changes what GetLock shows and
// keeps the grant's token and lock index; the hold goes on.
func TestLockSetValueKeepsSequencer(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	const key = "leader/a"

	s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("10.0.0.1:80"), Session: fast()})
	seq := s.acquired(5 * time.Second).GetSequencer()

	for _, v := range []string{"10.0.0.2:80", "", "10.0.0.3:80"} {
		resp, err := c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: key, SessionId: seq.GetSessionId(), Value: []byte(v), Token: seq.GetToken()})
		require.NoError(t, err)
		assert.True(t, proto.Equal(seq, resp.GetSequencer()), "SetValue returned %v, want %v", resp.GetSequencer(), seq)

		h := lkHolder(t, lkGetLock(t, c, key))
		assert.Equal(t, v, string(h.GetValue()))
		assert.Equal(t, seq.GetSessionId(), h.GetSessionId())
		assert.Equal(t, seq.GetToken(), h.GetToken())
		assert.Equal(t, seq.GetLockIndex(), h.GetLockIndex())
		e, _, err := agent.Client().KV().Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		assert.Equal(t, v, string(e.Value))
		assert.Equal(t, seq.GetLockIndex(), e.LockIndex, "SetValue must not bump Consul's LockIndex")

		cs, err := c.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
		require.NoError(t, err)
		assert.True(t, cs.GetCurrent(), "the sequencer is still current after SetValue")
	}

	// The hold was not disturbed: the next event is `released`, not `lost`.
	_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	ev := s.next(5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetKeepalive() == nil })
	require.NotNil(t, ev.GetReleased(), "got %v", ev)
	assert.True(t, proto.Equal(seq, ev.GetReleased().GetSequencer()))
}

// TestLockResumeOnAnotherReplica: a broker-owned hold whose replica shuts
// down is resumed on another replica with the same sequencer.
func TestLockResumeOnAnotherReplica(t *testing.T) {
	agent := consultest.Start(t)
	r1 := brokertest.Start(t, agent)
	r2 := brokertest.Start(t, agent)
	const key = "resume/a"

	// Dialled by the test, so that stopping r1 does not close the client
	// side first.
	c1 := lockbrokerv1.NewLockServiceClient(lkDial(t, r1.Addr))
	c2 := r2.Locks(t)
	s := acquire(t, c1, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("v1"), Session: fast()})
	seq := s.acquired(5 * time.Second).GetSequencer()
	_, err := c1.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: key, SessionId: seq.GetSessionId(), Value: []byte("v2"), Token: seq.GetToken()})
	require.NoError(t, err)

	r1.Stop()
	lost := s.next(5*time.Second, isLost).GetLost()
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN, lost.GetReason())
	h := lkHolder(t, lkGetLock(t, c2, key))
	require.Equal(t, seq.GetSessionId(), h.GetSessionId(), "the hold must outlive its replica's shutdown")

	res := acquire(t, c2, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("v2"), Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
	a := res.acquired(5 * time.Second)
	assert.True(t, a.GetResumed())
	assert.True(t, proto.Equal(seq, a.GetSequencer()), "resumed %v, want %v", a.GetSequencer(), seq)
	assert.Greater(t, a.GetGuaranteedFor().AsDuration(), time.Duration(0))
	h = lkHolder(t, lkGetLock(t, c2, key))
	assert.Equal(t, seq.GetToken(), h.GetToken())
	assert.Equal(t, seq.GetLockIndex(), h.GetLockIndex())
	assert.Equal(t, []byte("v2"), h.GetValue())

	// The new replica owns the session now: it renews it, and closing the
	// stream releases the key and destroys the session.
	res.next(15*time.Second, lkIsKeepalive)
	res.cancel()
	require.Eventually(t, func() bool {
		se, _, err := agent.Client().Session().Info(seq.GetSessionId(), nil)
		return err == nil && se == nil
	}, 5*time.Second, 20*time.Millisecond, "the resumed session was not destroyed")
	assert.Empty(t, lkGetLock(t, c2, key).GetHolders())
}

// TestLockResumeStale: resuming a sequencer that is no longer the grant
// fails with FAILED_PRECONDITION and never takes the key anew.
func TestLockResumeStale(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c, sessions := r.Locks(t), r.Sessions(t)
	const key = "resume/stale"

	cs, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Hour)}})
	require.NoError(t, err)
	own := &lockbrokerv1.AcquireRequest_SessionId{SessionId: cs.GetSession().GetId()}

	// First grant, released: its sequencer goes stale.
	s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: own})
	first := s.acquired(5 * time.Second).GetSequencer()
	_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: first.GetSessionId(), Token: first.GetToken()})
	require.NoError(t, err)
	s.next(5*time.Second, lkIsReleased)

	with := func(f func(*lockbrokerv1.Sequencer)) *lockbrokerv1.Sequencer {
		q := proto.CloneOf(first)
		f(q)
		return q
	}
	resume := func(t *testing.T, seq *lockbrokerv1.Sequencer) {
		t.Helper()
		before := lkConsulState(t, agent.Client())
		err := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}}).end(5 * time.Second)
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		after := lkConsulState(t, agent.Client())
		assert.Equal(t, before.KV, after.KV, "a failed resume changed the key")
		assert.Equal(t, before.Sessions, after.Sessions, "a failed resume changed the sessions")
	}

	t.Run("key released", func(t *testing.T) { resume(t, first) })

	// Second grant to the same session: the first sequencer is still stale
	// (lock index and token moved on).
	s2 := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: own})
	second := s2.acquired(5 * time.Second).GetSequencer()
	require.Greater(t, second.GetLockIndex(), first.GetLockIndex())
	require.Greater(t, second.GetToken(), first.GetToken())
	s2.cancel() // client-owned: the hold stays

	t.Run("earlier grant of the same session", func(t *testing.T) { resume(t, first) })
	t.Run("wrong lock index", func(t *testing.T) {
		resume(t, with(func(q *lockbrokerv1.Sequencer) { q.LockIndex = second.GetLockIndex() + 1; q.Token = second.GetToken() }))
	})
	t.Run("token from the future", func(t *testing.T) {
		resume(t, with(func(q *lockbrokerv1.Sequencer) {
			q.LockIndex = second.GetLockIndex()
			q.Token = second.GetToken() + 1000
		}))
	})
	t.Run("another session's grant", func(t *testing.T) {
		other, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Hour)}})
		require.NoError(t, err)
		resume(t, with(func(q *lockbrokerv1.Sequencer) {
			q.SessionId, q.LockIndex, q.Token = other.GetSession().GetId(), second.GetLockIndex(), second.GetToken()
		}))
	})

	// Even the current grant is refused: a client-owned session's hold
	// outlives streams already, so there is nothing to resume (issue 10,
	// item 4); only broker-owned sessions are resumed.
	t.Run("current grant of a client-owned session", func(t *testing.T) { resume(t, second) })
}
