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

// TestSemaphoreLostWhenTakenAway: a slot taken away in Consul behind the
// holder's back (session destroyed, holder removed from `.lock`, contender
// entry deleted) is reported `lost` within 1 s, and a waiter gets the slot
// within 1 s, both measured from the write that took it away.
func TestSemaphoreLostWhenTakenAway(t *testing.T) {
	tests := []struct {
		name     string
		takeAway func(t *testing.T, c *api.Client, prefix, session string)
		reason   lockbrokerv1.LostReason
	}{
		{
			name: "session destroyed",
			takeAway: func(t *testing.T, c *api.Client, _, session string) {
				_, err := c.Session().Destroy(session, nil)
				require.NoError(t, err)
			},
			reason: lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED,
		},
		{
			name: "removed from .lock holders",
			takeAway: func(t *testing.T, c *api.Client, prefix, session string) {
				for range 10 { // CAS: retry if .lock moved under us
					body, kv := semLock(t, c, prefix)
					require.NotNil(t, body, "no %s/.lock", prefix)
					require.True(t, body.Holders[session], "%s is not in %s/.lock", session, prefix)
					delete(body.Holders, session)
					kv.Value, _ = json.Marshal(body)
					ok, _, err := c.KV().CAS(kv, nil)
					require.NoError(t, err)
					if ok {
						return
					}
				}
				t.Fatalf("cannot rewrite %s/.lock: too many CAS races", prefix)
			},
			reason: lockbrokerv1.LostReason_LOST_REASON_RELEASED_BY_OTHER,
		},
		{
			name: "contender entry deleted",
			takeAway: func(t *testing.T, c *api.Client, prefix, session string) {
				_, err := c.KV().Delete(prefix+"/"+session, nil)
				require.NoError(t, err)
			},
			reason: lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER,
		},
	}
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()
	semSkipIfFreshPrefixBroken(t, c)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "loss/" + t.Name()
			holder, seqH := semHold(t, c, prefix, 2, "H")
			_, seqO := semHold(t, c, prefix, 2, "O")
			waiter, sidW := semQueued(t, c, semReq(prefix, 2, "W"))

			start := time.Now()
			tt.takeAway(t, consul, prefix, seqH.GetSessionId())

			lost := holder.next(5*time.Second, isLost).GetLost()
			lostAfter := time.Since(start)
			seqW := waiter.acquired(5 * time.Second).GetSequencer()
			reusedAfter := time.Since(start)
			t.Logf("lost after %s, slot reused after %s", lostAfter.Round(time.Millisecond), reusedAfter.Round(time.Millisecond))
			assert.Less(t, lostAfter, time.Second, "lost too late")
			assert.Less(t, reusedAfter, time.Second, "slot reused too late")
			assert.Equal(t, tt.reason, lost.GetReason(), "detail: %s", lost.GetDetail())
			assert.Equal(t, sidW, seqW.GetSessionId())
			assert.Greater(t, seqW.GetToken(), seqH.GetToken())

			// The other holder keeps its slot; the lost one is cleaned up.
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				body, _ := semLock(ct, consul, prefix)
				require.NotNil(ct, body)
				assert.ElementsMatch(ct, []string{seqO.GetSessionId(), sidW}, semSortedKeys(body.Holders))
				assert.NotContains(ct, semContenders(ct, consul, prefix), prefix+"/"+seqH.GetSessionId())
				assert.NotContains(ct, semSessions(ct, consul), seqH.GetSessionId(), "the lost hold's session is not destroyed")
			}, 5*time.Second, 20*time.Millisecond)
		})
	}
}
