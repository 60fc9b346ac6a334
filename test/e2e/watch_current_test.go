package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// The first state of a Watch is the state now: a watch opened after a
// grant was reported (on the same replica, whose watch of the key is
// already running for the holder) shows that holder, never an older state
// the replica's shared blocking query has not moved past yet.
func TestWatchFirstStateIsNotOlderThanAKnownGrant(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	const rounds = 20
	stale := 0
	for i := range rounds {
		key := fmt.Sprintf("current/%d", i)
		h := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("A"), Session: fast()})
		seq := h.acquired(5 * time.Second).GetSequencer()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ws, err := c.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
		require.NoError(t, err)
		first, err := ws.Recv()
		cancel()
		require.NoError(t, err)
		if !wtHeldBy(seq.GetSessionId())(first.GetState()) {
			stale++
			t.Logf("round %d: first state %s, index %d; the grant's token is %d", i, wtState(first.GetState()), first.GetState().GetIndex(), seq.GetToken())
		}
		h.cancel()
	}
	assert.Zero(t, stale, "%d of %d watches began with a state older than the grant their caller had seen", stale, rounds)
}
