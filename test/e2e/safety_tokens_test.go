package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 10, item 7: a token is unique per grant and strictly increasing
// per key; after any re-grant the old sequencer is not current.
func TestTokensArePerGrant(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.Start(t, agent)
	b := brokertest.Start(t, agent)
	ca, cb := a.Locks(t), b.Locks(t)
	kv := agent.Client().KV()
	newSession := func(t *testing.T) *lockbrokerv1.AcquireRequest_SessionId {
		resp, err := a.Sessions(t).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Hour), LockDelay: dur(0)}})
		require.NoError(t, err)
		return &lockbrokerv1.AcquireRequest_SessionId{SessionId: resp.GetSession().GetId()}
	}
	current := func(t *testing.T, c lockbrokerv1.LockServiceClient, seq *lockbrokerv1.Sequencer) bool {
		t.Helper()
		resp, err := c.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
		require.NoError(t, err)
		return resp.GetCurrent()
	}

	t.Run("delete and re-acquire by the same session", func(t *testing.T) {
		key, own := "tokens/reacquire", newSession(t)
		obs := wtObserve(t, "observer on B", cb, key, false) // B's caches see the first grant
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Session: own}).acquired(5 * time.Second).GetSequencer()
		obs.until(5*time.Second, "first grant seen on B", wtHeldBy(own.SessionId))
		_, err := kv.Delete(key, nil)
		require.NoError(t, err)
		second := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Session: own}).acquired(5 * time.Second).GetSequencer()
		require.Equal(t, first.GetLockIndex(), second.GetLockIndex(), "Consul restarts LockIndex after a delete")
		assert.Greater(t, second.GetToken(), first.GetToken())
		for name, c := range map[string]lockbrokerv1.LockServiceClient{"A": ca, "B": cb} {
			h := lkHolder(t, lkGetLock(t, c, key))
			assert.Equal(t, second.GetToken(), h.GetToken(), "GetLock on %s reports the new grant's token", name)
			assert.False(t, current(t, c, first), "old sequencer on %s", name)
			assert.True(t, current(t, c, second), "new sequencer on %s", name)
		}
	})

	t.Run("semaphore slot re-admitted to the same session", func(t *testing.T) {
		key, own := "tokens/sem", newSession(t)
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: own}).acquired(5 * time.Second).GetSequencer()
		// Someone removes the holder from .lock (check-and-set, as a
		// recipe client cleaning up would).
		p, _, err := kv.Get(key+"/.lock", nil)
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.Unmarshal(p.Value, &body))
		delete(body["Holders"].(map[string]any), own.SessionId)
		p.Value, _ = json.Marshal(body)
		ok, _, err := kv.CAS(p, nil)
		require.NoError(t, err)
		require.True(t, ok)
		assert.False(t, current(t, cb, first), "removed from .lock: not current")
		second := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: own}).acquired(5 * time.Second).GetSequencer()
		assert.Greater(t, second.GetToken(), first.GetToken())
		assert.False(t, current(t, cb, first), "the earlier admission is not current after the re-admission")
		assert.True(t, current(t, cb, second))
	})

	t.Run("already a holder: the same grant, never another holder's token", func(t *testing.T) {
		key, own := "tokens/holder", newSession(t)
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: own}).acquired(5 * time.Second).GetSequencer()
		other := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: fast()}).acquired(5 * time.Second).GetSequencer()
		again := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: own}).acquired(5 * time.Second).GetSequencer()
		assert.Equal(t, first.GetToken(), again.GetToken(), "re-acquiring a held slot returns its own grant")
		assert.NotEqual(t, other.GetToken(), again.GetToken())
		assert.True(t, current(t, cb, again))
	})

	t.Run("client-owned lock acquired again by its holder", func(t *testing.T) {
		key, own := "tokens/again", newSession(t)
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Session: own}).acquired(5 * time.Second).GetSequencer()
		// Like api.Lock: acquiring what the session holds succeeds at once
		// with the current grant (once the value changed too).
		_, err := ca.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: key, SessionId: own.SessionId, Value: []byte("v2"), Token: first.GetToken()})
		require.NoError(t, err)
		for _, c := range []lockbrokerv1.LockServiceClient{ca, cb} {
			again := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: own, WaitTimeout: dur(0)}).acquired(5 * time.Second).GetSequencer()
			assert.Equal(t, first.GetToken(), again.GetToken())
			assert.Equal(t, first.GetLockIndex(), again.GetLockIndex())
		}
		pair, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		assert.Equal(t, "v2", string(pair.Value))
	})
}
