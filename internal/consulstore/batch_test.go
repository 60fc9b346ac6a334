package consulstore

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// holdSlots takes every write slot of s, as calls in flight would, so the
// writes that come next queue; release lets the first queued batch go.
func holdSlots(t *testing.T, s *Store) (release func()) {
	t.Helper()
	b := s.batch
	b.mu.Lock()
	require.Zero(t, b.inflight, "no write in flight before the test holds the slots")
	b.inflight = b.max
	b.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			// Each slot ends as a call would: the first sends what waits.
			for range b.max {
				b.next()
			}
		})
	}
	t.Cleanup(release)
	return release
}

// queued waits until n writes wait in s's queue.
func queued(t *testing.T, s *Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.queue) == n
	}, 5*time.Second, time.Millisecond, "%d writes queued", n)
}

// txnResult is one caller's answer.
type txnResult struct {
	out []*broker.Entry
	err error
}

// startTxns starts one Txn per element of ops, in order (each queued
// before the next starts), and returns their answers once all are in.
func startTxns(t *testing.T, s *Store, ops ...[]broker.Op) func() []txnResult {
	t.Helper()
	res := make([]txnResult, len(ops))
	var wg sync.WaitGroup
	for i, o := range ops {
		wg.Go(func() {
			out, err := s.Txn(t.Context(), o)
			res[i] = txnResult{out, err}
		})
		queued(t, s, i+1)
	}
	return func() []txnResult {
		wg.Wait()
		return res
	}
}

// TestTxnBatchGroupsWaitingWrites proves group commit: writes that come
// while every slot is busy go to Consul as one transaction, and each
// caller gets the results of its own ops, as if it had made the call.
func TestTxnBatchGroupsWaitingWrites(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	ctx := t.Context()
	sess := session(t, s, broker.SessionSpec{Name: "b"})
	idx := set(t, s, "g/cas", "old")

	release := holdSlots(t, s)
	before := s.OpCounts()
	wait := startTxns(t, s,
		[]broker.Op{{Verb: broker.OpLock, Key: "g/a", Value: []byte("A"), Session: sess}},
		[]broker.Op{{Verb: broker.OpCheckNotExists, Key: "g/b"}, {Verb: broker.OpSet, Key: "g/b", Value: []byte("B")}},
		[]broker.Op{{Verb: broker.OpCAS, Key: "g/cas", Value: []byte("new"), Index: idx}, {Verb: broker.OpGet, Key: "g/cas"}},
		[]broker.Op{{Verb: broker.OpLock, Key: "g/c", Session: sess}, {Verb: broker.OpDelete, Key: "g/none"}, {Verb: broker.OpCheckSession, Key: "g/c", Session: sess}},
	)
	release()
	res := wait()
	for i, r := range res {
		require.NoError(t, r.err, "caller %d", i)
	}
	after := s.OpCounts()
	assert.Equal(t, before["kv_txn_write"]+1, after["kv_txn_write"], "four callers, one Consul call")
	batches, txns := s.TxnBatches()
	assert.Equal(t, uint64(1), batches)
	assert.Equal(t, uint64(4), txns)

	// Each caller's slots, one per op, as a call of its own returns them.
	require.Len(t, res[0].out, 1)
	a := res[0].out[0]
	assert.Equal(t, "g/a", a.Key)
	assert.Equal(t, sess, a.Session)
	assert.Equal(t, uint64(1), a.LockIndex)
	assert.Nil(t, a.Value, "only get returns the value")

	require.Len(t, res[1].out, 2)
	assert.Nil(t, res[1].out[0], "check-not-exists has no entry")
	assert.Equal(t, "g/b", res[1].out[1].Key)

	require.Len(t, res[2].out, 2)
	assert.Equal(t, "g/cas", res[2].out[0].Key)
	assert.Equal(t, []byte("new"), res[2].out[1].Value)
	assert.Greater(t, res[2].out[1].ModifyIndex, idx)

	require.Len(t, res[3].out, 3)
	assert.Equal(t, "g/c", res[3].out[0].Key)
	assert.Nil(t, res[3].out[1], "delete has no entry")
	assert.Equal(t, sess, res[3].out[2].Session)

	// One Raft index for all: the batch was one transaction.
	assert.Equal(t, a.ModifyIndex, res[1].out[1].ModifyIndex)
	assert.Equal(t, a.ModifyIndex, res[3].out[0].ModifyIndex)

	kv, _, err := s.Client().KV().Get("g/b", nil)
	require.NoError(t, err)
	require.NotNil(t, kv)
	assert.Equal(t, "B", string(kv.Value))

	// With nothing in flight, a write goes at once, alone.
	before = s.OpCounts()
	_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: "g/a", Session: sess}})
	require.NoError(t, err)
	assert.Equal(t, before["kv_txn_write"]+1, s.OpCounts()["kv_txn_write"])
	batches, _ = s.TxnBatches()
	assert.Equal(t, uint64(1), batches, "no new batch")
}

