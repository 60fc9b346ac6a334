package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
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

// TestSemaphoreAcquireOnFreshPrefix: the first contenders of a prefix with
// no `.lock` yet create it and take the slots; the others queue.
func TestSemaphoreAcquireOnFreshPrefix(t *testing.T) {
	tests := []struct {
		name       string
		contenders int
		limit      uint32
	}{
		{name: "one contender", contenders: 1, limit: 2},
		{name: "more contenders than slots at once", contenders: 8, limit: 3},
	}
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "fresh/" + t.Name()
			streams := make([]*stream, tt.contenders)
			for i := range streams {
				streams[i] = acquire(t, c, semReq(prefix, tt.limit, fmt.Sprint("c", i)))
			}
			// Each stream ends up holding or queued behind a full
			// semaphore; count the holders.
			acquired := 0
			for _, s := range streams {
				ev := s.next(10*time.Second, func(r *lockbrokerv1.AcquireResponse) bool {
					q := r.GetQueued()
					return r.GetAcquired() != nil || (q != nil && uint32(len(q.GetState().GetHolders())) == tt.limit)
				})
				if ev.GetAcquired() != nil {
					acquired++
					assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, ev.GetAcquired().GetSequencer().GetKind())
				}
			}
			assert.Equal(t, min(tt.contenders, int(tt.limit)), acquired)
			body, kv := semLock(t, agent.Client(), prefix)
			require.NotNil(t, body, "no %s/.lock", prefix)
			assert.Equal(t, semFlags, kv.Flags)
			assert.Equal(t, int(tt.limit), body.Limit)
			assert.Len(t, body.Holders, acquired)
		})
	}
}

// TestSemaphoreRelease: after Release (on the hold's replica or another),
// the stream says `released`, `.lock` no longer lists the session, its
// contender entry is gone, a broker-owned session is destroyed (a
// client-owned one is kept), and no release marker is left behind.
func TestSemaphoreRelease(t *testing.T) {
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	holdOn := replicas[0].Locks(t)
	sessions := replicas[0].Sessions(t)
	consul := agent.Client()
	semSkipIfFreshPrefixBroken(t, holdOn)

	tests := []struct {
		name        string
		releaseOn   lockbrokerv1.LockServiceClient
		clientOwned bool
	}{
		{name: "on the hold's replica", releaseOn: holdOn},
		{name: "on another replica", releaseOn: replicas[1].Locks(t)},
		{name: "client-owned session", releaseOn: holdOn, clientOwned: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "release/" + t.Name()
			req := semReq(prefix, 3, "me")
			if tt.clientOwned {
				resp, err := sessions.CreateSession(context.Background(), &lockbrokerv1.CreateSessionRequest{
					Options: &lockbrokerv1.SessionOptions{Ttl: dur(30 * time.Second), LockDelay: dur(0)},
				})
				require.NoError(t, err)
				sid := resp.GetSession().GetId()
				t.Cleanup(func() { _, _ = consul.Session().Destroy(sid, nil) })
				req.Session = &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}
			}
			_, other := semHold(t, holdOn, prefix, 3, "other")
			s := acquire(t, holdOn, req)
			seq := s.acquired(10 * time.Second).GetSequencer()
			sid := seq.GetSessionId()
			body, _ := semLock(t, consul, prefix)
			require.True(t, body.Holders[sid], "not in .lock before the release")

			semRelease(t, tt.releaseOn, s, seq)
			require.ErrorIs(t, s.end(5*time.Second), io.EOF, "the stream ends cleanly after released")

			// Release has returned: Consul no longer has the slot.
			body, _ = semLock(t, consul, prefix)
			require.NotNil(t, body)
			assert.NotContains(t, body.Holders, sid, ".lock still lists the released session")
			assert.Contains(t, body.Holders, other.GetSessionId(), "the other holder was dropped")
			assert.NotContains(t, semContenders(t, consul, prefix), prefix+"/"+sid, "contender entry left")

			if tt.clientOwned {
				assert.Contains(t, semSessions(t, consul), sid, "a client-owned session must outlive the release")
			} else {
				assert.EventuallyWithT(t, func(ct *assert.CollectT) {
					assert.NotContains(ct, semSessions(ct, consul), sid, "broker-owned session not destroyed")
				}, 5*time.Second, 20*time.Millisecond)
			}
			assert.EventuallyWithT(t, func(ct *assert.CollectT) {
				markers, _, err := consul.KV().Keys("lockbroker/released/"+sid+"/", "", nil)
				require.NoError(ct, err)
				assert.Empty(ct, markers, "release marker left in Consul")
			}, 5*time.Second, 20*time.Millisecond)

			// Releasing again is idempotent for the former holder, or
			// refused; never a success that frees someone else's slot.
			resp, err := tt.releaseOn.Release(context.Background(), &lockbrokerv1.ReleaseRequest{Key: prefix, SessionId: sid, Token: seq.GetToken()})
			if err == nil {
				assert.False(t, resp.GetReleased())
			} else {
				assert.Contains(t, []codes.Code{codes.FailedPrecondition, codes.NotFound}, status.Code(err), "%v", err)
			}
			body, _ = semLock(t, consul, prefix)
			assert.Contains(t, body.Holders, other.GetSessionId())
		})
	}
}

