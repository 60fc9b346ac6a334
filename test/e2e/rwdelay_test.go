package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// A read-write lock honours the lock-delay of a holder whose session
// ended, as a lock does: with the holder's session destroyed in Consul, a
// reader or writer waiting on another replica is granted no earlier than
// the holder's lock-delay after the destroy, and within rwDelaySlack of
// its end; with a lock-delay of 0, at once. (Before, the waiter was
// granted within milliseconds whatever the lock-delay: chaos seed
// 71400765 saw a reader granted 0.14 ms before the writer heard `lost`.)
func TestRWLockDelay(t *testing.T) {
	const rwDelaySlack = 400 * time.Millisecond
	agent, cs, _ := rwTwoReplicas(t)
	consul := agent.Client()
	for i, tt := range []struct {
		name       string
		delay      time.Duration
		waiterRead bool
	}{
		{"writer's lock-delay 1s, reader waits", time.Second, true},
		{"writer's lock-delay 1s, writer waits", time.Second, false},
		{"writer's lock-delay 0, reader waits", 0, true},
		{"writer's lock-delay 0, writer waits", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := fmt.Sprintf("rwdelay/a%d", i)
			req := rwReq(key, false, "w")
			req.Session = lkSession(10*time.Second, tt.delay)
			holder := acquire(t, cs[0], req)
			wseq := holder.acquired(10 * time.Second).GetSequencer()
			waiter := rwQueued(t, cs[1], key, tt.waiterRead, "next")
			// Let the waiter's replica see the holder (and learn its
			// session's lock-delay) before the session ends.
			time.Sleep(200 * time.Millisecond)

			destroyed := time.Now()
			_, err := consul.Session().Destroy(wseq.GetSessionId(), nil)
			require.NoError(t, err)
			ev := waiter.next(tt.delay+5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool {
				if q := r.GetQueued(); q != nil && tt.delay > 0 && q.GetLockDelayRemaining().AsDuration() > 0 {
					assert.LessOrEqual(t, q.GetLockDelayRemaining().AsDuration(), tt.delay)
				}
				return r.GetAcquired() != nil
			})
			took := time.Since(destroyed)
			t.Logf("granted %s after the destroy (lock-delay %s)", took.Round(time.Millisecond), tt.delay)
			assert.GreaterOrEqual(t, took, tt.delay, "granted inside the dead holder's lock-delay")
			assert.LessOrEqual(t, took, tt.delay+rwDelaySlack, "granted too long after the lock-delay ended")
			seq := ev.GetAcquired().GetSequencer()
			assert.Equal(t, tt.waiterRead, seq.GetRead())
			assert.Greater(t, seq.GetToken(), wseq.GetToken())
			holder.next(5*time.Second, isLost)

			// The grant deleted the dead holder's entry and listing.
			kv, _, err := consul.KV().Get(key+"/"+wseq.GetSessionId(), &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			assert.Nil(t, kv, "the dead holder's entry is left")
			k, _, err := consul.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			require.NotNil(t, k)
			var body struct{ Holders map[string]string }
			require.NoError(t, json.Unmarshal(k.Value, &body))
			assert.NotContains(t, body.Holders, wseq.GetSessionId())
			holders := lkGetLock(t, cs[0], key).GetHolders()
			require.Len(t, holders, 1)
			assert.Equal(t, seq.GetSessionId(), holders[0].GetSessionId())
		})
	}
}

// A reader that arrives while the dead writer's lock-delay runs (and
// another arrival meanwhile) is not refused: it waits, and the arrivals
// keep the dead writer listed, so the grant still waits for the end of
// its lock-delay. GetLock shows no holder meanwhile. A TryAcquire inside
// the lock-delay is ABORTED LOCK_DELAY and writes nothing; after it, it
// is granted.
func TestRWLockDelayArrivalsAndTry(t *testing.T) {
	const delay = 1500 * time.Millisecond
	agent, cs, _ := rwTwoReplicas(t)
	consul := agent.Client()
	key := "rwdelay/arrive"
	req := rwReq(key, false, "w")
	req.Session = lkSession(10*time.Second, delay)
	holder := acquire(t, cs[0], req)
	wseq := holder.acquired(10 * time.Second).GetSequencer()
	destroyed := time.Now()
	_, err := consul.Session().Destroy(wseq.GetSessionId(), nil)
	require.NoError(t, err)
	holder.next(5*time.Second, isLost)

	r1 := rwQueued(t, cs[1], key, true, "r1")
	r2 := rwQueued(t, cs[0], key, true, "r2")
	assert.Empty(t, lkGetLock(t, cs[1], key).GetHolders(), "a dead holder is not a holder")

	if time.Since(destroyed) < delay-300*time.Millisecond {
		resp, err := cs[1].TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: key, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, SessionId: clientSession(t, consul)})
		require.Error(t, err, "try granted inside the lock-delay: %v", resp)
		assert.Equal(t, codes.Aborted, status.Code(err), "%v", err)
		assert.Contains(t, err.Error(), "lock-delay")
	}
	for _, s := range []*stream{r1, r2} {
		s.acquired(delay + 5*time.Second)
		took := time.Since(destroyed)
		assert.GreaterOrEqual(t, took, delay, "granted inside the dead holder's lock-delay")
		assert.LessOrEqual(t, took, delay+time.Second)
	}
	resp, err := cs[1].TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: key, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, SessionId: clientSession(t, consul)})
	require.NoError(t, err)
	assert.True(t, resp.GetSequencer().GetRead())
	assert.Len(t, lkGetLock(t, cs[0], key).GetHolders(), 3)
}

// A waiter whose session ends while it waits holds nothing: its entry's
// lock-delay does not delay the next grant.
func TestRWLockDelayDeadWaiter(t *testing.T) {
	agent, cs, _ := rwTwoReplicas(t)
	consul := agent.Client()
	key := "rwdelay/waiter"
	h, hseq := rwHold(t, cs[0], key, false, "h")
	req := rwReq(key, false, "dead")
	req.Session = lkSession(10*time.Second, 10*time.Second)
	dead := acquire(t, cs[1], req)
	dead.next(10*time.Second, isQueued)
	deadSession := waitingSession(t, consul, key, hseq.GetSessionId())
	_, err := consul.Session().Destroy(deadSession, nil)
	require.NoError(t, err)
	require.Error(t, dead.end(5*time.Second))
	next := rwQueued(t, cs[1], key, true, "next")
	released := time.Now()
	rwRelease(t, cs[0], h, hseq)
	next.acquired(5 * time.Second)
	took := time.Since(released)
	t.Logf("granted %s after the release", took.Round(time.Millisecond))
	assert.Less(t, took, time.Second, "a dead waiter's lock-delay delayed the grant")
}

// waitingSession is the session of the one contender entry under key
// other than holder's.
func waitingSession(t *testing.T, consul *api.Client, key, holder string) string {
	t.Helper()
	pairs, _, err := consul.KV().List(key+"/", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	for _, p := range pairs {
		if p.Session != "" && p.Session != holder {
			return p.Session
		}
	}
	t.Fatalf("no waiting contender under %q", key)
	return ""
}

// clientSession creates a client-owned session in Consul (no lock-delay).
func clientSession(t *testing.T, consul *api.Client) string {
	t.Helper()
	id, _, err := consul.Session().Create(&api.SessionEntry{TTL: "30s", LockDelay: time.Millisecond, Behavior: "release"}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = consul.Session().Destroy(id, nil) })
	return id
}
