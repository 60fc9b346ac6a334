package conformance

import (
	"context"
	"fmt"
	"sort"
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

// pending is a lease being waited for in the background.
type pending struct {
	done   chan struct{}
	lease  *client.Lease
	err    error
	cancel context.CancelFunc
}

// takeAsync starts take in the background; the test's end withdraws it
// (and releases what it got).
func takeAsync(t *testing.T, take func(ctx context.Context) (*client.Lease, error)) *pending {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pending{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.lease, p.err = take(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
		if p.lease != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer rcancel()
			_ = p.lease.Release(rctx)
		}
	})
	return p
}

func (p *pending) granted() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// await waits for the grant and requires one.
func (p *pending) await(t *testing.T, timeout time.Duration, what string) *client.Lease {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s: not granted within %v", what, timeout)
	}
	require.NoError(t, p.err, what)
	return p.lease
}

// waitingOn waits until GetLock(key) counts n waiters.
func waitingOn(t *testing.T, c *client.Client, key string, n uint32) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d waiting on %s", n, key), func() bool {
		st, err := c.GetLock(opCtx(t), key)
		return err == nil && st.GetWaiting() >= n
	})
}

// kvSnapshot is every Consul entry under prefix (the key itself
// included), with what changes when anyone writes it.
func kvSnapshot(t *testing.T, agent *consultest.Agent, prefix string) []string {
	t.Helper()
	pairs, _, err := agent.Client().KV().List(prefix, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	var out []string
	for _, p := range pairs {
		out = append(out, fmt.Sprintf("%s modify=%d flags=%d session=%s lockindex=%d", p.Key, p.ModifyIndex, p.Flags, p.Session, p.LockIndex))
	}
	sort.Strings(out)
	return out
}

// requireKindConflict requires err to be a kind conflict naming kind.
func requireKindConflict(t *testing.T, err error, kind lockbrokerv1.LockKind, what string) {
	t.Helper()
	require.Error(t, err, what)
	assert.ErrorIs(t, err, client.ErrKindConflict, what)
	var se *client.StatusError
	require.ErrorAs(t, err, &se, what)
	assert.Equal(t, "LIMIT_CONFLICT", se.Reason, what)
	name := strings.TrimPrefix(kind.String(), "LOCK_KIND_")
	assert.True(t, se.State.GetKind() == kind || strings.Contains(se.Error(), name),
		"%s: the error names %s (state kind %s, message %q)", what, name, se.State.GetKind(), se.Error())
}

// S8: a read-write lock: readers share, a reader behind a queued writer
// waits, arrival order, tokens increase, a plain lock and a read hold on
// a key of the other kind are refused.
func TestS8ReadWriteLock(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c1, c2, cw, c3 := newClient(t, b.Addr), newClient(t, b.Addr), newClient(t, b.Addr), newClient(t, b.Addr)
	key := testKey(t)

	// 1. Two readers hold at once; GetLock shows RWLOCK and both, read.
	r1, err := c1.RWLock(key).RLock(opCtx(t), client.WithValue([]byte("r1")))
	require.NoError(t, err)
	r2, err := c2.RWLock(key).RLock(opCtx(t), client.WithValue([]byte("r2")))
	require.NoError(t, err)
	require.NoError(t, r1.Err())
	s1, s2 := r1.Sequencer(), r2.Sequencer()
	assert.True(t, s1.GetRead() && s2.GetRead(), "read grants")
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, s1.GetKind())
	assert.Greater(t, s2.GetToken(), s1.GetToken(), "the second reader's token is above the first's")
	st, err := c3.GetLock(opCtx(t), key)
	require.NoError(t, err)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, st.GetKind())
	assert.ElementsMatch(t, []string{s1.GetSessionId(), s2.GetSessionId()}, holderSessions(st.GetHolders()))
	for _, h := range st.GetHolders() {
		assert.True(t, h.GetRead(), "holder %s is a reader", h.GetSessionId())
	}

	// 2. A writer waits; a reader that arrives after it waits too.
	w := takeAsync(t, func(ctx context.Context) (*client.Lease, error) { return cw.RWLock(key).Lock(ctx) })
	waitingOn(t, c3, key, 1)
	r3 := takeAsync(t, func(ctx context.Context) (*client.Lease, error) { return c3.RWLock(key).RLock(ctx) })
	waitingOn(t, c3, key, 2)
	time.Sleep(time.Second)
	assert.False(t, w.granted(), "the writer waits for the readers")
	assert.False(t, r3.granted(), "a reader behind a queued writer waits")

	// 3. The readers release: the writer, then (once it releases) the
	// third reader, each with a higher token.
	require.NoError(t, r1.Release(opCtx(t)))
	assert.False(t, w.granted(), "one reader still holds")
	require.NoError(t, r2.Release(opCtx(t)))
	wl := w.await(t, 10*time.Second, "the writer after both readers released")
	ws := wl.Sequencer()
	assert.False(t, ws.GetRead(), "a write grant")
	assert.Greater(t, ws.GetToken(), s2.GetToken(), "the writer's token is above both readers'")
	time.Sleep(500 * time.Millisecond)
	assert.False(t, r3.granted(), "the third reader waits while the writer holds")
	start := time.Now()
	require.NoError(t, wl.Release(opCtx(t)))
	rl := r3.await(t, 10*time.Second, "the third reader after the writer released")
	figure(t, "S8 the third reader granted after the writer's release by", time.Since(start))
	assert.True(t, rl.Sequencer().GetRead())
	assert.Greater(t, rl.Sequencer().GetToken(), ws.GetToken(), "the third reader's token is above the writer's")

	// 4. Kind conflicts, in both directions, change nothing in Consul.
	before := kvSnapshot(t, agent, key)
	_, err = c1.TryLock(opCtx(t), key)
	requireKindConflict(t, err, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, "a plain try-lock of a read-write key")
	assert.Equal(t, before, kvSnapshot(t, agent, key), "the read-write key changed")

	plain := testKey(t)
	pl, err := c1.Lock(opCtx(t), plain)
	require.NoError(t, err)
	before = kvSnapshot(t, agent, plain)
	_, err = c2.RWLock(plain).TryRLock(opCtx(t))
	requireKindConflict(t, err, lockbrokerv1.LockKind_LOCK_KIND_LOCK, "a try read lock of a plain lock key")
	assert.Equal(t, before, kvSnapshot(t, agent, plain), "the plain lock key changed")
	require.NoError(t, pl.Err())
	require.NoError(t, rl.Release(opCtx(t)))
	require.NoError(t, pl.Release(opCtx(t)))
}

