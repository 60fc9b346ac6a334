package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 41 (suspicion about client agents): a session belongs to the node
// of the agent that made it. Replicas A and B run on client agents C1 and
// C2 of one server; a hold made through A moves to B when C1 stops (A is
// cut off). A graceful stop of a client agent leaves the cluster by
// default, which deregisters C1's node and with it the session, and the
// hold is lost although B renews it; with leave_on_terminate = false the
// node stays (failed: a default session has no node check) and the hold
// survives, renewed through B. README, "Running against client agents", says so.
func TestHoldOnClientAgentThatStops(t *testing.T) {
	t.Parallel()
	server := consultest.Start(t)
	for _, tt := range []struct {
		name     string
		hcl      string
		survives bool
	}{
		{"leaves the cluster (default)", "", false},
		{"leave_on_terminate = false", "leave_on_terminate = false", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var opts []consultest.Option
			if tt.hcl != "" {
				opts = append(opts, consultest.WithHCL(tt.hcl))
			}
			c1 := consultest.StartClient(t, server, opts...)
			c2 := consultest.StartClient(t, server)
			a, b := brokertest.Start(t, c1), brokertest.Start(t, c2)
			const ttl = 10 * time.Second
			key := "client-agents/" + map[bool]string{true: "stays", false: "leaves"}[tt.survives]
			lease, err := client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Lock(lkCtx(t), key, client.WithTTL(ttl), client.WithLockDelay(0))
			require.NoError(t, err)
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			session := lease.Sequencer().GetSessionId()

			c1.Stop()
			stopped := time.Now()
			kv := server.Client().KV()
			heldBy := func() string {
				e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
				require.NoError(t, err)
				if e == nil {
					return ""
				}
				return e.Session
			}
			if !tt.survives {
				select {
				case <-lease.Lost():
					t.Logf("lost %s after C1's stop: %v", time.Since(stopped).Round(time.Millisecond), lease.Err())
				case <-time.After(2 * ttl):
					t.Fatal("the hold outlived its node's deregistration")
				}
				assert.NotEqual(t, session, heldBy(), "the session went with its node")
				return
			}
			require.Eventually(t, func() bool { return lease.Replica() == 1 }, 10*time.Second, 10*time.Millisecond, "the lease resumed on B")
			time.Sleep(3 * time.Second) // C1's node would be gone by now (it goes within a second of a leave)
			assert.NoError(t, lease.Err())
			assert.Equal(t, session, heldBy())
			info, _, err := server.Client().Session().Info(session, &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			assert.NotNil(t, info, "the session lives on")
			t.Logf("held through B %s after C1's stop", time.Since(stopped).Round(time.Millisecond))
		})
	}
}
