package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestLockTokenAcrossDeletes: Consul's LockIndex restarts at 1 whenever a
// key is deleted and locked again, but the token keeps increasing: through
// DELETE-behaviour sessions that end, and through an operator deleting the
// key between grants.
func TestLockTokenAcrossDeletes(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	kv := agent.Client().KV()
	deleteSession := &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{
		Ttl: dur(10 * time.Second), LockDelay: dur(0), Behavior: lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE,
	}}

	type grant struct {
		how       string
		lockIndex uint64
		token     uint64
	}
	var grants []grant
	// take acquires key and checks the grant against Consul and GetLock.
	take := func(t *testing.T, how, key string, session *lockbrokerv1.AcquireRequest_NewSession) (*stream, *lockbrokerv1.Sequencer) {
		t.Helper()
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte(how), Session: session})
		seq := s.acquired(5 * time.Second).GetSequencer()
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		require.NotNil(t, e)
		assert.Equal(t, e.LockIndex, seq.GetLockIndex(), "sequencer lock index is Consul's")
		assert.Equal(t, e.ModifyIndex, seq.GetToken(), "token is the ModifyIndex of the granting write")
		h := lkHolder(t, lkGetLock(t, c, key))
		assert.Equal(t, seq.GetToken(), h.GetToken())
		assert.Equal(t, seq.GetLockIndex(), h.GetLockIndex())
		grants = append(grants, grant{how: how, lockIndex: seq.GetLockIndex(), token: seq.GetToken()})
		return s, seq
	}
	keyGone := func(t *testing.T, key string) {
		t.Helper()
		require.Eventually(t, func() bool {
			e, _, err := kv.Get(key, nil)
			return err == nil && e == nil
		}, 5*time.Second, 10*time.Millisecond, "key %q still exists", key)
	}

	// Fails while the broker creates lock_delay 0 sessions with Consul's
	// 15s default (see TestLockSessionOptionsReachConsul).
	t.Run("broker-owned DELETE sessions destroyed", func(t *testing.T) {
		const key = "tokens/delete-behavior"
		for i := range 3 {
			s, seq := take(t, "delete-session", key, deleteSession)
			assert.EqualValues(t, 1, seq.GetLockIndex(), "grant %d: a fresh key starts at lock index 1", i)
			se, _, err := agent.Client().Session().Info(seq.GetSessionId(), nil)
			require.NoError(t, err)
			require.NotNil(t, se)
			require.Equal(t, api.SessionBehaviorDelete, se.Behavior)
			// Else the next grant waits for Consul's lock-delay.
			require.Zero(t, se.LockDelay, "the broker created the session with lock_delay 0, Consul has %s", se.LockDelay)
			_, err = agent.Client().Session().Destroy(seq.GetSessionId(), nil)
			require.NoError(t, err)
			lost := s.next(5*time.Second, isLost).GetLost()
			assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason(), "detail: %s", lost.GetDetail())
			keyGone(t, key) // the DELETE behaviour removed it
		}
	})

	t.Run("client-owned DELETE sessions destroyed", func(t *testing.T) {
		const key = "tokens/delete-behavior-own"
		for i := range 3 {
			// Created in Consul directly, with the shortest lock-delay Consul's
			// api client can send (it omits a zero LockDelay).
			id, _, err := agent.Client().Session().Create(&api.SessionEntry{
				TTL: "30s", LockDelay: time.Millisecond, Behavior: api.SessionBehaviorDelete,
			}, nil)
			require.NoError(t, err)
			s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("own"), Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: id}})
			seq := s.acquired(5 * time.Second).GetSequencer()
			e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			require.NotNil(t, e)
			assert.Equal(t, e.ModifyIndex, seq.GetToken())
			assert.EqualValues(t, 1, seq.GetLockIndex(), "grant %d: a fresh key starts at lock index 1", i)
			grants = append(grants, grant{how: "own-delete-session", lockIndex: seq.GetLockIndex(), token: seq.GetToken()})
			_, err = agent.Client().Session().Destroy(id, nil)
			require.NoError(t, err)
			lost := s.next(5*time.Second, isLost).GetLost()
			assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason(), "detail: %s", lost.GetDetail())
			keyGone(t, key)
		}
	})

	t.Run("operator deletes between grants", func(t *testing.T) {
		const key = "tokens/operator-delete"
		for i := range 3 {
			s, seq := take(t, "released", key, fast())
			_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
			require.NoError(t, err)
			s.next(5*time.Second, lkIsReleased)
			s2, seq2 := take(t, "re-acquired", key, fast())
			assert.EqualValues(t, seq.GetLockIndex()+1, seq2.GetLockIndex(), "round %d: re-acquiring a kept key bumps the lock index", i)
			s2.cancel()
			require.Eventually(t, func() bool {
				e, _, err := kv.Get(key, nil)
				return err == nil && e != nil && e.Session == ""
			}, 5*time.Second, 10*time.Millisecond)
			_, err = kv.Delete(key, nil)
			require.NoError(t, err)
			s3, seq3 := take(t, "after-operator-delete", key, fast())
			assert.EqualValues(t, 1, seq3.GetLockIndex(), "round %d: the lock index restarts after the delete", i)
			s3.cancel()
			require.Eventually(t, func() bool {
				e, _, err := kv.Get(key, nil)
				return err == nil && e != nil && e.Session == ""
			}, 5*time.Second, 10*time.Millisecond)
			_, err = kv.Delete(key, nil)
			require.NoError(t, err)
		}
	})

	// Across both keys' histories the tokens strictly increase in grant
	// order, while lock indexes went back to 1 several times.
	require.NotEmpty(t, grants)
	restarts := 0
	for i := 1; i < len(grants); i++ {
		assert.Greater(t, grants[i].token, grants[i-1].token, "grant %d (%s) after grant %d (%s)", i, grants[i].how, i-1, grants[i-1].how)
		if grants[i].lockIndex == 1 {
			restarts++
		}
	}
	assert.GreaterOrEqual(t, restarts, 5, "lock index restarts seen: %+v", grants)
}
