package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Issue 41, finding 3: a Release through B of a hold on A, whose link to
// Consul is slow, is told to A's stream as `released`, never as a loss.
// A's read of the session's record, which tells a Release from a loss,
// takes longer than the 500 ms it used to be given (300 ms each way here);
// it then guessed from the key's state and said lost RELEASED_BY_OTHER.
func TestReleaseElsewhereToldReleasedOnSlowReplica(t *testing.T) {
	t.Parallel()
	_, link, a, b := replicasOneBehindLink(t)
	link.toxic(t, "latency", `{"latency":300}`)
	onA, onB := a.Locks(t), b.Locks(t)
	holders := make([]*stream, 3)
	for i := range holders { // acquired together: each takes a few round trips over the link
		holders[i] = acquire(t, onA, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("release-slow/%d", i)})
	}
	seqs := make([]*lockbrokerv1.Sequencer, len(holders))
	for i, h := range holders {
		seqs[i] = h.acquired(10 * time.Second).GetSequencer()
	}
	time.Sleep(time.Second) // the holds are settled, their keys watched
	for i, holder := range holders {
		key, seq := seqs[i].GetKey(), seqs[i]
		resp, err := onB.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
		require.NoError(t, err)
		require.True(t, resp.GetReleased())
		released := time.Now()
		ev := holder.next(10*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return isLost(r) || lkIsReleased(r) })
		assert.Nil(t, ev.GetLost(), "round %d: a Release told as a loss: %v", i, ev.GetLost())
		assert.NotNil(t, ev.GetReleased(), "round %d", i)
		t.Logf("round %d: A's stream heard %s %s after B's Release", i, map[bool]string{true: "released", false: "lost"}[ev.GetReleased() != nil], time.Since(released).Round(time.Millisecond))
	}
}
