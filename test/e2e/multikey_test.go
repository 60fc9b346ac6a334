package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 43, item 2: multi-key locks (AcquireRequest.keys), taken all or
// nothing in one Consul transaction, against a real Consul agent and
// broker processes.

// twoReplicas starts two broker replicas on one agent: the first in this
// process (so that -race watches the broker's own goroutines), the
// second a broker process.
func twoReplicas(t *testing.T) (*consultest.Agent, []lockbrokerv1.LockServiceClient) {
	t.Helper()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	p := brokertest.StartProcess(t, agent)
	return agent, []lockbrokerv1.LockServiceClient{
		lockbrokerv1.NewLockServiceClient(lkDial(t, r.Addr)),
		lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr)),
	}
}

// mkKeys is n keys under prefix.
func mkKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/k%02d", prefix, i)
	}
	return keys
}

// multiReq asks for keys (the first is `key`) with a fast session.
func multiReq(keys []string, value string) *lockbrokerv1.AcquireRequest {
	return &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:], Value: []byte(value), Session: fast()}
}

// lockedBy is the keys among keys that Consul shows locked by session.
func lockedBy(t testing.TB, c *api.Client, keys []string, session string) []string {
	t.Helper()
	var out []string
	for _, k := range keys {
		kv, _, err := c.KV().Get(k, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		if kv != nil && kv.Session == session && session != "" {
			out = append(out, k)
		}
	}
	return out
}

// freeKeys is the keys among keys that no session holds.
func freeKeys(t testing.TB, c *api.Client, keys []string) []string {
	t.Helper()
	var out []string
	for _, k := range keys {
		kv, _, err := c.KV().Get(k, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		if kv == nil || kv.Session == "" {
			out = append(out, k)
		}
	}
	return out
}

// requireGrant checks an `acquired` of keys: one sequencer per key in the
// request's order, the first equal to `sequencer`, one session, and
// Consul showing every key held by it.
func requireGrant(t testing.TB, c *api.Client, a *lockbrokerv1.AcquireAcquired, keys []string) string {
	t.Helper()
	seqs := a.GetSequencers()
	require.Len(t, seqs, len(keys))
	session := seqs[0].GetSessionId()
	require.Equal(t, a.GetSequencer().GetKey(), seqs[0].GetKey())
	require.Equal(t, a.GetSequencer().GetToken(), seqs[0].GetToken())
	for i, s := range seqs {
		require.Equal(t, keys[i], s.GetKey(), "sequencers in the request's order")
		require.Equal(t, session, s.GetSessionId(), "one session")
		require.NotZero(t, s.GetToken())
	}
	require.ElementsMatch(t, keys, lockedBy(t, c, keys, session), "Consul shows every key held by the session")
	return session
}

// A multi-key request blocked by one busy key holds none of its keys
// while it waits (Consul polled throughout), and gets all of them in one
// go once the key is released; Release through any of its keys (with
// that key's token) releases every key, and `released` carries every
// sequencer.
func TestMultiKeyAllOrNothing(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/aon", 5)
	blocker := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: keys[3], Session: fast()})
	bseq := blocker.acquired(10 * time.Second).GetSequencer()

	m := acquire(t, cs[1], multiReq(keys, "multi"))
	q := m.next(10*time.Second, isQueued).GetQueued()
	session := q.GetSessionId()
	require.NotEmpty(t, session)
	assert.Equal(t, keys[3], q.GetState().GetKey(), "queued names the busy key")
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
		require.Empty(t, lockedBy(t, cc, keys, session), "a waiting multi-key request holds no key")
		time.Sleep(50 * time.Millisecond)
	}
	_, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: keys[3], SessionId: bseq.GetSessionId(), Token: bseq.GetToken()})
	require.NoError(t, err)
	a := m.acquired(10 * time.Second)
	require.Equal(t, session, requireGrant(t, cc, a, keys))
	tok := a.GetSequencers()[0].GetToken()
	for _, s := range a.GetSequencers() {
		assert.Equal(t, tok, s.GetToken(), "one transaction: every key's token is its index")
	}

	// Release through the fourth key, on the other replica.
	s4 := a.GetSequencers()[3]
	res, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s4.GetKey(), SessionId: s4.GetSessionId(), Token: s4.GetToken()})
	require.NoError(t, err)
	require.True(t, res.GetReleased())
	rel := m.next(5*time.Second, lkIsReleased).GetReleased()
	require.Len(t, rel.GetSequencers(), len(keys))
	for i, s := range rel.GetSequencers() {
		assert.Equal(t, keys[i], s.GetKey())
	}
	require.ElementsMatch(t, keys, freeKeys(t, cc, keys))
}