// TestSemaphoreNoStrayEntries: many contenders racing for the slots, some
// giving up while they wait (timeouts, cancels, try-once), leave nothing
// behind once all are done: no holder in `.lock`, no contender entry.
func TestSemaphoreNoStrayEntries(t *testing.T) {
	const (
		contenders = 24
		rounds     = 10
		limit      = 3
		prefix     = "stray/sem"
	)
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	semSkipIfFreshPrefixBroken(t, replicas[0].Locks(t))
	clients := make([]*client.Client, len(replicas))
	for i, r := range replicas {
		clients[i] = client.New(r.Conn(t))
	}
	chk := newSemChecker(t, limit)
	var granted, gaveUp atomic.Int64

	var wg sync.WaitGroup
	for i := range contenders {
		wg.Go(func() {
			c := clients[i%len(clients)]
			who := fmt.Sprintf("c%02d", i)
			for round := range rounds {
				opts := semLockOpts(limit, who)
				ctx, cancel := context.WithCancel(context.Background())
				switch (i + round) % 4 {
				case 1: // a bounded wait that may run out
					opts = append(opts, client.WithWaitTimeout(time.Duration(rand.IntN(30))*time.Millisecond))
				case 2: // the caller gives up at a random moment
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rand.IntN(40))*time.Millisecond)
				case 3: // try once
					opts = append(opts, client.WithWaitTimeout(0))
				}
				floor := chk.floor()
				l, err := c.Lock(ctx, prefix, opts...)
				switch {
				case err != nil && strings.Contains(err.Error(), "too many races"):
					t.Errorf("%s round %d: Lock: %v", who, round, err)
				case err == nil:
					granted.Add(1)
					chk.acquired(who, floor, l.Sequencer().GetToken())
					semWork()
					chk.releasing(who)
					rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := l.Release(rctx); err != nil {
						t.Errorf("%s round %d: Release: %v", who, round, err)
					}
					rcancel()
				case errors.Is(err, context.DeadlineExceeded), errors.Is(err, client.ErrBusy),
					status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Aborted,
					// the client returns gRPC's Canceled, not ctx.Err(), when
					// ctx ends before the stream is open
					ctx.Err() != nil && status.Code(err) == codes.Canceled:
					gaveUp.Add(1)
				default:
					t.Errorf("%s round %d: Lock: %v", who, round, err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d gave up", granted.Load(), gaveUp.Load())
	require.Positive(t, granted.Load())
	require.Positive(t, gaveUp.Load())

	requireSemaphoreClean(t, agent.Client(), prefix)
}
