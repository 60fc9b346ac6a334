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

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 40: one queue per key, shared by every replica. These tests run
// three broker processes on one Consul agent, as a platform team would.

// threeReplicas starts three broker processes on one agent and returns
// a LockService client for each.
func threeReplicas(t *testing.T) (*consultest.Agent, []lockbrokerv1.LockServiceClient) {
	t.Helper()
	agent := consultest.Start(t)
	var cs []lockbrokerv1.LockServiceClient
	for range 3 {
		p := brokertest.StartProcess(t, agent)
		cs = append(cs, lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr)))
	}
	return agent, cs
}

var queueDump func()

// awaitPosition waits until waiting stream s hears that its place in the
// key's queue is want.
func awaitPosition(t *testing.T, s *stream, want uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var seen []uint32
	for time.Now().Before(deadline) {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("the stream ended while waiting to be number %d (heard %v)", want, seen)
			}
			if q := ev.GetQueued(); q != nil {
				seen = append(seen, q.GetPosition())
				if q.GetPosition() == want {
					return
				}
			}
		case <-time.After(time.Until(deadline)):
		}
	}
	if queueDump != nil {
		queueDump()
	}
	t.Fatalf("the waiter never heard it is number %d in the queue (heard %v)", want, seen)
}

// cycle passes key among n clients of c until stop is closed or bound
// passes: each waits for the key, holds it for hold, and releases it with
// its token. It returns how many grants they made.
func cycle(t *testing.T, c lockbrokerv1.LockServiceClient, key string, limit uint32, n int, hold time.Duration, stop <-chan struct{}, bound time.Duration) func() int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	grants := 0
	deadline := time.Now().Add(bound)
	for i := range n {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				s, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key, Limit: limit, Value: fmt.Appendf(nil, "cycler-%d", i)})
				if err != nil {
					cancel()
					t.Errorf("cycler %d: %v", i, err)
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
					time.Sleep(hold)
					_, err = c.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
					if err != nil {
						t.Errorf("cycler %d: release: %v", i, err)
					}
				}
				cancel()
			}
		})
	}
	return func() int {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return grants
	}
}

// A hot key cycled by three clients of replica 1 (hold 5 ms, Release with
// the token): a waiter on replica 2 gets it within 2 s, for a lock and for
// a semaphore of limit 2 (four cyclers).
func TestSharedQueueHotKeyWaiterOnOtherReplica(t *testing.T) {
	_, cs := threeReplicas(t)
	for _, tt := range []struct {
		name    string
		limit   uint32
		cyclers int
	}{
		{"lock", 0, 3},
		{"semaphore", 2, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "queue/hot-" + tt.name
			for round := range 3 {
				stop := make(chan struct{})
				done := cycle(t, cs[0], key, tt.limit, tt.cyclers, 5*time.Millisecond, stop, 20*time.Second)
				time.Sleep(300 * time.Millisecond) // the key is hot
				start := time.Now()
				w := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: key, Limit: tt.limit, Value: []byte("other-replica")})
				ev := w.next(10*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil })
				waited := time.Since(start)
				w.cancel()
				close(stop)
				n := done()
				t.Logf("round %d: the waiter on replica 2 got %s after %s (token %d); replica 1's clients made %d grants",
					round, key, waited.Round(time.Millisecond), ev.GetAcquired().GetSequencer().GetToken(), n)
				assert.Less(t, waited, 2*time.Second, "round %d: the waiter on another replica waited too long", round)
			}
		})
	}
}