// Release on the hold's own replica, through the last key.
func TestMultiKeyReleaseLocal(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/local", 3)
	m := acquire(t, cs[0], multiReq(keys, "v"))
	a := m.acquired(10 * time.Second)
	requireGrant(t, cc, a, keys)
	last := a.GetSequencers()[2]
	res, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: last.GetKey(), SessionId: last.GetSessionId(), Token: last.GetToken()})
	require.NoError(t, err)
	require.True(t, res.GetReleased())
	require.Len(t, m.next(5*time.Second, lkIsReleased).GetReleased().GetSequencers(), 3)
	require.ElementsMatch(t, keys, freeKeys(t, cc, keys))
	// A retry, through another key, is answered OK: nothing to release.
	first := a.GetSequencers()[0]
	res, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: first.GetKey(), SessionId: first.GetSessionId(), Token: first.GetToken()})
	require.NoError(t, err)
	require.False(t, res.GetReleased())
	// A wrong token releases nothing.
	m2 := acquire(t, cs[0], multiReq(keys, "v"))
	a2 := m2.acquired(10 * time.Second)
	_, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: keys[1], SessionId: a2.GetSequencer().GetSessionId(), Token: a2.GetSequencer().GetToken() + 1000})
	require.Error(t, err)
	require.ElementsMatch(t, keys, lockedBy(t, cc, keys, a2.GetSequencer().GetSessionId()))
}

// 64 keys (the most): granted at once when free, and through the queue
// when one is busy (the grant then takes two transactions of up to 128
// operations); released together.
func TestMultiKey64Keys(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/64", 64)
	m := acquire(t, cs[0], multiReq(keys, "sixty-four"))
	a := m.acquired(10 * time.Second)
	requireGrant(t, cc, a, keys)
	m.cancel()
	require.Eventually(t, func() bool { return len(freeKeys(t, cc, keys)) == 64 }, 5*time.Second, 50*time.Millisecond)

	blocker := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: keys[63], Session: fast()})
	bseq := blocker.acquired(10 * time.Second).GetSequencer()
	w := acquire(t, cs[0], multiReq(keys, "sixty-four"))
	session := w.next(10*time.Second, isQueued).GetQueued().GetSessionId()
	require.Empty(t, lockedBy(t, cc, keys, session))
	_, err := cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: keys[63], SessionId: bseq.GetSessionId(), Token: bseq.GetToken()})
	require.NoError(t, err)
	a = w.acquired(10 * time.Second)
	requireGrant(t, cc, a, keys)
	first := a.GetSequencers()[0]
	_, err = cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: first.GetKey(), SessionId: first.GetSessionId(), Token: first.GetToken()})
	require.NoError(t, err)
	require.Len(t, w.next(5*time.Second, lkIsReleased).GetReleased().GetSequencers(), 64)
	require.Len(t, freeKeys(t, cc, keys), 64)
}

// Losing one key (deleted in Consul behind the broker's back) ends the
// whole hold with `lost` naming that key, and the other keys are free
// within 1 s; destroying the session ends it too.
func TestMultiKeyLoss(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/loss", 4)
	m := acquire(t, cs[0], multiReq(keys, "v"))
	requireGrant(t, cc, m.acquired(10*time.Second), keys)
	_, err := cc.KV().Delete(keys[2], nil)
	require.NoError(t, err)
	start := time.Now()
	lost := m.next(3*time.Second, isLost).GetLost()
	lostAfter := time.Since(start)
	assert.Equal(t, keys[2], lost.GetKey(), "lost names the key")
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER, lost.GetReason())
	others := []string{keys[0], keys[1], keys[3]}
	require.Eventually(t, func() bool { return len(freeKeys(t, cc, others)) == 3 }, time.Second, 20*time.Millisecond, "the other keys are released")
	t.Logf("lost after %v, the other keys seen free after %v", lostAfter, time.Since(start))

	m2 := acquire(t, cs[1], multiReq(keys, "v"))
	s2 := requireGrant(t, cc, m2.acquired(10*time.Second), keys)
	_, err = cc.Session().Destroy(s2, nil)
	require.NoError(t, err)
	lost = m2.next(3*time.Second, isLost).GetLost()
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason(), "%v", lost)
	assert.Contains(t, keys, lost.GetKey())
}

// Consul's own api.Lock excludes correctly on any key, both ways.
func TestMultiKeyConsulLockInterop(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/interop", 3)

	// api.Lock first: the multi-key request waits, holding nothing.
	l, err := cc.LockOpts(&api.LockOptions{Key: keys[1], SessionTTL: "10s", LockDelay: time.Millisecond})
	require.NoError(t, err)
	_, err = l.Lock(nil)
	require.NoError(t, err)
	m := acquire(t, cs[0], multiReq(keys, "broker"))
	session := m.next(10*time.Second, isQueued).GetQueued().GetSessionId()
	time.Sleep(500 * time.Millisecond)
	require.Empty(t, lockedBy(t, cc, keys, session))
	require.NoError(t, l.Unlock())
	a := m.acquired(10 * time.Second)
	requireGrant(t, cc, a, keys)

	// The broker first: api.Lock cannot take any key while it holds.
	for _, k := range keys {
		l2, err := cc.LockOpts(&api.LockOptions{Key: k, SessionTTL: "10s", LockTryOnce: true, LockWaitTime: 300 * time.Millisecond})
		require.NoError(t, err)
		ch, err := l2.Lock(nil)
		require.NoError(t, err)
		require.Nil(t, ch, "api.Lock on %s while the broker holds it", k)
	}
	s := a.GetSequencers()[1]
	_, err = cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
	require.NoError(t, err)
	l3, err := cc.LockOpts(&api.LockOptions{Key: keys[2], SessionTTL: "10s", LockTryOnce: true, LockWaitTime: 2 * time.Second})
	require.NoError(t, err)
	ch, err := l3.Lock(nil)
	require.NoError(t, err)
	require.NotNil(t, ch, "api.Lock after the release")
	require.NoError(t, l3.Unlock())
}

