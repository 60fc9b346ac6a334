package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// waitUntil polls cond every 20 ms until it holds or d passed.
func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// awaitMove waits until the lease, whose replica stopped at stopped, is
// held through replica to (or lost), bounded by its deadline + 2 s, and
// requires the move with the same grant. It returns the deadline the
// lease had at the stop.
func awaitMove(t *testing.T, lease *client.Lease, to int, stopped time.Time) (known time.Time) {
	t.Helper()
	seq, known := lease.Sequencer(), lease.Deadline()
	moved := waitUntil(time.Until(known)+2*time.Second, func() bool { return lease.Replica() == to || lease.Err() != nil })
	t.Logf("moved to replica %d after %s (its last deadline was %s after the stop)", to, time.Since(stopped).Round(time.Millisecond), known.Sub(stopped).Round(time.Millisecond))
	require.True(t, moved, "neither moved nor lost by the deadline")
	require.NoError(t, lease.Err(), "lost instead of resumed on replica %d", to)
	assert.Equal(t, seq.GetToken(), lease.Sequencer().GetToken())
	return known
}

// A replica that stops (SIGSTOP: its connections stay open, its stream goes
// silent) is left for another while the lease is still guaranteed: the
// lease resumes there with the same grant instead of running out its
// deadline. When the stopped replica continues, its copy of the hold yields
// (the record moved) and the hold stays.
func TestStalledReplicaIsLeftForAnother(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	c := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr)))
	observer := client.New(dial(t, b.Addr))
	key := "stall/left-for-another"

	lease, err := c.Lock(ctx(t), key, client.WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 0, lease.Replica())
	first := lease.Deadline()
	require.True(t, waitUntil(10*time.Second, func() bool { return lease.Deadline().After(first) }), "a keepalive from A")

	a.Stop()
	known := awaitMove(t, lease, 1, time.Now())
	assert.True(t, time.Now().Before(known), "resumed only after the deadline it had")

	a.Cont()
	// A's copy wakes past its safe deadline with a session that B owns
	// now: it must leave it alone. A keepalive from B, then the hold still
	// current a while after A woke.
	known = lease.Deadline()
	require.True(t, waitUntil(10*time.Second, func() bool { return lease.Deadline().After(known) }), "a keepalive from B")
	time.Sleep(2 * time.Second)
	require.NoError(t, lease.Err())
	ok, _, err := observer.CheckSequencer(ctx(t), lease.Sequencer())
	require.NoError(t, err)
	assert.True(t, ok, "the hold did not survive A waking up")
	require.NoError(t, lease.Release(ctx(t)))
}

// When the next replica is stopped too, one resume attempt on it is
// bounded: the lease goes on to a third replica before its deadline.
func TestStalledResumeTargetIsLeftForTheNext(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	third := brokertest.StartProcess(t, agent)
	c := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr), dial(t, third.Addr)))
	key := "stall/resume-target-stalled"

	// A TTL past the promise cap (14.5 s), so that a stall (0.6 of it) and
	// one bounded attempt (3 s) fit well before the deadline.
	lease, err := c.Lock(ctx(t), key, client.WithTTL(30*time.Second))
	require.NoError(t, err)
	require.Equal(t, 0, lease.Replica())

	b.Stop()
	defer b.Cont()
	a.Stop()
	defer a.Cont()
	awaitMove(t, lease, 2, time.Now())
	a.Cont()
	b.Cont()
	require.NoError(t, lease.Release(ctx(t)))
}

