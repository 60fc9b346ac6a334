package conformance

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// The scenarios of test/conformance/scenarios.md, in order. Each starts
// its own Consul dev agent and broker processes.

func holderPairs(st *lockbrokerv1.LockState) [][2]string {
	var out [][2]string
	for _, h := range st.GetHolders() {
		out = append(out, [2]string{h.GetSessionId(), string(h.GetValue())})
	}
	return out
}

func holderSessions(hs []*lockbrokerv1.Holder) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.GetSessionId())
	}
	return out
}

// S1: lock, release; a try on a busy key is busy with the holders; a
// bounded wait times out with the holders.
func TestS1LockReleaseBusyTimeout(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c, other := newClient(t, b.Addr), newClient(t, b.Addr)
	key := testKey(t)

	// 1. Lock with value a: a token, and GetLock shows the lease's session.
	lease, err := c.Lock(opCtx(t), key, client.WithValue([]byte("a")))
	require.NoError(t, err)
	seq := lease.Sequencer()
	assert.NotZero(t, seq.GetToken())
	st, err := other.GetLock(opCtx(t), key)
	require.NoError(t, err)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_LOCK, st.GetKind())
	assert.Equal(t, [][2]string{{seq.GetSessionId(), "a"}}, holderPairs(st))

	// 2. A try from a second connection is busy (TryLock is the error form:
	// ErrBusy, LOCK_HELD, naming the holder); so is a lock with wait 0.
	for name, try := range map[string]func() error{
		"TryLock":                      func() error { _, err := other.TryLock(opCtx(t), key); return err },
		"Lock with WithWaitTimeout(0)": func() error { _, err := other.Lock(opCtx(t), key, client.WithWaitTimeout(0)); return err },
	} {
		err := try()
		require.ErrorIs(t, err, client.ErrBusy, name)
		var se *client.StatusError
		require.ErrorAs(t, err, &se, name)
		assert.Equal(t, "LOCK_HELD", se.Reason, name)
		assert.Contains(t, holderSessions(se.Holders), seq.GetSessionId(), name)
	}

	// 3. A bounded wait of 1s fails after about 1s with WAIT_TIMEOUT and
	// the holder.
	start := time.Now()
	_, err = other.Lock(opCtx(t), key, client.WithWaitTimeout(time.Second))
	took := time.Since(start)
	figure(t, "S1 bounded wait of 1s took", took)
	require.ErrorIs(t, err, client.ErrWaitTimeout)
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "WAIT_TIMEOUT", se.Reason)
	assert.Contains(t, holderSessions(se.Holders), seq.GetSessionId())
	assert.GreaterOrEqual(t, took, 900*time.Millisecond)
	assert.LessOrEqual(t, took, 10*time.Second)

	// 4. Release: no holder, the lease not lost, a new lock has a larger
	// token.
	require.NoError(t, lease.Release(opCtx(t)))
	assert.Equal(t, client.ErrReleased, lease.Err(), "released, not lost")
	_, lost := errorsAsLost(lease.Err())
	assert.False(t, lost)
	st, err = other.GetLock(opCtx(t), key)
	require.NoError(t, err)
	assert.Empty(t, st.GetHolders())
	again, err := other.Lock(opCtx(t), key, client.WithWaitTimeout(5*time.Second))
	require.NoError(t, err)
	assert.Greater(t, again.Sequencer().GetToken(), seq.GetToken())
	require.NoError(t, again.Release(opCtx(t)))
}

// S2: the session destroyed in Consul behind the broker's back: the loss
// is reported within 1s.
func TestS2LossOnSessionDestroy(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c := newClient(t, b.Addr)
	lease, err := c.Lock(opCtx(t), testKey(t), client.WithValue([]byte("s2")))
	require.NoError(t, err)

	start := time.Now()
	_, err = agent.Client().Session().Destroy(lease.Sequencer().GetSessionId(), nil)
	require.NoError(t, err)
	select {
	case <-lease.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("loss not reported within 5s")
	}
	latency := time.Since(start)
	figure(t, "S2 loss reported after session destroy", latency)
	le := lostError(t, lease)
	assert.True(t, oneOf(le.Cause, "SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER"), "cause %s", le.Cause)
	assert.LessOrEqual(t, latency, time.Second, "the promise: within 1s")
	assert.Equal(t, lease.Err(), lease.Release(opCtx(t)), "releasing a lost lease returns its loss")
}