// Resume on another replica: the first key's sequencer and the other
// keys; the old stream ends RESUMED_ELSEWHERE and the hold goes on.
func TestMultiKeyResumeOnOtherReplica(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	keys := mkKeys("multi/resume", 3)
	m := acquire(t, cs[0], multiReq(keys, "v"))
	a := m.acquired(10 * time.Second)
	session := requireGrant(t, cc, a, keys)

	// Naming other keys is refused, and writes nothing.
	bad := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: []string{keys[1]}, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: a.GetSequencer()}})
	err := bad.end(10 * time.Second)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)

	r := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:], Session: &lockbrokerv1.AcquireRequest_Resume{Resume: a.GetSequencer()}})
	ra := r.acquired(10 * time.Second)
	require.True(t, ra.GetResumed())
	require.Len(t, ra.GetSequencers(), 3)
	for i, s := range ra.GetSequencers() {
		assert.Equal(t, a.GetSequencers()[i].GetToken(), s.GetToken(), "same grant of %s", s.GetKey())
	}
	lost := m.next(15*time.Second, isLost).GetLost()
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RESUMED_ELSEWHERE, lost.GetReason())
	require.ElementsMatch(t, keys, lockedBy(t, cc, keys, session), "still held after the old stream ended")
	// A cancel right after a resume keeps the hold until its promise (the
	// client may have given the resume up as late, see keep.go); after
	// resumeSettle (2 s) it releases every key.
	time.Sleep(2500 * time.Millisecond)
	r.cancel()
	require.Eventually(t, func() bool { return len(freeKeys(t, cc, keys)) == 3 }, 5*time.Second, 50*time.Millisecond)
}