// A request waiting on a replica that stops is moved to another after
// three of the broker's heartbeats of silence, and gets the key there when
// its holder lets go, instead of waiting on the stopped replica until its
// caller gives up. When the stopped replica continues, the waiter it kept
// (cancelled by the client) takes nothing from the one that moved.
func TestStalledWaiterIsMovedToAnother(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	holderClient := client.New(dial(t, b.Addr))
	waiterClient := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr)))
	key := "stall/waiter-moved"
	opts := []client.LockOption{client.WithTTL(10 * time.Second), client.WithLockDelay(0)}

	holder, err := holderClient.Lock(ctx(t), key, opts...)
	require.NoError(t, err)
	type result struct {
		lease *client.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiterClient.Lock(ctx(t), key, opts...)
		got <- result{l, err, time.Now()}
	}()
	// The waiter is queued on A (the holder's hold is the only one); a
	// replica stopped before its first `queued` announced a heartbeat would
	// keep it (see the README), so give it time to hear one.
	time.Sleep(time.Second)
	a.Stop()
	stopped := time.Now()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, holder.Release(ctx(t)))
	released := time.Now()

	var r result
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		a.Cont()
		t.Fatal("the waiter was still waiting 20 s after the release")
	}
	require.NoError(t, r.err)
	t.Logf("the waiter got the key on replica %d %s after A stopped (%s after the release)", r.lease.Replica(), r.at.Sub(stopped).Round(time.Millisecond), r.at.Sub(released).Round(time.Millisecond))
	assert.Equal(t, 1, r.lease.Replica())
	assert.Less(t, r.at.Sub(stopped), 3*broker.QueuedHeartbeat+3*time.Second, "moved only after")

	a.Cont()
	time.Sleep(2 * time.Second) // A reads the cancel it was sent while stopped
	require.NoError(t, r.lease.Err())
	ok, _, err := holderClient.CheckSequencer(ctx(t), r.lease.Sequencer())
	require.NoError(t, err)
	assert.True(t, ok, "the moved waiter's hold did not survive A waking up")
	require.NoError(t, r.lease.Release(ctx(t)))
}

// dialLib dials addr with the library's DialOptions (plaintext), as an
// application would.
func dialLib(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	dopts, err := client.DialOptions()
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, dopts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A Lock sent to a replica that is stopped and so never answers (no
// `queued`, so no heartbeat to miss) is moved by the keepalive of a
// connection DialOptions built: the connection is closed when its ping
// goes unanswered, the call fails UNAVAILABLE there and the Lock goes on
// at the next replica, instead of waiting on the stopped one until its
// context ends.
func TestStoppedBeforeFirstAnswerIsLeftByKeepalive(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	c := client.New(dialLib(t, a.Addr), client.WithReplicas(dialLib(t, b.Addr)))
	key := "stall/first-answer"

	// The connection to A is up (a lock and release through it), then A
	// stops.
	warm, err := c.Lock(ctx(t), key+"/warm")
	require.NoError(t, err)
	require.Equal(t, 0, warm.Replica())
	require.NoError(t, warm.Release(ctx(t)))
	a.Stop()
	defer a.Cont()
	stopped := time.Now()

	lease, err := c.Lock(ctx(t), key, client.WithTTL(10*time.Second))
	require.NoError(t, err, "still waiting on the stopped replica when the context ended")
	took := time.Since(stopped)
	t.Logf("the Lock got the key on replica %d %s after A stopped", lease.Replica(), took.Round(time.Millisecond))
	assert.Equal(t, 1, lease.Replica())
	assert.Less(t, took, client.KeepaliveTime+client.KeepaliveTimeout+3*time.Second)
	a.Cont()
	require.NoError(t, lease.Release(ctx(t)))
}

// A Release whose call fails while the lease is resuming (its replica
// killed, the next one stopped: the resume attempt and the Release both
// wait on it) ends the lease; when the stopped replica then answers the
// resume, the lease must not carry on on the resumed stream (a hold its
// caller believes released, renewed for as long as that replica runs).
// Chaos run at seed 672498857: three keys stuck 90 s behind such holds.
func TestReleaseDuringResumeLetsTheResumedHoldGo(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	c := client.New(dial(t, a.Addr), client.WithReplicas(dial(t, b.Addr)))
	key := "stall/release-during-resume"
	kv := agent.Client().KV()

	lease, err := c.Lock(ctx(t), key, client.WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 0, lease.Replica())

	b.Stop()
	defer b.Cont()
	a.Kill() // the stream breaks; the resume goes to B and waits on it
	time.Sleep(200 * time.Millisecond)
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	rerr := lease.Release(rctx) // sent to B too: no answer within 1 s
	cancel()
	t.Logf("Release: %v; lease: %v", rerr, lease.Err())
	require.ErrorIs(t, lease.Err(), client.ErrReleased, "the lease ended")
	b.Cont() // B answers the resume, within its 3 s attempt

	held := func() bool {
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		return err == nil && e != nil && e.Session != ""
	}
	resumed := time.Now()
	free := waitUntil(15*time.Second, func() bool { return !held() })
	assert.True(t, free, "the key is still held 15 s after the released lease's resume was answered")
	t.Logf("the key was free %s after B continued", time.Since(resumed).Round(time.Millisecond))
}
