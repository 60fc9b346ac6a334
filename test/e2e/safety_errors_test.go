package e2e

import (
	"strconv"
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

// raftIndex is Consul's last Raft log index: it grows with every write.
func raftIndex(t testing.TB, c *api.Client) uint64 {
	t.Helper()
	self, err := c.Agent().Self()
	require.NoError(t, err)
	idx, err := strconv.ParseUint(self["Stats"]["raft"].(map[string]any)["last_log_index"].(string), 10, 64)
	require.NoError(t, err)
	return idx
}

// Issue 10, item 5: a rolled-back transaction is not always a lost race. A
// dead client session or a foreign `.lock` ends the request within 1 s
// with a handful of Consul writes, and leaves no contender entry.
func TestDeadSessionAndForeignLockEndAtOnce(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c, sessions, kv := r.Locks(t), r.Sessions(t), agent.Client().KV()

	t.Run("client session destroyed while waiting", func(t *testing.T) {
		for _, limit := range []uint32{1, 3} {
			key := "dead/" + strconv.Itoa(int(limit))
			var holders []*stream
			for range limit {
				h := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Limit: limit, Session: fast()})
				h.acquired(5 * time.Second)
				holders = append(holders, h)
			}
			sess, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{LockDelay: dur(0)}})
			require.NoError(t, err)
			sid := sess.GetSession().GetId()
			w := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Limit: limit, Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}})
			w.next(5*time.Second, isQueued)
			_, err = agent.Client().Session().Destroy(sid, nil)
			require.NoError(t, err)
			before := raftIndex(t, agent.Client())
			start := time.Now()
			holders[0].cancel() // the slot frees: the waiter tries with its dead session
			err = w.end(5 * time.Second)
			took := time.Since(start)
			writes := raftIndex(t, agent.Client()) - before
			t.Logf("limit %d: %v after %s, %d Raft writes", limit, status.Code(err), took, writes)
			assert.Equal(t, codes.NotFound, status.Code(err), "%v", err)
			assert.Less(t, took, time.Second)
			assert.LessOrEqual(t, writes, uint64(10), "a handful of writes (the agent adds a few of its own), not a retry storm")
			pairs, _, err := kv.List(key+"/", &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			for _, p := range pairs {
				assert.NotContains(t, p.Key, sid, "no contender entry of the dead session is left")
			}
		}
	})

	t.Run("foreign .lock", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			limit uint32
			body  string
			flags uint64
		}{
			{"plain value under a semaphore prefix", 3, "not json", 0},
			{"semaphore flags, corrupt body", 3, "{corrupt", 0xe0f69a2baa414de0},
			{"semaphore flags, bad limit", 3, `{"Limit":0,"Holders":{}}`, 0xe0f69a2baa414de0},
			{"plain value under a lock key", 1, "x", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				key := "foreign/" + strings.ReplaceAll(tc.name, " ", "-")
				_, err := kv.Put(&api.KVPair{Key: key + "/.lock", Value: []byte(tc.body), Flags: tc.flags}, nil)
				require.NoError(t, err)
				before := raftIndex(t, agent.Client())
				start := time.Now()
				err = acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Limit: tc.limit, Session: fast()}).end(5 * time.Second)
				took := time.Since(start)
				writes := raftIndex(t, agent.Client()) - before
				t.Logf("%v after %s, %d Raft writes", status.Code(err), took, writes)
				assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
				assert.Less(t, took, time.Second)
				// The broker makes 2 (session create and destroy); the agent
				// adds a few of its own on a busy machine (coordinates,
				// anti-entropy). The defect made about 1,000.
				assert.LessOrEqual(t, writes, uint64(10), "a handful of writes, not a retry storm")
				pairs, _, err := kv.List(key, &api.QueryOptions{RequireConsistent: true})
				require.NoError(t, err)
				require.Len(t, pairs, 1, "only the foreign .lock is left: %v", pairs)
				assert.Equal(t, tc.body, string(pairs[0].Value))
			})
		}
	})
}