// TestTxnBatchRolledBack proves what each member of a batch Consul rolls
// back gets: a member whose op failed on keys no earlier member touched has
// its own failure; the members that passed are sent again and applied; a
// member that failed on a key an earlier member wrote runs again alone, and
// gets the answer the state Consul has gives it, not the one the rolled-back
// write gave it.
func TestTxnBatchRolledBack(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	holder := session(t, s, broker.SessionSpec{Name: "holder"})
	mine := session(t, s, broker.SessionSpec{Name: "mine"})
	other := session(t, s, broker.SessionSpec{Name: "other"})
	_, err := s.Txn(t.Context(), []broker.Op{{Verb: broker.OpLock, Key: "r/held", Session: holder}})
	require.NoError(t, err)

	release := holdSlots(t, s)
	before := s.OpCounts()
	wait := startTxns(t, s,
		// 0: passes.
		[]broker.Op{{Verb: broker.OpSet, Key: "r/a", Value: []byte("A")}},
		// 1: fails on a key of its own: its answer, as alone.
		[]broker.Op{{Verb: broker.OpSet, Key: "r/b", Value: []byte("B")}, {Verb: broker.OpLock, Key: "r/held", Session: mine}},
		// 2: fails in the batch on r/b, which 1 wrote there and which was
		// never applied: alone, it passes.
		[]broker.Op{{Verb: broker.OpCheckNotExists, Key: "r/b"}, {Verb: broker.OpSet, Key: "r/c", Value: []byte("C")}},
		// 3: passes.
		[]broker.Op{{Verb: broker.OpLock, Key: "r/race", Session: mine}},
		// 4: fails because 3 locked r/race first; 3 is rolled back with
		// the batch, so 4 runs again alone.
		[]broker.Op{{Verb: broker.OpLock, Key: "r/race", Session: other}},
	)
	release()
	res := wait()

	require.NoError(t, res[0].err)
	assert.Equal(t, "r/a", res[0].out[0].Key)
	requireTxnError(t, res[1].err, broker.TxnFailure{Op: 1, Kind: broker.TxnLockHeld})
	require.NoError(t, res[2].err, "r/b never existed")
	assert.Equal(t, "r/c", res[2].out[1].Key)

	// 3 and 4 contend for r/race: exactly one holds it, the other was
	// told the lock is held, and Consul agrees with the one that won.
	kv, _, err := s.Client().KV().Get("r/race", nil)
	require.NoError(t, err)
	require.NotNil(t, kv)
	switch {
	case res[3].err == nil:
		requireTxnError(t, res[4].err, broker.TxnFailure{Op: 0, Kind: broker.TxnLockHeld})
		assert.Equal(t, mine, kv.Session)
		assert.Equal(t, mine, res[3].out[0].Session)
	default:
		requireTxnError(t, res[3].err, broker.TxnFailure{Op: 0, Kind: broker.TxnLockHeld})
		require.NoError(t, res[4].err)
		assert.Equal(t, other, kv.Session)
		assert.Equal(t, other, res[4].out[0].Session)
	}

	// Nothing of the member that failed was applied; the others were.
	kv, _, err = s.Client().KV().Get("r/b", nil)
	require.NoError(t, err)
	assert.Nil(t, kv, "r/b was written by a member that failed")
	for key, val := range map[string]string{"r/a": "A", "r/c": "C"} {
		kv, _, err = s.Client().KV().Get(key, nil)
		require.NoError(t, err)
		require.NotNil(t, kv, key)
		assert.Equal(t, val, string(kv.Value))
	}

	// The batch (rolled back); 2 and 4 alone; the batch of 0 and 3 (or,
	// when 4 won the race, that batch rolled back and 0 again): four or
	// five calls.
	calls := s.OpCounts()["kv_txn_write"] - before["kv_txn_write"]
	assert.GreaterOrEqual(t, calls, uint64(4))
	assert.LessOrEqual(t, calls, uint64(5))
}

