package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Leader discovery and proclamation through the Go client: GetLock (and
// Client.Leader) return the leader's value from any replica; SetValue
// changes it without changing the grant (token, lock index), and watchers
// see the new value under the same token.
func TestLeaderDiscoveryAndProclaim(t *testing.T) {
	agent := consultest.Start(t)
	granting, other := brokertest.Start(t, agent), brokertest.Start(t, agent)
	leaderClient := client.New(granting.Conn(t))
	viaGranting, viaOther := client.New(granting.Conn(t)), client.New(other.Conn(t))
	const key = "svc/api/leader"
	ctx := wtCtx(t)

	h, err := viaOther.Election(key).Leader(ctx)
	require.NoError(t, err)
	assert.Nil(t, h, "no leader yet")

	w, err := viaGranting.Watch(ctx, key)
	require.NoError(t, err)
	nextState := func(what string) *lockbrokerv1.LockState {
		t.Helper()
		select {
		case resp, ok := <-w.C:
			require.True(t, ok, "watch ended: %v", w.Err())
			return resp.GetState()
		case <-time.After(5 * time.Second):
			t.Fatalf("no state (%s) within 5s", what)
			return nil
		}
	}
	assert.Empty(t, nextState("the state now").GetHolders())

	lease, err := leaderClient.Lock(ctx, key, client.WithValue([]byte("10.0.0.1:8080")), client.WithTTL(10*time.Second), client.WithLockDelay(time.Second))
	require.NoError(t, err)
	seq := lease.Sequencer()
	st := nextState("the leader")
	require.True(t, wtHeldBy(seq.GetSessionId())(st), wtState(st))
	assert.Equal(t, "10.0.0.1:8080", string(st.GetHolders()[0].GetValue()))
	assert.Equal(t, seq.GetToken(), st.GetHolders()[0].GetToken())

	for name, c := range map[string]*client.Client{"granting replica": viaGranting, "other replica": viaOther} {
		h, err := c.Election(key).Leader(ctx)
		require.NoError(t, err, name)
		require.NotNil(t, h, name)
		assert.Equal(t, "10.0.0.1:8080", string(h.GetValue()), name)
		assert.Equal(t, seq.GetSessionId(), h.GetSessionId(), name)
		assert.Equal(t, seq.GetToken(), h.GetToken(), "%s: before any rewrite, the key's index is the grant's", name)
	}

	// Proclaim through the lease, then through the API to see the
	// returned sequencer.
	require.NoError(t, lease.SetValue(ctx, []byte("10.0.0.2:8080")))
	st = nextState("the first proclamation")
	require.True(t, wtHeldBy(seq.GetSessionId())(st), wtState(st))
	assert.Equal(t, "10.0.0.2:8080", string(st.GetHolders()[0].GetValue()))
	assert.Equal(t, seq.GetToken(), st.GetHolders()[0].GetToken(), "watchers see the same token")
	assert.Equal(t, seq.GetLockIndex(), st.GetHolders()[0].GetLockIndex())

	resp, err := granting.Locks(t).SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: key, SessionId: seq.GetSessionId(), Value: []byte("10.0.0.3:8080"), Token: seq.GetToken()})
	require.NoError(t, err)
	assert.Equal(t, seq.GetToken(), resp.GetSequencer().GetToken(), "SetValue keeps the token")
	assert.Equal(t, seq.GetLockIndex(), resp.GetSequencer().GetLockIndex(), "SetValue keeps the lock index")
	st = nextState("the second proclamation")
	assert.Equal(t, "10.0.0.3:8080", string(st.GetHolders()[0].GetValue()))
	assert.Equal(t, seq.GetToken(), st.GetHolders()[0].GetToken())

	h, err = viaGranting.Election(key).Leader(ctx)
	require.NoError(t, err)
	require.NotNil(t, h)
	assert.Equal(t, "10.0.0.3:8080", string(h.GetValue()))
	assert.Equal(t, seq.GetToken(), h.GetToken(), "the granting replica knows the grant's token")
	h, err = viaOther.Election(key).Leader(ctx)
	require.NoError(t, err)
	require.NotNil(t, h)
	assert.Equal(t, "10.0.0.3:8080", string(h.GetValue()))
	// A replica that never saw the grant reports the holder's newest write
	// (documented on Holder.token): not lower than the grant.
	assert.GreaterOrEqual(t, h.GetToken(), seq.GetToken())
	t.Logf("token of the grant %d; reported by a replica that did not see it, after SetValue: %d", seq.GetToken(), h.GetToken())

	for name, c := range map[string]*client.Client{"granting replica": viaGranting, "other replica": viaOther} {
		current, st, err := c.CheckSequencer(ctx, seq)
		require.NoError(t, err, name)
		assert.True(t, current, "%s: the sequencer is still current after SetValue", name)
		assert.True(t, wtHeldBy(seq.GetSessionId())(st), name)
	}

	// Only the holder can proclaim.
	_, err = granting.Locks(t).SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: key, SessionId: "00000000-0000-4000-8000-000000000000", Value: []byte("impostor")})
	assert.Contains(t, []codes.Code{codes.FailedPrecondition, codes.NotFound}, status.Code(err), "%v", err)

	require.NoError(t, lease.Release(ctx))
	st = nextState("the resignation")
	assert.Empty(t, st.GetHolders())
	h, err = viaOther.Election(key).Leader(ctx)
	require.NoError(t, err)
	assert.Nil(t, h, "no leader after the resignation")
}
