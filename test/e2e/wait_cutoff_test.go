package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestWaitLeavesReplicaCutFromConsul (chaos run at seed 659867481: a
// waiter whose replica was cut off from Consul got a free key 11.6 s
// late): a request waiting on a replica whose Consul agent stops answering
// ends UNAVAILABLE within a few seconds, and the Go library takes it to
// another replica, which grants the key as soon as it is free. Before, the
// replica went on sending `queued` heartbeats (it runs), so the client
// stayed, and got the key on B only 12.5 s after it was freed here.
// Watches on the replica end alike (they showed the key held for as long
// as the cut lasted). A slow link (2 s a round trip) is not a cut: waiters
// stay.
func TestWaitLeavesReplicaCutFromConsul(t *testing.T) {
	_, link, a, b := replicasOneBehindLink(t)
	key := "cutoff/k"
	holder := acquire(t, b.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	seq := holder.acquired(5 * time.Second).GetSequencer()

	// Slow, not cut: a raw waiter on A keeps hearing from it within three
	// heartbeats (the libraries' silence rule; a Consul call of the waiter
	// through the slow link can delay one), and its stream does not end.
	slow := acquire(t, a.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	slow.next(5*time.Second, isQueued)
	link.toxic(t, "latency", `{"latency":1000}`) // a 2 s round trip
	until := time.Now().Add(8 * time.Second)
	for time.Now().Before(until) {
		slow.next(3*broker.QueuedHeartbeat, isQueued)
	}
	link.heal()

	type res struct {
		l   *client.Lease
		err error
		at  time.Time
	}
	got := make(chan res, 1)
	lctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		l, err := client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Lock(lctx, key, client.WithTTL(10*time.Second), client.WithLockDelay(0))
		got <- res{l, err, time.Now()}
	}()
	time.Sleep(time.Second) // queued at A

	// Watches on A: one raw, one through the library (A, then B).
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	rawWatch, err := a.Locks(t).Watch(wctx, &lockbrokerv1.WatchRequest{Key: key})
	require.NoError(t, err)
	_, err = rawWatch.Recv()
	require.NoError(t, err)
	rawEnd := make(chan error, 1)
	go func() {
		for {
			if _, err := rawWatch.Recv(); err != nil {
				rawEnd <- err
				return
			}
		}
	}()
	libWatch, err := client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Watch(wctx, key)
	require.NoError(t, err)
	require.NotEmpty(t, (<-libWatch.C).GetState().GetHolders(), "held by the holder on B")
	seenGone := make(chan time.Time, 1) // the holder on B gone
	go func() {
		for r := range libWatch.C {
			if hs := r.GetState().GetHolders(); len(hs) == 0 || hs[0].GetSessionId() != seq.GetSessionId() {
				seenGone <- time.Now()
				return
			}
		}
	}()

	link.toxic(t, "timeout", `{"timeout":0}`) // a blackhole
	cut := time.Now()
	_, err = b.Locks(t).Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)

	werr := slow.end(10 * time.Second)
	t.Logf("the raw waiter on A ended %s after the cut: %v", time.Since(cut).Round(time.Millisecond), werr)
	assertCutOff(t, werr)
	assert.Less(t, time.Since(cut), 6*time.Second)

	// The raw watch on A ends the same way (its state would stay "held");
	// the library's watch moves to B and sees the key free, or already
	// held by the waiter that moved there.
	select {
	case err := <-rawEnd:
		t.Logf("the raw watch on A ended %s after the cut: %v", time.Since(cut).Round(time.Millisecond), err)
		assertCutOff(t, err)
		assert.Less(t, time.Since(cut), 6*time.Second)
	case <-time.After(10 * time.Second):
		t.Error("the raw watch on A did not end within 10 s of the cut")
	}
	assert.GreaterOrEqual(t, a.Broker.CutOffAnswers(), uint64(2), "lockbroker_replica_cut_off_total counts the raw waiter and watch")
	select {
	case at := <-seenGone:
		t.Logf("the library's watch saw the release %s after the cut", at.Sub(cut).Round(time.Millisecond))
		assert.Less(t, at.Sub(cut), 6*time.Second)
	case <-time.After(15 * time.Second):
		t.Error("the library's watch did not see the release within 15 s of the cut")
	}

	select {
	case r := <-got:
		require.NoError(t, r.err)
		t.Cleanup(func() { _ = r.l.Release(context.Background()) })
		t.Logf("the library's waiter got the key on replica %d, %s after the cut", r.l.Replica(), r.at.Sub(cut).Round(time.Millisecond))
		assert.Equal(t, 1, r.l.Replica(), "granted by B")
		assert.Less(t, r.at.Sub(cut), 6*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatal("the library's waiter did not get the free key within 20 s of the cut")
	}
}

// replicasOneBehindLink starts a Consul agent and two replicas on it: A
// reaches the agent through link (to slow down or cut), B directly.
func replicasOneBehindLink(t *testing.T) (*consultest.Agent, *cutLink, *brokertest.Replica, *brokertest.Replica) {
	t.Helper()
	agent := consultest.Start(t)
	link := newCutLink(t, strings.TrimPrefix(agent.Config().Address, "http://"))
	a := brokertest.Start(t, agent, brokertest.WithConsulAddress(link.addr()))
	b := brokertest.Start(t, agent)
	return agent, link, a, b
}

// assertCutOff: err is the end of a stream on a replica cut off from
// Consul.
func assertCutOff(t *testing.T, err error) {
	t.Helper()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "has not answered")
	assert.Equal(t, "REPLICA_CUT_OFF", reasonOf(err), "a reason every library moves on (not CONSUL_UNAVAILABLE)")
}

// TestWaitSurvivesBrokerPause: a replica stopped (SIGSTOP) for longer
// than the 3 s it gives Consul to answer is not cut off from Consul when
// it runs again: a raw waiter that stayed through the pause keeps waiting
// (chaos run at seed 936109458: every wait and watch on a replica ended
// REPLICA_CUT_OFF as it woke from a pause, Consul being fine).
func TestWaitSurvivesBrokerPause(t *testing.T) {
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent)
	locks := lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr))
	key := "cutoff/pause"
	holder := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	holder.acquired(5 * time.Second)
	waiter := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	waiter.next(5*time.Second, isQueued)

	p.Stop()
	time.Sleep(5 * time.Second)
	p.Cont()
	woke := time.Now()
	// Two heartbeats after the wake, the stream still open.
	waiter.next(5*time.Second, isQueued)
	waiter.next(5*time.Second, isQueued)
	t.Logf("the waiter heard two heartbeats in the %s after the wake", time.Since(woke).Round(time.Millisecond))
}