// Multi-key requests on overlapping keys, in opposite orders, from
// several clients over two replicas: all are granted (no deadlock), no
// two holders ever overlap, and Consul, polled throughout (one consistent
// listing at a time), never shows a session holding part of its keys.
func TestMultiKeyOverlappingNoDeadlock(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	all := mkKeys("multi/dl", 6)
	sets := [][]string{
		{all[0], all[1], all[2], all[3]},
		{all[3], all[2], all[1], all[0]},
		{all[2], all[4], all[0]},
		{all[5], all[3], all[1]},
		{all[4], all[5], all[0], all[3]},
		{all[1], all[5]},
	}
	const rounds = 4
	var (
		mu      sync.Mutex
		holding = map[string]int{}
		grants  int
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	polled, partial := 0, 0
	pollStop := make(chan struct{})
	var poller sync.WaitGroup
	poller.Go(func() {
		for {
			select {
			case <-pollStop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			kvs, _, err := cc.KV().List("multi/dl/", &api.QueryOptions{RequireConsistent: true})
			if err != nil {
				continue
			}
			bySession := map[string][]string{}
			for _, kv := range kvs {
				if kv.Session != "" && !strings.Contains(kv.Key, "/.queue") {
					bySession[kv.Session] = append(bySession[kv.Session], kv.Key)
				}
			}
			polled++
			for s, held := range bySession {
				if !slices.ContainsFunc(sets, func(set []string) bool {
					return len(set) == len(held) && !slices.ContainsFunc(set, func(k string) bool { return !slices.Contains(held, k) })
				}) {
					partial++
					t.Errorf("session %s holds %v: not one request's whole set", s, held)
				}
			}
		}
	})
	var wg sync.WaitGroup
	for i, set := range sets {
		c := cs[i%2]
		wg.Go(func() {
			for range rounds {
				s, err := c.Acquire(ctx, multiReq(set, fmt.Sprintf("client-%d", i)))
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				var a *lockbrokerv1.AcquireAcquired
				for a == nil {
					ev, err := s.Recv()
					if err != nil {
						t.Errorf("client %d: no grant: %v", i, err)
						return
					}
					a = ev.GetAcquired()
				}
				mu.Lock()
				for _, k := range set {
					if holding[k] != 0 {
						t.Errorf("client %d got %s while client %d holds it", i, k, holding[k]-1)
					}
					holding[k] = i + 1
				}
				grants++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				for _, k := range set {
					holding[k] = 0
				}
				mu.Unlock()
				seq := a.GetSequencers()[len(set)-1]
				if _, err := c.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()}); err != nil {
					t.Errorf("client %d: release: %v", i, err)
				}
				for {
					if _, err := s.Recv(); err != nil {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	close(pollStop)
	poller.Wait()
	t.Logf("%d grants; %d consistent listings of Consul, %d with a partial hold", grants, polled, partial)
	require.NoError(t, ctx.Err(), "every request was granted within the bound")
	assert.Equal(t, len(sets)*rounds, grants)
	require.Eventually(t, func() bool { return len(freeKeys(t, cc, all)) == len(all) }, 5*time.Second, 50*time.Millisecond)
}

// A multi-key waiter is not starved by steady single-key traffic on one
// of its keys (three cyclers on each replica, 20 ms holds): granted
// within 5 s, and its other key stays free meanwhile.
func TestMultiKeyNotStarvedBySingleKeyTraffic(t *testing.T) {
	_, cs := twoReplicas(t)
	hot, other := "multi/starve/hot", "multi/starve/other"
	stop := make(chan struct{})
	done0 := cycle(t, cs[0], hot, 0, 3, 20*time.Millisecond, stop, 30*time.Second)
	done1 := cycle(t, cs[1], hot, 0, 3, 20*time.Millisecond, stop, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // the key is hot
	for round := range 3 {
		start := time.Now()
		m := acquire(t, cs[round%2], &lockbrokerv1.AcquireRequest{Key: other, Keys: []string{hot}, Session: fast()})
		a := m.acquired(5 * time.Second)
		took := time.Since(start)
		t.Logf("round %d: multi-key waiter granted after %v", round, took)
		require.Len(t, a.GetSequencers(), 2)
		s := a.GetSequencers()[1]
		_, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	t.Logf("single-key grants meanwhile: %d + %d", done0(), done1())
}

// Bad multi-key requests are INVALID_ARGUMENT naming `keys` (or the
// field of the bad key), and write nothing to Consul.
func TestMultiKeyInvalid(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	before := lkConsulState(t, cc)
	many := mkKeys("multi/bad", 65)
	for _, tt := range []struct {
		name  string
		req   *lockbrokerv1.AcquireRequest
		field string
	}{
		{"semaphore kind", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b"}, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE}, "keys"},
		{"read kind", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b"}, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ}, "keys"},
		{"write kind", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b"}, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE}, "keys"},
		{"limit 2", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b"}, Limit: 2}, "keys"},
		{"key repeated in keys", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b", "b"}}, "keys"},
		{"keys repeats key", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b", "a"}}, "keys"},
		{"64 in keys", &lockbrokerv1.AcquireRequest{Key: many[0], Keys: many[1:]}, "keys"},
		{"values too large together", &lockbrokerv1.AcquireRequest{Key: many[0], Keys: many[1:63], Value: make([]byte, 8192)}, "value"},
		{"bad key syntax", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b", "/c"}}, "keys"},
		{"client session", &lockbrokerv1.AcquireRequest{Key: "a", Keys: []string{"b"}, Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: "8c2a94e1-7a8f-4d3c-9a43-3f3d4a7a1b2c"}}, "keys"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := acquire(t, cs[0], tt.req)
			err := s.end(5 * time.Second)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			var fields []string
			for _, d := range status.Convert(err).Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, fv := range br.GetFieldViolations() {
						fields = append(fields, fv.GetField())
					}
				}
			}
			require.True(t, slices.ContainsFunc(fields, func(f string) bool { return strings.HasPrefix(f, tt.field) }), "fields %v in %v", fields, err)
		})
	}
	after := lkConsulState(t, cc)
	require.Equal(t, len(before.Sessions), len(after.Sessions), "no session made")
	for _, kv := range after.KV {
		assert.False(t, strings.HasPrefix(kv.Key, "a") || strings.HasPrefix(kv.Key, "b") || strings.HasPrefix(kv.Key, "multi/"), "written: %s", kv.Key)
	}
}

// ListHolds lists every key of a multi-key hold with the others in
// with_keys, and a waiter (on the replica asked) on each of its keys;
// GetLock and CheckSequencer work per key as for any lock.
func TestMultiKeyListHoldsAndPerKeyCalls(t *testing.T) {
	agent := consultest.Start(t)
	var cs []lockbrokerv1.LockServiceClient
	var admins []lockbrokerv1.AdminServiceClient
	for range 2 {
		p := brokertest.StartProcess(t, agent)
		conn := lkDial(t, p.Addr)
		cs = append(cs, lockbrokerv1.NewLockServiceClient(conn))
		admins = append(admins, lockbrokerv1.NewAdminServiceClient(conn))
	}
	keys := mkKeys("multi/list", 3)
	m := acquire(t, cs[0], multiReq(keys, "v"))
	a := m.acquired(10 * time.Second)
	session := a.GetSequencer().GetSessionId()
	w := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: keys[2], Keys: []string{"multi/list/k09"}, Session: fast()})
	wsession := w.next(10*time.Second, isQueued).GetQueued().GetSessionId()

	for i, admin := range admins {
		resp, err := admin.ListHolds(lkCtx(t), &lockbrokerv1.ListHoldsRequest{KeyPrefix: "multi/list/"})
		require.NoError(t, err)
		held := map[string][]string{}
		waiting := map[string][]string{}
		for _, h := range resp.GetHolds() {
			switch {
			case h.GetSessionId() == session && !h.GetWaiting():
				held[h.GetKey()] = h.GetWithKeys()
				assert.Equal(t, a.GetSequencers()[slices.Index(keys, h.GetKey())].GetToken(), h.GetToken())
			case h.GetSessionId() == wsession && h.GetWaiting():
				waiting[h.GetKey()] = h.GetWithKeys()
			}
		}
		require.Len(t, held, 3, "replica %d lists every key of the hold", i)
		for _, k := range keys {
			assert.ElementsMatch(t, slices.DeleteFunc(slices.Clone(keys), func(o string) bool { return o == k }), held[k], "with_keys of %s", k)
		}
		require.Contains(t, waiting, keys[2], "replica %d lists the waiter in the queue of %s", i, keys[2])
		assert.Equal(t, []string{"multi/list/k09"}, waiting[keys[2]], "replica %d", i)
		assert.Equal(t, []string{keys[2]}, waiting["multi/list/k09"], "replica %d", i)
	}
	for i, s := range a.GetSequencers() {
		st := lkGetLock(t, cs[1], keys[i])
		assert.Equal(t, session, lkHolder(t, st).GetSessionId())
		cur, err := cs[1].CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: s})
		require.NoError(t, err)
		assert.True(t, cur.GetCurrent(), "sequencer of %s", s.GetKey())
	}
	// The waiter holds nothing, and gets both keys once the hold ends.
	require.Empty(t, lockedBy(t, agent.Client(), []string{keys[2], "multi/list/k09"}, wsession))
	m.cancel()
	wa := w.acquired(10 * time.Second)
	require.Len(t, wa.GetSequencers(), 2)
}

// Keys may nest and span prefixes; a key that is something other than a
// lock (a semaphore prefix, a foreign entry) refuses the whole request
// with FAILED_PRECONDITION naming it, and nothing is taken.
func TestMultiKeyNestedAndConflictingKeys(t *testing.T) {
	agent, cs := twoReplicas(t)
	cc := agent.Client()
	nested := []string{"multi/nest/a", "multi/nest/a/b", "other/prefix/c"}
	m := acquire(t, cs[0], multiReq(nested, "v"))
	requireGrant(t, cc, m.acquired(10*time.Second), nested)
	m.cancel()
	require.Eventually(t, func() bool { return len(freeKeys(t, cc, nested)) == 3 }, 5*time.Second, 50*time.Millisecond)

	sem := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: "multi/conflict/sem", Limit: 3, Session: fast()})
	sem.acquired(10 * time.Second)
	_, err := cc.KV().Put(&api.KVPair{Key: "multi/conflict/foreign", Value: []byte("x"), Flags: 42}, nil)
	require.NoError(t, err)
	for _, bad := range []string{"multi/conflict/sem", "multi/conflict/foreign"} {
		keys := []string{"multi/conflict/a", bad, "multi/conflict/b"}
		s := acquire(t, cs[0], multiReq(keys, "v"))
		err := s.end(10 * time.Second)
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), bad)
		assert.Len(t, freeKeys(t, cc, []string{"multi/conflict/a", "multi/conflict/b"}), 2)
	}
}

// A replica that stops at once (Broker.Close) tells its multi-key hold
// BROKER_SHUTDOWN, leaving the session to its TTL; the client resumes the
// whole hold on another replica, which renews the session (its
// guaranteed_for comes from that renewal), and no key is free meanwhile.
func TestMultiKeyResumeAfterReplicaStops(t *testing.T) {
	agent := consultest.Start(t)
	cc := agent.Client()
	r := brokertest.Start(t, agent)
	p := brokertest.StartProcess(t, agent)
	c0 := lockbrokerv1.NewLockServiceClient(lkDial(t, r.Addr))
	c1 := lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr))
	keys := mkKeys("multi/stop", 4)
	m := acquire(t, c0, multiReq(keys, "v"))
	a := m.acquired(10 * time.Second)
	session := requireGrant(t, cc, a, keys)

	go r.Stop()
	lost := m.next(10*time.Second, isLost).GetLost()
	require.Equal(t, lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN, lost.GetReason())
	require.Empty(t, lost.GetKey(), "a shutdown concerns the whole hold")
	require.ElementsMatch(t, keys, lockedBy(t, cc, keys, session))

	res := acquire(t, c1, &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:], Session: &lockbrokerv1.AcquireRequest_Resume{Resume: a.GetSequencer()}})
	ra := res.acquired(10 * time.Second)
	require.True(t, ra.GetResumed())
	require.Len(t, ra.GetSequencers(), 4)
	require.Positive(t, ra.GetGuaranteedFor().AsDuration())
	require.ElementsMatch(t, keys, lockedBy(t, cc, keys, session))
	_ = m.end(10 * time.Second) // the old stream ended with its replica
	s := ra.GetSequencers()[3]
	_, err := c1.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
	require.NoError(t, err)
	require.Len(t, res.next(5*time.Second, lkIsReleased).GetReleased().GetSequencers(), 4)
	require.Len(t, freeKeys(t, cc, keys), 4)
}

