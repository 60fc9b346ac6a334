package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// A hot key passed among clients of three replicas (local hand-offs,
// waiters of other replicas, tickets and the guard) leaves nothing of
// its shared queue in Consul once everybody is done: within 2 s of the
// last client's end, no `K/.queue` guard and no ticket is left, whether
// the clients stop after a release or are cancelled mid-wait and
// mid-hold (as the chaos suite's wind-down does). Repeated.
func TestSharedQueueLeavesNothingBehind(t *testing.T) {
	agent, cs := threeReplicas(t)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	for _, mode := range []string{"release", "cancel"} {
		t.Run(mode, func(t *testing.T) {
			for round := range 4 {
				key := fmt.Sprintf("queue/leak-%s-%d", mode, round)
				grants := hotChain(t, cs, key, 3, 1500*time.Millisecond, mode == "cancel")
				require.Positive(t, grants, "round %d: no grant at all", round)
				ended := time.Now()
				var left []string
				for {
					ps, _, err := cli.KV().List(key+"/.queue", &api.QueryOptions{RequireConsistent: true})
					require.NoError(t, err)
					left = left[:0]
					for _, p := range ps {
						held := "free"
						if p.Session != "" {
							held = "held by " + p.Session
						}
						left = append(left, p.Key+" ("+held+")")
					}
					if len(left) == 0 || time.Since(ended) > 2*time.Second {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				t.Logf("round %d: %d grants; queue keys left %v after %s", round, grants, left, time.Since(ended).Round(time.Millisecond))
				assert.Empty(t, left, "round %d: the shared queue of %s was left behind for 2 s after every client ended", round, key)
			}
		})
	}
}

// hotChain passes key among n clients on each replica of cs for d: each
// acquires (waiting), holds 5 ms and releases with its token. Then they
// end: after their current turn (cancel false), or at once, cancelled
// wherever they are (cancel true). It returns once every client's stream
// ended, with the number of grants.
func hotChain(t *testing.T, cs []lockbrokerv1.LockServiceClient, key string, n int, d time.Duration, cancel bool) int {
	t.Helper()
	ctx, stopAll := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopAll()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	grants := 0
	for r, c := range cs {
		for i := range n {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if ctx.Err() != nil {
						return
					}
					sctx, end := context.WithCancel(ctx)
					s, err := c.Acquire(sctx, &lockbrokerv1.AcquireRequest{Key: key, Value: fmt.Appendf(nil, "r%d-c%d", r, i)})
					if err != nil {
						end()
						return
					}
					var seq *lockbrokerv1.Sequencer
					for seq == nil {
						ev, err := s.Recv()
						if err != nil {
							break
						}
						seq = ev.GetAcquired().GetSequencer()
					}
					if seq != nil {
						mu.Lock()
						grants++
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
						if ctx.Err() == nil {
							rctx, rend := context.WithTimeout(context.Background(), 5*time.Second)
							_, err := c.Release(rctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
							rend()
							if err != nil && ctx.Err() == nil {
								t.Errorf("r%d-c%d: release: %v", r, i, err)
							}
							for {
								if _, err := s.Recv(); err != nil {
									break
								}
							}
						}
					}
					end()
				}
			})
		}
	}
	time.Sleep(d)
	if cancel {
		stopAll()
	} else {
		close(stop)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return grants
}