// Thirty waiters arrive 10 ms apart over three replicas (1, 2, 3, 1, ...)
// behind one holder, and are granted in arrival order: 0 inversions in
// every repetition. Each waiter hears its place in `queued`.
func TestSharedQueueArrivalOrderAcrossReplicas(t *testing.T) {
	agent := consultest.Start(t)
	var cs []lockbrokerv1.LockServiceClient
	var admin lockbrokerv1.AdminServiceClient
	for i := range 3 {
		conn := lkDial(t, brokertest.StartProcess(t, agent).Addr)
		cs = append(cs, lockbrokerv1.NewLockServiceClient(conn))
		if i == 1 {
			admin = lockbrokerv1.NewAdminServiceClient(conn)
		}
	}
	reps, n := 20, 30
	if lkRace {
		reps = 4
	}
	cli, _ := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	for rep := range reps {
		key := fmt.Sprintf("queue/order-%d", rep)
		queueDump = func() {
			ps, _, _ := cli.KV().List(key, nil)
			for _, p := range ps {
				t.Logf("DEBUG %s session=%s create=%d modify=%d", p.Key, p.Session, p.CreateIndex, p.ModifyIndex)
			}
		}
		holder := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: key})
		hseq := holder.acquired(5 * time.Second).GetSequencer()
		waiters := make([]*stream, n)
		for i := range n {
			waiters[i] = acquire(t, cs[i%3], &lockbrokerv1.AcquireRequest{Key: key, Value: fmt.Appendf(nil, "%d", i)})
			// Its place: behind every earlier waiter (all still queued).
			awaitPosition(t, waiters[i], uint32(i+1))
		}
		st := lkGetLock(t, cs[1], key)
		assert.EqualValues(t, n, st.GetWaiting(), "GetLock's count of waiters")
		if rep == 0 {
			checkQueueListed(t, admin, key, waiters)
			checkWatchCountsWaiters(t, cs[2], key, n)
		}
		_, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: hseq.GetSessionId(), Token: hseq.GetToken()})
		require.NoError(t, err)
		var last uint64
		for i := range n {
			seq := waiters[i].acquired(10 * time.Second).GetSequencer()
			require.Greater(t, seq.GetToken(), last, "rep %d: waiter %d's token does not follow its predecessor's", rep, i)
			last = seq.GetToken()
			// The next waiter must not have been granted before this one.
			if i+1 < n {
				select {
				case ev := <-waiters[i+1].events:
					require.Nil(t, ev.GetAcquired(), "rep %d: waiter %d granted before waiter %d released", rep, i+1, i)
					if ev.GetAcquired() == nil {
						// A `queued` update: keep nothing, the order is what counts.
					}
				default:
				}
			}
			_, err := cs[i%3].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
			require.NoError(t, err)
		}
		holder.cancel()
	}
}

// checkQueueListed checks that AdminService.ListHolds lists the key's
// holder, then every waiter of the three replicas in queue order, each
// with its place and its replica (waiter i queued on replica i%3).
func checkQueueListed(t *testing.T, admin lockbrokerv1.AdminServiceClient, key string, waiters []*stream) {
	t.Helper()
	resp, err := admin.ListHolds(lkCtx(t), &lockbrokerv1.ListHoldsRequest{KeyPrefix: key})
	require.NoError(t, err)
	var listed []*lockbrokerv1.HoldInfo
	for _, h := range resp.GetHolds() {
		if h.GetKey() == key && h.GetWaiting() {
			listed = append(listed, h)
		}
	}
	require.Len(t, listed, len(waiters), "ListHolds lists every replica's waiters")
	replicas := map[string]bool{}
	for i, h := range listed {
		assert.EqualValues(t, i+1, h.GetPosition(), "waiter %d's place", i)
		assert.NotEmpty(t, h.GetReplica(), "waiter %d's replica", i)
		replicas[h.GetReplica()] = true
		if i >= 3 {
			assert.Equal(t, listed[i-3].GetReplica(), h.GetReplica(), "waiters %d and %d queued on one replica", i-3, i)
		}
	}
	assert.Len(t, replicas, 3, "the waiters are on three replicas")
}

// checkWatchCountsWaiters checks that a Watch of key says n requests wait.
func checkWatchCountsWaiters(t *testing.T, c lockbrokerv1.LockServiceClient, key string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := c.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
	require.NoError(t, err)
	for {
		resp, err := w.Recv()
		require.NoError(t, err, "no Watch state counted %d waiters", n)
		if resp.GetState().GetWaiting() == uint32(n) {
			return
		}
	}
}