// With the default session options a broker process takes multi-key
// sessions from its pool and gives them back after a clean release or a
// cancel (a try-once that finds a key busy writes nothing and gives its
// session back too): sessions are reused, every key is free after each
// cycle, and no session is left behind.
func TestMultiKeyPooledSessions(t *testing.T) {
	agent := consultest.Start(t)
	cc := agent.Client()
	p := brokertest.StartProcess(t, agent)
	c := lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr))
	keys := mkKeys("multi/pool", 4)
	seen := map[string]int{}
	for i := range 12 {
		m := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:], Value: []byte("pooled")})
		a := m.acquired(10 * time.Second)
		session := requireGrant(t, cc, a, keys)
		seen[session]++
		switch i % 3 {
		case 0: // released through a key
			s := a.GetSequencers()[i%4]
			_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
			require.NoError(t, err)
			m.next(5*time.Second, lkIsReleased)
		case 1: // cancelled
			m.cancel()
		case 2: // a try-once that finds the keys held, then released
			busy := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: keys[3], Keys: keys[:1], WaitTimeout: dur(0)})
			err := busy.end(5 * time.Second)
			require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
			s := a.GetSequencers()[0]
			_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool { return len(freeKeys(t, cc, keys)) == 4 }, 5*time.Second, 20*time.Millisecond, "cycle %d", i)
	}
	reused := 0
	for _, n := range seen {
		if n > 1 {
			reused++
		}
	}
	t.Logf("12 cycles used %d sessions", len(seen))
	assert.Positive(t, reused, "a pooled session serves more than one multi-key hold")
	kvs, _, err := cc.KV().List("multi/pool/", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	for _, kv := range kvs {
		assert.Empty(t, kv.Session, "%s still held", kv.Key)
	}
}