// S3: the broker SIGSTOPped: the library reports KEEPALIVE_TIMEOUT before
// the deadline it last knew (at most 1s before), while Consul still has
// the session.
func TestS3DeadlineWithStoppedBroker(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.StartProcess(t, agent)
	c := newClient(t, r.Addr)
	lease, err := c.Lock(opCtx(t), testKey(t), client.WithTTL(10*time.Second))
	require.NoError(t, err)
	first := lease.Deadline()
	waitFor(t, 10*time.Second, "a keepalive", func() bool { return lease.Deadline().After(first) })

	r.Stop()
	defer r.Cont()
	stopped := time.Now()
	known := lease.Deadline()
	select {
	case <-lease.Lost():
	case <-time.After(time.Until(known) + 5*time.Second):
		t.Fatal("loss never reported")
	}
	reported := time.Now()
	info, _, err := agent.Client().Session().Info(lease.Sequencer().GetSessionId(), &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	// The deadline the library last knew (a keepalive sent before the stop
	// may still have arrived after it).
	last := lease.Deadline()
	assert.Less(t, last.Sub(known), 5*time.Second, "keepalives kept coming from a stopped broker")
	margin := last.Sub(reported)
	figure(t, "S3 loss reported before the deadline by", margin)
	figure(t, "S3 loss reported after SIGSTOP", reported.Sub(stopped))
	assert.Equal(t, client.CauseKeepaliveTimeout, lostError(t, lease).Cause)
	assert.Greater(t, margin, time.Duration(0), "reported after the deadline")
	assert.LessOrEqual(t, margin, time.Second, "reported more than 1s before the deadline")
	assert.NotNil(t, info, "the session was gone when the loss was reported: the guarantee was false")
}

// S4: the replica holding the stream SIGKILLed: the hold continues on the
// other with the same token; with no replica left, KEEPALIVE_TIMEOUT
// before the deadline.
func TestS4ResumeThenLoss(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	c := newClient(t, a.Addr, b.Addr)
	observer := newClient(t, b.Addr)
	key := testKey(t)

	lease, err := c.Lock(opCtx(t), key, client.WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Equal(t, 0, lease.Replica(), "held through A")
	seq := lease.Sequencer()
	known := lease.Deadline()

	a.Kill()
	killed := time.Now()
	waitFor(t, time.Until(known), "resume on B", func() bool {
		return lease.Replica() == 1 && lease.Deadline().After(known)
	})
	figure(t, "S4 resumed on B after SIGKILL of A", time.Since(killed))
	require.NoError(t, lease.Err(), "lost after one replica died")
	assert.Equal(t, seq.GetToken(), lease.Sequencer().GetToken())
	st, err := observer.GetLock(opCtx(t), key)
	require.NoError(t, err)
	require.Len(t, st.GetHolders(), 1)
	assert.Equal(t, seq.GetSessionId(), st.GetHolders()[0].GetSessionId())
	assert.Equal(t, seq.GetToken(), st.GetHolders()[0].GetToken())
	waitFor(t, 10*time.Second, "keepalives from B", func() bool { return lease.Deadline().After(known.Add(time.Second)) })
	require.NoError(t, lease.Err())

	b.Kill()
	known = lease.Deadline()
	select {
	case <-lease.Lost():
	case <-time.After(time.Until(known) + 5*time.Second):
		t.Fatal("loss never reported")
	}
	reported := time.Now()
	margin := lease.Deadline().Sub(reported) // the deadline the library last knew
	figure(t, "S4 loss with no replica left, before the deadline by", margin)
	assert.Equal(t, client.CauseKeepaliveTimeout, lostError(t, lease).Cause)
	assert.Greater(t, margin, time.Duration(0), "reported after the deadline")
	assert.LessOrEqual(t, margin, time.Second, "reported more than 1s before the deadline")
}

// S6: a watch shows no holder, then the holder, then an explicit "no
// holder" after the release.
func TestS6WatchHolderThenNone(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c, other := newClient(t, b.Addr), newClient(t, b.Addr)
	key := testKey(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx, key)
	require.NoError(t, err)
	var seen []string
	until := func(what string, pred func(*lockbrokerv1.LockState) bool) *lockbrokerv1.LockState {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case resp, ok := <-w.C:
				require.True(t, ok, "the watch ended before %s: %v", what, w.Err())
				if pred(resp.GetState()) {
					return resp.GetState()
				}
				seen = append(seen, resp.GetState().String())
			case <-timeout:
				t.Fatalf("no %s within 5s; saw %v", what, seen)
			}
		}
	}
	first := until("first state", func(*lockbrokerv1.LockState) bool { return true })
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_NONE, first.GetKind())
	assert.Empty(t, first.GetHolders())

	lease, err := other.Lock(opCtx(t), key, client.WithValue([]byte("w")))
	require.NoError(t, err)
	st := until("the holder", func(st *lockbrokerv1.LockState) bool { return len(st.GetHolders()) > 0 })
	assert.Equal(t, [][2]string{{lease.Sequencer().GetSessionId(), "w"}}, holderPairs(st))

	require.NoError(t, lease.Release(opCtx(t)))
	// An explicit state with no holder (the released key stays, kind LOCK).
	until("no holder", func(st *lockbrokerv1.LockState) bool { return len(st.GetHolders()) == 0 })
	cancel()
	<-w.Done()
	assert.True(t, errors.Is(w.Err(), context.Canceled), "%v", w.Err())
}

// S7: TLS and token options. Skipped until the broker has them.
func TestS7TLSAndToken(t *testing.T) {
	out, _ := exec.Command(brokertest.BrokerBinary(t), "--help").CombinedOutput()
	help := string(out)
	if !strings.Contains(help, "-tls-cert") || !strings.Contains(help, "-tenants") {
		t.Skip("S7: the broker has no TLS/token options yet (security issue not landed)")
	}
	testS7(t)
}