// An api.Lock waiter gets a key that clients of a replica pass among
// themselves within 3 s: the key stands free at least once a second
// (handoffChain), for long enough (handoffCourtesy).
func TestSharedQueueLeavesConsulClientsATurn(t *testing.T) {
	agent, cs := threeReplicas(t)
	key := "queue/api-lock"
	stop := make(chan struct{})
	done := cycle(t, cs[0], key, 0, 3, 5*time.Millisecond, stop, 30*time.Second)
	done2 := cycle(t, cs[1], key, 0, 2, 5*time.Millisecond, stop, 30*time.Second)
	defer func() { close(stop); done(); done2() }()
	time.Sleep(300 * time.Millisecond)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	for round := range 3 {
		l, err := cli.LockOpts(&api.LockOptions{Key: key, SessionTTL: "10s", LockTryOnce: false})
		require.NoError(t, err)
		start := time.Now()
		stopCh := make(chan struct{})
		timer := time.AfterFunc(10*time.Second, func() { close(stopCh) })
		lost, err := l.Lock(stopCh)
		timer.Stop()
		waited := time.Since(start)
		require.NoError(t, err)
		require.NotNil(t, lost, "round %d: api.Lock did not get the key in 10 s", round)
		t.Logf("round %d: api.Lock got the key after %s", round, waited.Round(time.Millisecond))
		assert.Less(t, waited, 3*time.Second, "round %d: api.Lock waited too long", round)
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, l.Unlock())
		_ = l.Destroy()
	}
}

// A ticket whose session ended is skipped at once and deleted; a ticket
// whose session lives on with nobody waiting on it (its replica and client
// gone) is skipped once the key has stood free for the queue's grace.
func TestSharedQueueSkipsDeadAndSilentTickets(t *testing.T) {
	agent, cs := threeReplicas(t)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	for _, tt := range []struct {
		name  string
		alive bool
		max   time.Duration
	}{
		{"dead", false, 500 * time.Millisecond},
		{"silent", true, 2500 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "queue/ghost-" + tt.name
			holder := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: key})
			hseq := holder.acquired(5 * time.Second).GetSequencer()
			// A ticket ahead of every broker waiter, as a waiter of a
			// replica would have written it.
			sid, _, err := cli.Session().Create(&api.SessionEntry{TTL: "60s", LockDelay: time.Nanosecond, Behavior: api.SessionBehaviorRelease}, nil)
			require.NoError(t, err)
			ok, _, err := cli.KV().Acquire(&api.KVPair{Key: key + "/.queue/" + sid, Value: []byte("gone"), Flags: broker.QueueFlagValue, Session: sid}, nil)
			require.NoError(t, err)
			require.True(t, ok)
			_, err = cli.KV().Put(&api.KVPair{Key: key + "/.queue", Flags: broker.QueueFlagValue}, nil)
			require.NoError(t, err)
			if !tt.alive {
				_, err = cli.Session().Destroy(sid, nil)
				require.NoError(t, err)
			} else {
				t.Cleanup(func() { _, _ = cli.Session().Destroy(sid, nil) })
			}
			w := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("waiter")})
			q := w.next(5*time.Second, isQueued).GetQueued()
			want := uint32(1)
			if tt.alive {
				want = 2
			}
			assert.Equal(t, want, q.GetPosition(), "the waiter's place (a dead ticket does not count)")
			start := time.Now()
			_, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: hseq.GetSessionId(), Token: hseq.GetToken()})
			require.NoError(t, err)
			w.acquired(10 * time.Second)
			waited := time.Since(start)
			t.Logf("%s ticket: the waiter got the key %s after the release", tt.name, waited.Round(time.Millisecond))
			assert.Less(t, waited, tt.max)
			if !tt.alive {
				p, _, err := cli.KV().Get(key+"/.queue/"+sid, nil)
				require.NoError(t, err)
				assert.Nil(t, p, "the dead ticket was not deleted")
			}
			holder.cancel()
		})
	}
}