// threeMixedReplicas starts a broker in this process (for -race) and two
// broker processes on one agent; it returns the processes too.
func threeMixedReplicas(t *testing.T) (*consultest.Agent, []lockbrokerv1.LockServiceClient, []*brokertest.Process) {
	t.Helper()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	cs := []lockbrokerv1.LockServiceClient{lockbrokerv1.NewLockServiceClient(lkDial(t, r.Addr))}
	var ps []*brokertest.Process
	for range 2 {
		p := brokertest.StartProcess(t, agent)
		ps = append(ps, p)
		cs = append(cs, lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr)))
	}
	return agent, cs, ps
}

// grantedYet says whether s has heard `acquired` (it takes the events
// heard so far, without waiting).
func grantedYet(t *testing.T, s *stream) bool {
	t.Helper()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				err := <-s.done
				s.done <- err
				t.Fatalf("stream ended: %v", err)
			}
			if ev.GetAcquired() != nil {
				return true
			}
		default:
			return false
		}
	}
}

// ticketTouches polls the ticket key every 20 ms until stop is closed,
// and returns how many times its ModifyIndex moved and whether its
// CreateIndex stayed (a touch keeps the place).
func ticketTouches(t *testing.T, cc *api.Client, key string, stop <-chan struct{}) func() (int, bool) {
	var (
		mu        sync.Mutex
		moves     int
		created   uint64
		samePlace = true
		last      uint64
	)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			kv, _, err := cc.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
			if err == nil && kv != nil {
				mu.Lock()
				if created == 0 {
					created = kv.CreateIndex
				} else if kv.CreateIndex != created {
					samePlace = false
				}
				if last != 0 && kv.ModifyIndex != last {
					moves++
				}
				last = kv.ModifyIndex
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() (int, bool) {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return moves, samePlace
	}
}

// A multi-key waiter that heads the queue of a free key while another of
// its keys is held (past queueGrace) keeps its place there: it touches
// its ticket, so single-key waiters that came after it on that key (on
// other replicas) do not take the key past it after the grace. It is
// granted first when its other key is released; they follow in their
// order. The multi-key waiter runs in this process (-race).
func TestMultiKeyWaiterKeepsItsPlaceOnAFreeKey(t *testing.T) {
	agent, cs, ps := threeMixedReplicas(t)
	cc := agent.Client()
	a, b := "multi/keep/a", "multi/keep/b"
	hb := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: b, Session: fast()})
	hbSeq := hb.acquired(5 * time.Second).GetSequencer()
	ha := acquire(t, cs[2], &lockbrokerv1.AcquireRequest{Key: a, Session: fast()})
	haSeq := ha.acquired(5 * time.Second).GetSequencer()

	m := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: a, Keys: []string{b}, Value: []byte("multi"), Session: fast()})
	awaitPosition(t, m, 1)
	var singles []*stream
	for i, c := range []lockbrokerv1.LockServiceClient{cs[1], cs[2]} {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: a, Value: fmt.Appendf(nil, "single-%d", i), Session: fast()})
		awaitPosition(t, s, uint32(i+2))
		singles = append(singles, s)
	}
	kvs, _, err := cc.KV().List(a+"/.queue/", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	require.Len(t, kvs, 3, "three tickets on %s", a)
	slices.SortFunc(kvs, func(x, y *api.KVPair) int { return cmp.Compare(x.CreateIndex, y.CreateIndex) })
	msession := kvs[0].Session

	// A is free from now on, B held: 3 s, three graces.
	stop := make(chan struct{})
	touches := ticketTouches(t, cc, a+"/.queue/"+msession, stop)
	_, err = cs[2].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: a, SessionId: haSeq.GetSessionId(), Token: haSeq.GetToken()})
	require.NoError(t, err)
	const free = 3 * time.Second
	deadline := time.Now().Add(free)
	for time.Now().Before(deadline) {
		for i, s := range singles {
			require.False(t, grantedYet(t, s), "single-key waiter %d took %s past the multi-key waiter ahead of it", i, a)
		}
		require.Empty(t, lockedBy(t, cc, []string{a}, msession), "the multi-key waiter holds %s alone", a)
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	n, samePlace := touches()
	t.Logf("the multi-key waiter's ticket on %s moved %d times in %s (%.1f touches/s)", a, n, free, float64(n)/free.Seconds())
	assert.True(t, samePlace, "a touch keeps the ticket's CreateIndex")
	assert.GreaterOrEqual(t, n, 3, "touched at least every grace")
	assert.LessOrEqual(t, n, 8, "touched at most every queueGrace/2 (and a write or two more)")
	kv, _, err := cc.KV().Get(a, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	require.True(t, kv == nil || kv.Session == "", "%s stood free", a)

	// ListHolds (on another replica) lists the touched ticket in its
	// place, with its replica as the untouched ticket on B names it.
	admin := lockbrokerv1.NewAdminServiceClient(lkDial(t, ps[0].Addr))
	resp, err := admin.ListHolds(lkCtx(t), &lockbrokerv1.ListHoldsRequest{KeyPrefix: "multi/keep/"})
	require.NoError(t, err)
	replicaOn := map[string]string{}
	var onA []*lockbrokerv1.HoldInfo
	for _, h := range resp.GetHolds() {
		if h.GetWaiting() && h.GetKey() == a {
			onA = append(onA, h)
		}
		if h.GetWaiting() && h.GetSessionId() == msession {
			replicaOn[h.GetKey()] = h.GetReplica()
		}
	}
	require.Len(t, onA, 3)
	for i, h := range onA {
		assert.EqualValues(t, i+1, h.GetPosition())
	}
	assert.Equal(t, msession, onA[0].GetSessionId(), "the multi-key waiter heads %s", a)
	assert.NotEmpty(t, replicaOn[b])
	assert.Equal(t, replicaOn[b], replicaOn[a], "the touched ticket names its replica")

	_, err = cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: b, SessionId: hbSeq.GetSessionId(), Token: hbSeq.GetToken()})
	require.NoError(t, err)
	ma := m.acquired(5 * time.Second)
	require.Equal(t, msession, requireGrant(t, cc, ma, []string{a, b}))
	for i, s := range singles {
		assert.False(t, grantedYet(t, s), "single-key waiter %d granted beside the multi-key holder", i)
	}
	s := ma.GetSequencers()[1]
	_, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
	require.NoError(t, err)
	first := singles[0].acquired(5 * time.Second).GetSequencer()
	assert.False(t, grantedYet(t, singles[1]), "the second single-key waiter beside the first")
	_, err = cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: a, SessionId: first.GetSessionId(), Token: first.GetToken()})
	require.NoError(t, err)
	singles[1].acquired(5 * time.Second)
}