// TestTxnBatchContention runs many writers through one slot, on keys of
// their own and on one key they all contend for, under -race: each gets
// the entries of its own ops, and a lock a caller was told it holds is
// still its own to unlock (a result given to the wrong caller, or a
// member applied twice, would break one or the other).
func TestTxnBatchContention(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	ctx := t.Context()
	const writers, rounds = 24, 15
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wins int
	for w := range writers {
		sess := session(t, s, broker.SessionSpec{Name: fmt.Sprint("w", w)})
		wg.Go(func() {
			own := fmt.Sprintf("c/own/%d", w)
			for r := range rounds {
				val := []byte(fmt.Sprint(w, "/", r))
				out, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: own, Value: val, Session: sess}, {Verb: broker.OpGet, Key: own}})
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, own, out[0].Key)
				assert.Equal(t, val, out[1].Value, "writer %d round %d read another's value", w, r)
				_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: own, Session: sess}})
				assert.NoError(t, err)

				out, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "c/shared", Value: val, Session: sess}})
				if err != nil {
					var te *broker.TxnError
					if assert.ErrorAs(t, err, &te) {
						assert.Equal(t, []broker.TxnFailure{{Op: 0, Kind: broker.TxnLockHeld}}, te.Failures)
					}
					continue
				}
				assert.Equal(t, sess, out[0].Session)
				mu.Lock()
				wins++
				mu.Unlock()
				_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: "c/shared", Session: sess}})
				assert.NoError(t, err, "writer %d was told it held c/shared, and could not unlock it", w)
			}
		})
	}
	wg.Wait()
	batches, txns := s.TxnBatches()
	t.Logf("%d transactions, %d wins on the shared key; %d batch calls carried %d transactions (one sent again after a roll-back counts again)",
		writers*rounds*3+wins, wins, batches, txns)
	assert.Positive(t, wins)
	assert.Positive(t, batches, "24 writers through one slot never waited")
}

// TestTxnBatchRefusedIsSentMemberByMember proves that a batch Consul
// refuses before applying anything (here: larger than the agent's
// txn_max_req_len, which Consul takes as the larger of it and
// kv_max_value_size) is sent again member by member, each of which fits.
func TestTxnBatchRefusedIsSentMemberByMember(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t, consultest.WithHCL(`limits { txn_max_req_len = 4096, kv_max_value_size = 2048 }`))
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	val := []byte(strings.Repeat("v", 1500))

	release := holdSlots(t, s)
	before := s.OpCounts()
	var ops [][]broker.Op
	for i := range 4 {
		ops = append(ops, []broker.Op{{Verb: broker.OpSet, Key: fmt.Sprint("big/", i), Value: val}})
	}
	wait := startTxns(t, s, ops...)
	release()
	for i, r := range wait() {
		require.NoError(t, r.err, "member %d", i)
		assert.Equal(t, fmt.Sprint("big/", i), r.out[0].Key)
	}
	assert.Equal(t, before["kv_txn_write"]+5, s.OpCounts()["kv_txn_write"], "the refused batch and each member alone")
	keys, _, err := s.Client().KV().Keys("big/", "", nil)
	require.NoError(t, err)
	assert.Len(t, keys, 4)
}

// TestTxnBatchNoAnswer proves that members of a batch that gets no answer
// (the agent is gone) each fail StoreUnavailable, as a call of their own
// would.
func TestTxnBatchNoAnswer(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	release := holdSlots(t, s)
	wait := startTxns(t, s,
		[]broker.Op{{Verb: broker.OpSet, Key: "n/a"}},
		[]broker.Op{{Verb: broker.OpSet, Key: "n/b"}},
	)
	agent.Stop()
	release()
	for _, r := range wait() {
		requireStoreError(t, r.err, broker.StoreUnavailable, "kv txn")
	}
}

// TestTxnBatchCallerLeaves proves that a caller whose context ends while
// its write waits gets its context's error at once and that its write is
// never sent; one that leaves after its batch was sent gets its error too.
func TestTxnBatchCallerLeaves(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxTxnInFlight: 1})
	release := holdSlots(t, s)

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpSet, Key: "l/gone"}})
		errc <- err
	}()
	queued(t, s, 1)
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller still waits after its context ended")
	}
	queued(t, s, 0)

	before := s.OpCounts()
	wait := startTxns(t, s, []broker.Op{{Verb: broker.OpSet, Key: "l/stays"}})
	release()
	require.NoError(t, wait()[0].err)
	assert.Equal(t, before["kv_txn_write"]+1, s.OpCounts()["kv_txn_write"], "the write that left was not sent")
	kv, _, err := s.Client().KV().Get("l/gone", nil)
	require.NoError(t, err)
	assert.Nil(t, kv)

	// A deadline of the Store's own (CallTimeout) is StoreUnavailable.
	short := open(t, agent, Options{MaxTxnInFlight: 1, CallTimeout: 200 * time.Millisecond})
	holdSlots(t, short)
	start := time.Now()
	_, err = short.Txn(t.Context(), []broker.Op{{Verb: broker.OpSet, Key: "l/late"}})
	requireStoreError(t, err, broker.StoreUnavailable, "kv txn")
	assert.Less(t, time.Since(start), 2*time.Second)
}

