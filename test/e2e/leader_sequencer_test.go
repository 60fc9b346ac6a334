package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// CheckSequencer is true for the current holder and false as soon as it
// loses the lock — by Release, by its session's destruction, by the key's
// deletion — and then names who holds the key now. Both the replica that
// granted the lock and one that never saw the grant answer the same.
func TestLeaderCheckSequencerAfterLoss(t *testing.T) {
	tests := []struct {
		name string
		// lose takes the lock away from the holder of seq.
		lose func(t *testing.T, agent *consultest.Agent, c lockbrokerv1.LockServiceClient, seq *lockbrokerv1.Sequencer)
		// kind is the key's kind right after the loss, before the waiter
		// takes it.
		kind lockbrokerv1.LockKind
		// invalidates: the loss invalidates the session, so Consul's
		// lock-delay applies before the next holder.
		invalidates bool
	}{
		{
			name: "release",
			lose: func(t *testing.T, _ *consultest.Agent, c lockbrokerv1.LockServiceClient, seq *lockbrokerv1.Sequencer) {
				resp, err := c.Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
				require.NoError(t, err)
				require.True(t, resp.GetReleased())
			},
			kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK,
		},
		{
			name: "session destroyed in Consul",
			lose: func(t *testing.T, agent *consultest.Agent, _ lockbrokerv1.LockServiceClient, seq *lockbrokerv1.Sequencer) {
				_, err := agent.Client().Session().Destroy(seq.GetSessionId(), nil)
				require.NoError(t, err)
			},
			kind:        lockbrokerv1.LockKind_LOCK_KIND_LOCK,
			invalidates: true,
		},
		{
			name: "key deleted in Consul",
			lose: func(t *testing.T, agent *consultest.Agent, _ lockbrokerv1.LockServiceClient, seq *lockbrokerv1.Sequencer) {
				_, err := agent.Client().KV().Delete(seq.GetKey(), nil)
				require.NoError(t, err)
			},
			kind: lockbrokerv1.LockKind_LOCK_KIND_NONE,
		},
	}
	agent := consultest.Start(t)
	granting := brokertest.Start(t, agent)
	other := brokertest.Start(t, agent)
	c, c2 := granting.Locks(t), other.Locks(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "seq/" + t.Name()
			a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("A"), Session: fast()})
			seqA := a.acquired(5 * time.Second).GetSequencer()
			for _, cl := range []lockbrokerv1.LockServiceClient{c, c2} {
				resp, err := cl.CheckSequencer(wtCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seqA})
				require.NoError(t, err)
				assert.True(t, resp.GetCurrent(), "the holder's sequencer is current")
				assert.True(t, wtHeldBy(seqA.GetSessionId())(resp.GetState()), "names the holder: %s", wtState(resp.GetState()))
			}

			se, _, err := agent.Client().Session().Info(seqA.GetSessionId(), nil)
			require.NoError(t, err)
			require.NotNil(t, se)

			tt.lose(t, agent, c, seqA)
			// Right after the loss, before anyone else holds the key.
			for _, cl := range []lockbrokerv1.LockServiceClient{c, c2} {
				resp, err := cl.CheckSequencer(wtCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seqA})
				require.NoError(t, err)
				assert.False(t, resp.GetCurrent(), "not current right after the loss")
				assert.Equal(t, tt.kind, resp.GetState().GetKind())
				assert.Empty(t, resp.GetState().GetHolders(), "nobody holds it: %s", wtState(resp.GetState()))
			}
			a.end(5 * time.Second) // the old holder's stream ends (lost or released)
			if tt.invalidates && se.LockDelay > 0 {
				t.Fatalf("regression: the session was created with lock_delay 0 but Consul applies %s (see TestLockSessionOptionsReachConsul); the next holder cannot take the key in time", se.LockDelay)
			}

			b := acquire(t, c2, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("B"), Session: fast()})
			seqB := b.acquired(5 * time.Second).GetSequencer()
			assert.Greater(t, seqB.GetToken(), seqA.GetToken())
			for _, cl := range []lockbrokerv1.LockServiceClient{c, c2} {
				resp, err := cl.CheckSequencer(wtCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seqA})
				require.NoError(t, err)
				assert.False(t, resp.GetCurrent(), "the old sequencer stays stale")
				if assert.True(t, wtHeldBy(seqB.GetSessionId())(resp.GetState()), "names the new holder: %s", wtState(resp.GetState())) {
					assert.Equal(t, "B", string(resp.GetState().GetHolders()[0].GetValue()))
				}
				resp, err = cl.CheckSequencer(wtCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seqB})
				require.NoError(t, err)
				assert.True(t, resp.GetCurrent(), "the new holder's sequencer is current")
			}
		})
	}
}