// The same with single-key clients cycling A on another replica (each
// holds it 1.5 s) while B is held long: the multi-key waiter is granted
// before every single-key request on A that came after it, once B is
// released.
func TestMultiKeyWaiterNotPassedByLongHolds(t *testing.T) {
	agent, cs, _ := threeMixedReplicas(t)
	cc := agent.Client()
	a, b := "multi/long/a", "multi/long/b"
	hb := acquire(t, cs[2], &lockbrokerv1.AcquireRequest{Key: b, Session: fast()})
	hbSeq := hb.acquired(5 * time.Second).GetSequencer()

	var (
		mu     sync.Mutex
		grants []time.Time // single-key grants of A
		calls  []time.Time // their Acquire calls
	)
	stop := make(chan struct{})
	stopCtx, stopAll := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(stopCtx, 20*time.Second)
				call := time.Now()
				s, err := cs[1].Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: a, Value: fmt.Appendf(nil, "cycler-%d", i), Session: fast()})
				if err != nil {
					cancel()
					if stopCtx.Err() == nil {
						t.Errorf("cycler %d: %v", i, err)
					}
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
					grants, calls = append(grants, time.Now()), append(calls, call)
					mu.Unlock()
					select {
					case <-stop:
					case <-time.After(1500 * time.Millisecond):
					}
					if _, err := cs[1].Release(ctx, &lockbrokerv1.ReleaseRequest{Key: a, SessionId: seq.GetSessionId(), Token: seq.GetToken()}); err != nil && stopCtx.Err() == nil {
						t.Errorf("cycler %d: release: %v", i, err)
					}
				}
				cancel()
			}
		})
	}
	defer func() { close(stop); stopAll(); wg.Wait() }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(grants) > 0 }, 5*time.Second, 20*time.Millisecond)

	m := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: a, Keys: []string{b}, Value: []byte("multi"), Session: fast()})
	m.next(5*time.Second, isQueued)
	queuedAt := time.Now()      // its tickets are written before `queued`
	time.Sleep(6 * time.Second) // A cycles on (two holds of 1.5 s ahead at most), then stands free while B is held
	releasedAt := time.Now()
	_, err := cs[2].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: b, SessionId: hbSeq.GetSessionId(), Token: hbSeq.GetToken()})
	require.NoError(t, err)
	ma := m.acquired(5 * time.Second)
	grantedAt := time.Now()
	requireGrant(t, cc, ma, []string{a, b})
	mu.Lock()
	var passed int
	for i, g := range grants {
		if calls[i].After(queuedAt) && g.Before(grantedAt) {
			passed++
		}
	}
	total := len(grants)
	mu.Unlock()
	t.Logf("multi-key waiter granted %s after B's release; %d single-key grants of A in all", grantedAt.Sub(releasedAt).Round(time.Millisecond), total)
	assert.Zero(t, passed, "single-key requests made after the multi-key waiter queued were granted before it")
	s := ma.GetSequencers()[0]
	_, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: s.GetKey(), SessionId: s.GetSessionId(), Token: s.GetToken()})
	require.NoError(t, err)
}