// Issue 41 (suspicion: the batcher sends a member again after its caller
// left): a member whose caller stopped waiting while its batch was in
// flight, and whose batch Consul rolled back for another member's sake,
// is not sent again. Its caller was told the outcome is unknown and may
// have read the key since (the broker's settle does, to undo a grant it
// no longer waited for); a write committed after that read would leave a
// key held that nobody knows of. Before, it was sent again and committed.
func TestTxnBatchMemberNotResentAfterCallerLeft(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	gate := make(chan struct{})
	var armed atomic.Bool
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if r.URL.Path == "/v1/txn" && armed.CompareAndSwap(true, false) {
			<-gate // the batch waits until its caller has left
		}
		next.ServeHTTP(w, r)
	})
	s := openConfig(t, cfg, Options{MaxTxnInFlight: 1})
	holder := session(t, s, broker.SessionSpec{Name: "holder"})
	mine := session(t, s, broker.SessionSpec{Name: "mine"})
	_, err := s.Txn(t.Context(), []broker.Op{{Verb: broker.OpLock, Key: "left/held", Session: holder}})
	require.NoError(t, err)
	armed.Store(true)

	release := holdSlots(t, s)
	failing := make(chan error, 1)
	go func() {
		_, err := s.Txn(t.Context(), []broker.Op{{Verb: broker.OpLock, Key: "left/held", Session: mine}})
		failing <- err
	}()
	queued(t, s, 1)
	ctx, cancel := context.WithCancel(t.Context())
	leaving := make(chan error, 1)
	go func() {
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "left/grant", Session: mine}})
		leaving <- err
	}()
	queued(t, s, 2)
	release() // the batch of both goes, and waits at the gate
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.queue) == 0
	}, 5*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-leaving:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller still waits after its context ended")
	}
	close(gate)
	select {
	case err := <-failing:
		requireTxnError(t, err, broker.TxnFailure{Op: 0, Kind: broker.TxnLockHeld})
	case <-time.After(5 * time.Second):
		t.Fatal("the failing member got no answer")
	}
	// The batch's slot is free once it settled every member.
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return s.batch.inflight == 0
	}, 5*time.Second, time.Millisecond)
	kv, _, err := s.Client().KV().Get("left/grant", nil)
	require.NoError(t, err)
	if kv != nil {
		assert.Empty(t, kv.Session, "the member whose caller left was sent again and committed")
	}
}

// TestSettleResultsFiltered proves the mapping of an applied batch's
// results when Consul filtered some by ACLs: each op's result is matched by
// key, and the member missing one gets StorePermissionDenied from
// call.results, the others their entries.
func TestSettleResultsFiltered(t *testing.T) {
	t.Parallel()
	mk := func(ops ...broker.Op) *member { return &member{ops: ops, done: make(chan struct{})} }
	batch := []*member{
		mk(broker.Op{Verb: broker.OpSet, Key: "f/a"}, broker.Op{Verb: broker.OpDelete, Key: "f/x"}),
		mk(broker.Op{Verb: broker.OpGet, Key: "f/secret"}),
		mk(broker.Op{Verb: broker.OpLock, Key: "f/b"}, broker.Op{Verb: broker.OpGet, Key: "f/b"}),
	}
	res := []struct{ KV *txnKV }{{&txnKV{Key: "f/a"}}, {&txnKV{Key: "f/b", LockIndex: 1}}, {&txnKV{Key: "f/b", Value: []byte("v")}}}
	settleResults(batch, res)
	s := &Store{}
	c := &call{s: s, op: opKVTxnWrite}
	for _, m := range batch {
		<-m.done
		require.True(t, m.ok)
	}
	out, err := c.results(batch[0].ops, batch[0].a)
	require.NoError(t, err)
	assert.Equal(t, "f/a", out[0].Key)
	assert.Nil(t, out[1])
	_, err = c.results(batch[1].ops, batch[1].a)
	requireStoreError(t, err, broker.StorePermissionDenied, "kv txn")
	out, err = c.results(batch[2].ops, batch[2].a)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), out[0].LockIndex)
	assert.Equal(t, []byte("v"), out[1].Value)
}