// S9: a multi-key lock is all or nothing: one session and a token per
// key; a waiting multi-key request holds none of its keys; losing one key
// ends the lease naming it, and the rest is released.
func TestS9MultiKeyLock(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c1, c2, obs := newClient(t, b.Addr), newClient(t, b.Addr), newClient(t, b.Addr)
	base := testKey(t)
	a, bk, ck, d := base+"/a", base+"/b", base+"/c", base+"/d"

	// 1. A, B, C as one: one session, a token per key in order; GetLock of
	// each shows that session.
	first, err := c1.Lock(opCtx(t), a, client.WithKeys(bk, ck))
	require.NoError(t, err)
	seqs := first.Sequencers()
	require.Len(t, seqs, 3)
	sid := first.Sequencer().GetSessionId()
	for i, k := range []string{a, bk, ck} {
		assert.Equal(t, k, seqs[i].GetKey(), "sequencer %d is for its key, in request order", i)
		assert.Equal(t, sid, seqs[i].GetSessionId(), "one session")
		assert.NotZero(t, seqs[i].GetToken())
		st, err := obs.GetLock(opCtx(t), k)
		require.NoError(t, err)
		assert.Equal(t, []string{sid}, holderSessions(st.GetHolders()), "GetLock(%s)", k)
	}

	// 2. A try of B is busy; C and D as one waits, holding none.
	_, err = c2.TryLock(opCtx(t), bk)
	require.ErrorIs(t, err, client.ErrBusy)
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "LOCK_HELD", se.Reason)
	second := takeAsync(t, func(ctx context.Context) (*client.Lease, error) { return c2.Lock(ctx, ck, client.WithKeys(d)) })
	waitingOn(t, obs, ck, 1)
	time.Sleep(500 * time.Millisecond)
	assert.False(t, second.granted(), "C is held: C and D wait")
	st, err := obs.GetLock(opCtx(t), d)
	require.NoError(t, err)
	assert.Empty(t, st.GetHolders(), "a waiting multi-key request never holds a subset")

	// 3. The first releases: the second gets C and D together.
	require.NoError(t, first.Release(opCtx(t)))
	sl := second.await(t, 10*time.Second, "C and D after the release")
	got := sl.Sequencers()
	require.Len(t, got, 2)
	assert.Equal(t, []string{ck, d}, []string{got[0].GetKey(), got[1].GetKey()})
	assert.Greater(t, got[0].GetToken(), seqs[2].GetToken(), "C's token grows")
	for _, k := range []string{ck, d} {
		st, err := obs.GetLock(opCtx(t), k)
		require.NoError(t, err)
		assert.Equal(t, []string{got[0].GetSessionId()}, holderSessions(st.GetHolders()), "GetLock(%s)", k)
	}

	// 4. D deleted behind the broker's back: lost within 1 s naming D, and
	// C released soon after.
	start := time.Now()
	_, err = agent.Client().KV().Delete(d, nil)
	require.NoError(t, err)
	select {
	case <-sl.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the loss of D was not reported within 5s")
	}
	latency := time.Since(start)
	figure(t, "S9 loss reported after the delete of D", latency)
	assert.LessOrEqual(t, latency, time.Second, "the promise: within 1s")
	assert.Equal(t, d, sl.LostKey(), "the loss names D")
	le := lostError(t, sl)
	assert.Equal(t, d, le.Key)
	waitFor(t, 5*time.Second, "C released after the loss of D", func() bool {
		st, err := obs.GetLock(opCtx(t), ck)
		return err == nil && len(st.GetHolders()) == 0
	})
	assert.Equal(t, sl.Err(), sl.Release(opCtx(t)), "releasing a lost lease returns its loss")
}