// A multi-key waiter whose broker process is SIGKILLed (its session lives
// on until its TTL) stops touching its tickets: a single-key waiter
// behind it on a free key takes the key after the grace, as it does past
// any silent head, while the dead waiter's other key stays held.
func TestMultiKeyDeadWaiterSkipped(t *testing.T) {
	agent, cs, ps := threeMixedReplicas(t)
	cc := agent.Client()
	a, b := "multi/dead/a", "multi/dead/b"
	hb := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: b, Session: fast()})
	hb.acquired(5 * time.Second)
	ha := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: a, Session: fast()})
	haSeq := ha.acquired(5 * time.Second).GetSequencer()

	// A session whose TTL outlives the test's bound.
	m := acquire(t, cs[2], &lockbrokerv1.AcquireRequest{Key: a, Keys: []string{b}, Value: []byte("multi"),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: dur(60 * time.Second), LockDelay: dur(0)}}})
	awaitPosition(t, m, 1)
	s := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: a, Value: []byte("single"), Session: fast()})
	awaitPosition(t, s, 2)

	ps[1].Kill()
	_, err := cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: a, SessionId: haSeq.GetSessionId(), Token: haSeq.GetToken()})
	require.NoError(t, err)
	start := time.Now()
	kvs, _, err := cc.KV().List(a+"/.queue/", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	live := 0
	for _, kv := range kvs {
		if kv.Session != "" {
			live++
		}
	}
	require.Equal(t, 2, live, "the dead waiter's ticket is live (its session lives on) beside the single-key waiter's")
	s.acquired(5 * time.Second)
	waited := time.Since(start)
	t.Logf("the single-key waiter got %s %s after its release, past the dead multi-key waiter", a, waited.Round(time.Millisecond))
	assert.GreaterOrEqual(t, waited, 900*time.Millisecond, "not before the grace")
	assert.Less(t, waited, 3*time.Second)
	kv, _, err := cc.KV().Get(b, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	require.NotNil(t, kv)
	assert.NotEmpty(t, kv.Session, "%s stays held by its holder", b)
}

// A multi-key waiter behind a silent ticket (its session alive, nobody
// behind it) on a free key, with its other key held: it skips the silent
// ticket after the grace, and a single-key waiter behind both, whose
// grace ran as long, does not take the key in that moment nor after (the
// multi-key waiter touched its ticket all along).
func TestMultiKeyWaiterBehindSilentTicketKeepsItsPlace(t *testing.T) {
	agent, cs, _ := threeMixedReplicas(t)
	cc := agent.Client()
	a, b := "multi/silent/a", "multi/silent/b"
	hb := acquire(t, cs[1], &lockbrokerv1.AcquireRequest{Key: b, Session: fast()})
	hbSeq := hb.acquired(5 * time.Second).GetSequencer()
	ha := acquire(t, cs[2], &lockbrokerv1.AcquireRequest{Key: a, Session: fast()})
	haSeq := ha.acquired(5 * time.Second).GetSequencer()
	// A ticket ahead of every waiter, as a waiter of a replica that died
	// with its client would have left it.
	sid, _, err := cc.Session().Create(&api.SessionEntry{TTL: "60s", LockDelay: time.Nanosecond, Behavior: api.SessionBehaviorRelease}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = cc.Session().Destroy(sid, nil) })
	ok, _, err := cc.KV().Acquire(&api.KVPair{Key: a + "/.queue/" + sid, Value: []byte("gone"), Flags: broker.QueueFlagValue, Session: sid}, nil)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = cc.KV().Put(&api.KVPair{Key: a + "/.queue", Flags: broker.QueueFlagValue}, nil)
	require.NoError(t, err)

	m := acquire(t, cs[0], &lockbrokerv1.AcquireRequest{Key: a, Keys: []string{b}, Value: []byte("multi"), Session: fast()})
	awaitPosition(t, m, 2)
	s := acquire(t, cs[2], &lockbrokerv1.AcquireRequest{Key: a, Value: []byte("single"), Session: fast()})
	awaitPosition(t, s, 3)

	_, err = cs[2].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: a, SessionId: haSeq.GetSessionId(), Token: haSeq.GetToken()})
	require.NoError(t, err)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		require.False(t, grantedYet(t, s), "the single-key waiter took %s past the multi-key waiter ahead of it", a)
		time.Sleep(50 * time.Millisecond)
	}
	_, err = cs[1].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: b, SessionId: hbSeq.GetSessionId(), Token: hbSeq.GetToken()})
	require.NoError(t, err)
	ma := m.acquired(5 * time.Second)
	requireGrant(t, cc, ma, []string{a, b})
	assert.False(t, grantedYet(t, s), "the single-key waiter granted beside the multi-key holder")
	sq := ma.GetSequencers()[0]
	_, err = cs[0].Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: sq.GetKey(), SessionId: sq.GetSessionId(), Token: sq.GetToken()})
	require.NoError(t, err)
	s.acquired(5 * time.Second)
}
