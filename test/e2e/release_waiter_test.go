package e2e

import (
	"fmt"
	"strings"
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

// kvUnder is every entry under the given keys (and the record of
// session), for comparing before and after.
func kvUnder(t *testing.T, cli *api.Client, session string, keys ...string) []string {
	t.Helper()
	var out []string
	for _, k := range append(keys, "lockbroker/sessions/"+session) {
		ps, _, err := cli.KV().List(k, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%s %d %d %s %q", p.Key, p.ModifyIndex, p.LockIndex, p.Session, p.Value))
		}
	}
	return out
}

// TestReleaseOfAWaiter: a token-less Release (or SetValue) of a request
// that waits (a lock's, a semaphore's, a reader's or writer's, a
// multi-key one's) holds nothing: FAILED_PRECONDITION (not held), through
// the waiter's replica
// and another, before the token rule (INVALID_ARGUMENT for a
// broker-owned session that holds), since no token exists for a waiter.
// Nothing is written, and the wait goes on: the holder's release grants
// it.
func TestReleaseOfAWaiter(t *testing.T) {
	agent := consultest.Start(t)
	ra, rb := brokertest.Start(t, agent), brokertest.Start(t, agent)
	ca, cb := ra.Locks(t), rb.Locks(t)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)

	tests := []struct {
		name string
		// hold is the holder's request, wait the waiter's; key is the key
		// Release names.
		hold, wait *lockbrokerv1.AcquireRequest
		key        string
	}{
		{
			name: "lock",
			hold: &lockbrokerv1.AcquireRequest{Key: "waiter/lock", Session: fast()},
			wait: &lockbrokerv1.AcquireRequest{Key: "waiter/lock", Session: fast()},
		},
		{
			name: "semaphore",
			hold: semReq("waiter/sem", 1, "h"),
			wait: semReq("waiter/sem", 1, "w"),
		},
		{
			name: "reader behind a writer",
			hold: rwReq("waiter/rw-r", false, "h"),
			wait: rwReq("waiter/rw-r", true, "w"),
		},
		{
			name: "writer behind a reader",
			hold: rwReq("waiter/rw-w", true, "h"),
			wait: rwReq("waiter/rw-w", false, "w"),
		},
		{
			name: "multi-key, naming the held key",
			hold: &lockbrokerv1.AcquireRequest{Key: "waiter/multi-a/k01", Session: fast()},
			wait: multiReq(mkKeys("waiter/multi-a", 2), "w"),
			key:  "waiter/multi-a/k01",
		},
		{
			name: "multi-key, naming a free key",
			hold: &lockbrokerv1.AcquireRequest{Key: "waiter/multi-b/k01", Session: fast()},
			wait: multiReq(mkKeys("waiter/multi-b", 2), "w"),
			key:  "waiter/multi-b/k00",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := acquire(t, cb, tt.hold)
			hseq := h.acquired(10 * time.Second).GetSequencer()
			w := acquire(t, ca, tt.wait)
			session := queuedSession(t, w, "the waiter")
			key := tt.key
			if key == "" {
				key = tt.wait.GetKey()
			}
			root := strings.TrimSuffix(strings.TrimSuffix(key, "/k00"), "/k01")
			before := kvUnder(t, cli, session, root)

			for i, c := range []lockbrokerv1.LockServiceClient{ca, cb} {
				resp, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: session})
				assert.Equal(t, codes.FailedPrecondition, status.Code(err), "replica %d: Release answered %v, %v", i, resp, err)
				sv, err := c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: key, SessionId: session, Value: []byte("x")})
				assert.Equal(t, codes.FailedPrecondition, status.Code(err), "replica %d: SetValue answered %v, %v", i, sv, err)
			}
			assert.Equal(t, before, kvUnder(t, cli, session, root), "the Release wrote to Consul")

			_, err := cb.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: hseq.GetKey(), SessionId: hseq.GetSessionId(), Token: hseq.GetToken()})
			require.NoError(t, err)
			seq := w.acquired(10 * time.Second).GetSequencer()
			assert.Equal(t, session, seq.GetSessionId(), "the wait went on with its session")
			_, err = ca.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: session, Token: seq.GetToken()})
			require.NoError(t, err)
		})
	}
}