// A newcomer does not take a free key ahead of a queued waiter: with a
// ticket in the queue (the guard up), a try-once is refused, and a waiting
// request queues behind it.
func TestSharedQueueNewcomerDoesNotJump(t *testing.T) {
	agent, cs := threeReplicas(t)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	key := "queue/newcomer"
	sid, _, err := cli.Session().Create(&api.SessionEntry{TTL: "60s", Behavior: api.SessionBehaviorRelease}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = cli.Session().Destroy(sid, nil) })
	ok, _, err := cli.KV().Acquire(&api.KVPair{Key: key + "/.queue/" + sid, Flags: broker.QueueFlagValue, Session: sid}, nil)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = cli.KV().Put(&api.KVPair{Key: key + "/.queue", Flags: broker.QueueFlagValue}, nil)
	require.NoError(t, err)
	for i, c := range cs {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: dur(0)})
		err := s.end(5 * time.Second)
		require.Error(t, err, "replica %d let a try-once take a free key with a waiter queued", i+1)
	}
	p, _, err := cli.KV().Get(key, nil)
	require.NoError(t, err)
	assert.Nil(t, p, "the key was written")
}

// A waiter of the Go library whose replica is SIGKILLed moves to the next
// replica with its session and keeps its place: it is granted before the
// waiters that queued after it.
func TestSharedQueueMovedWaitKeepsItsPlace(t *testing.T) {
	agent := consultest.Start(t)
	p1 := brokertest.StartProcess(t, agent)
	p2 := brokertest.StartProcess(t, agent)
	p3 := brokertest.StartProcess(t, agent)
	conn1, conn2, conn3 := lkDial(t, p1.Addr), lkDial(t, p2.Addr), lkDial(t, p3.Addr)
	c2, c3 := lockbrokerv1.NewLockServiceClient(conn2), lockbrokerv1.NewLockServiceClient(conn3)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	key := "queue/moved"

	holder := acquire(t, c3, &lockbrokerv1.AcquireRequest{Key: key})
	hseq := holder.acquired(5 * time.Second).GetSequencer()

	lib := client.New(conn1, client.WithReplicas(conn2, conn3))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		lease *client.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		l, err := lib.Lock(ctx, key, client.WithValue([]byte("moved")))
		got <- result{l, err}
	}()
	var ticket *api.KVPair
	require.Eventually(t, func() bool {
		ps, _, err := cli.KV().List(key+"/.queue/", nil)
		if err != nil || len(ps) != 1 {
			return false
		}
		ticket = ps[0]
		return true
	}, 10*time.Second, 10*time.Millisecond, "the library's wait took no ticket")

	var later []*stream
	for i, c := range []lockbrokerv1.LockServiceClient{c2, c3} {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: fmt.Appendf(nil, "later-%d", i)})
		awaitPosition(t, s, uint32(i+2))
		later = append(later, s)
	}

	p1.Kill()
	// The wait moves: its ticket, same session and place, is written
	// again by the replica that took the wait over.
	require.Eventually(t, func() bool {
		p, _, err := cli.KV().Get(ticket.Key, nil)
		return err == nil && p != nil && p.Session == ticket.Session && string(p.Value) != string(ticket.Value)
	}, 10*time.Second, 10*time.Millisecond, "the wait did not move with its ticket")
	p, _, err := cli.KV().Get(ticket.Key, nil)
	require.NoError(t, err)
	assert.Equal(t, ticket.CreateIndex, p.CreateIndex, "the moved wait's ticket lost its place")

	_, err = c3.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: hseq.GetSessionId(), Token: hseq.GetToken()})
	require.NoError(t, err)
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the moved wait was not granted")
	}
	require.NoError(t, r.err)
	for _, s := range later {
		select {
		case ev := <-s.events:
			require.Nil(t, ev.GetAcquired(), "a later waiter was granted before the moved one")
		default:
		}
	}
	assert.Equal(t, ticket.Session, r.lease.Sequencer().GetSessionId(), "the moved wait was granted on another session")
	require.NoError(t, r.lease.Release(lkCtx(t)))
	first := later[0].acquired(10 * time.Second).GetSequencer()
	assert.Greater(t, first.GetToken(), r.lease.Sequencer().GetToken())
}
