package consulstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// session creates a session through s for the test.
func session(t *testing.T, s *Store, spec broker.SessionSpec) string {
	t.Helper()
	if spec.TTL == 0 {
		spec.TTL = 30 * time.Second
	}
	id, err := s.CreateSession(t.Context(), spec)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	return id
}

// set writes key=val and returns its ModifyIndex.
func set(t *testing.T, s *Store, key, val string) uint64 {
	t.Helper()
	out, err := s.Txn(t.Context(), []broker.Op{{Verb: broker.OpSet, Key: key, Value: []byte(val)}})
	require.NoError(t, err)
	require.Len(t, out, 1)
	return out[0].ModifyIndex
}

// requireTxnError asserts that err is a *broker.TxnError with exactly want.
func requireTxnError(t *testing.T, err error, want ...broker.TxnFailure) {
	t.Helper()
	var te *broker.TxnError
	require.ErrorAs(t, err, &te, "want a rolled-back transaction, got %v", err)
	assert.ElementsMatch(t, want, te.Failures)
}

// TestTxnFailureKinds proves that every way a transaction op fails in real
// Consul is classified by op index into the contract's kind.
func TestTxnFailureKinds(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	idx := set(t, s, "k/existing", "v")
	holder := session(t, s, broker.SessionSpec{Name: "holder"})
	other := session(t, s, broker.SessionSpec{Name: "other"})
	_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "k/held", Session: holder}})
	require.NoError(t, err)

	// A destroyed session that held a key leaves the key in lock-delay.
	delayed := session(t, s, broker.SessionSpec{Name: "delayed", LockDelay: time.Minute})
	_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "k/delayed", Session: delayed}})
	require.NoError(t, err)
	require.NoError(t, s.DestroySession(ctx, delayed))

	const unknownSession = "3f1c7a52-0000-4000-8000-000000000000"
	// A key whose name contains every phrase Consul's messages use: only
	// the exact message for the op's verb and key may classify a failure.
	const tricky = `k/"exists" lock is already held, index is stale doesn't exist`
	set(t, s, tricky, "v")

	tests := []struct {
		name string
		ops  []broker.Op
		want []broker.TxnFailure
	}{
		{"check-index stale", []broker.Op{
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
			{Verb: broker.OpCheckIndex, Key: "k/existing", Index: idx + 1000},
		}, []broker.TxnFailure{{Op: 1, Kind: broker.TxnCheckFailed}}},
		{"check-index missing key", []broker.Op{
			{Verb: broker.OpCheckIndex, Key: "k/missing", Index: 1},
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"check-not-exists on existing key", []broker.Op{
			{Verb: broker.OpCheckNotExists, Key: "k/existing"},
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"check-session mismatch", []broker.Op{
			{Verb: broker.OpCheckSession, Key: "k/held", Session: other},
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"lock held by another session", []broker.Op{
			{Verb: broker.OpLock, Key: "k/held", Session: other},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnLockHeld}}},
		{"lock with invalid session", []broker.Op{
			{Verb: broker.OpLock, Key: "k/free", Session: unknownSession},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnSessionInvalid}}},
		{"lock without session", []broker.Op{
			{Verb: broker.OpLock, Key: "k/free"},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnSessionInvalid}}},
		{"lock refused by lock-delay", []broker.Op{
			{Verb: broker.OpLock, Key: "k/delayed", Session: other},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnLockDelay}}},
		{"unlock not held", []broker.Op{
			{Verb: broker.OpUnlock, Key: "k/held", Session: other},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnNotHeld}}},
		{"unlock missing key", []broker.Op{
			{Verb: broker.OpUnlock, Key: "k/missing", Session: other},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnNotHeld}}},
		{"cas stale", []broker.Op{
			{Verb: broker.OpCAS, Key: "k/existing", Value: []byte("2"), Index: idx + 1000},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"cas create on existing key", []broker.Op{
			{Verb: broker.OpCAS, Key: "k/existing", Value: []byte("2"), Index: 0},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"delete-cas stale", []broker.Op{
			{Verb: broker.OpDeleteCAS, Key: "k/existing", Index: idx + 1000},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"get missing key in a write", []broker.Op{
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
			{Verb: broker.OpGet, Key: "k/missing"},
		}, []broker.TxnFailure{{Op: 1, Kind: broker.TxnCheckFailed}}},
		{"a write lists each failing op", []broker.Op{
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
			{Verb: broker.OpLock, Key: "k/held", Session: other},
			{Verb: broker.OpCheckNotExists, Key: "k/existing"},
		}, []broker.TxnFailure{{Op: 1, Kind: broker.TxnLockHeld}, {Op: 2, Kind: broker.TxnCheckFailed}}},
		{"lock-delay and ACL pre-checks list each failing op", []broker.Op{
			{Verb: broker.OpLock, Key: "k/delayed", Session: other},
			{Verb: broker.OpLock, Key: "k/held", Session: other},
			{Verb: broker.OpLock, Key: "k/delayed", Session: holder},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnLockDelay}, {Op: 2, Kind: broker.TxnLockDelay}}},
		{"tricky key, check-index stale", []broker.Op{
			{Verb: broker.OpCheckIndex, Key: tricky, Index: 1},
			{Verb: broker.OpSet, Key: "k/x", Value: []byte("1")},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnCheckFailed}}},
		{"tricky key, lock by an invalid session", []broker.Op{
			{Verb: broker.OpLock, Key: tricky, Session: unknownSession},
		}, []broker.TxnFailure{{Op: 0, Kind: broker.TxnSessionInvalid}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.OpCounts()["kv_txn_write"]
			out, err := s.Txn(ctx, tt.ops)
			assert.Nil(t, out)
			requireTxnError(t, err, tt.want...)
			assert.Equal(t, before+1, s.OpCounts()["kv_txn_write"], "one Consul call")
		})
	}

	// Nothing any failing transaction did was applied.
	entries, _, err := s.List(ctx, "k/x", true)
	require.NoError(t, err)
	assert.Empty(t, entries, "rolled-back writes are not applied")
}

// TestTxnReadOnlyListsEveryFailure proves that a transaction of only get
// and check verbs is served as a read and reports every failing op.
func TestTxnReadOnlyListsEveryFailure(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	idx := set(t, s, "r/a", "A")
	set(t, s, "r/b", "B")
	sess := session(t, s, broker.SessionSpec{Name: "r"})
	_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "r/locked", Session: sess}})
	require.NoError(t, err)

	before := s.OpCounts()
	_, err = s.Txn(ctx, []broker.Op{
		{Verb: broker.OpCheckIndex, Key: "r/a", Index: idx + 1000},                 // 0: stale
		{Verb: broker.OpGet, Key: "r/b"},                                           // 1: fine
		{Verb: broker.OpCheckNotExists, Key: "r/b"},                                // 2: exists
		{Verb: broker.OpGet, Key: "r/missing"},                                     // 3: missing
		{Verb: broker.OpCheckSession, Key: "r/locked", Session: ""},                // 4: mismatch
		{Verb: broker.OpCheckIndex, Key: "r/a", Index: idx},                        // 5: fine
		{Verb: broker.OpCheckSession, Key: "r/missing", Session: sess},             // 6: missing
		{Verb: broker.OpCheckNotExists, Key: "r/missing"},                          // 7: fine
		{Verb: broker.OpCheckSession, Key: "r/locked", Session: sess},              // 8: fine
		{Verb: broker.OpCheckIndex, Key: "r/missing", Index: 1},                    // 9: missing
		{Verb: broker.OpCheckSession, Key: "r/b", Session: sess},                   // 10: no session
		{Verb: broker.OpCheckNotExists, Key: "r/locked"},                           // 11: exists
		{Verb: broker.OpGet, Key: "r/a"},                                           // 12: fine
		{Verb: broker.OpCheckIndex, Key: "r/locked", Index: 0},                     // 13: stale
		{Verb: broker.OpCheckNotExists, Key: "r/a"},                                // 14: exists
		{Verb: broker.OpCheckSession, Key: "r/locked", Session: "not-" + sess[4:]}, // 15: mismatch
	})
	var want []broker.TxnFailure
	for _, op := range []int{0, 2, 3, 4, 6, 9, 10, 11, 13, 14, 15} {
		want = append(want, broker.TxnFailure{Op: op, Kind: broker.TxnCheckFailed})
	}
	requireTxnError(t, err, want...)
	after := s.OpCounts()
	assert.Equal(t, before["kv_txn_read"]+1, after["kv_txn_read"], "counted as a read")
	assert.Equal(t, before["kv_txn_write"], after["kv_txn_write"])
}

// TestTxnResultSlots proves the one-slot-per-op mapping for every verb
// against real Consul: an entry (with its value only for get) for lock,
// unlock, set, cas, get, check-index and check-session; nil for
// check-not-exists, delete and delete-cas.
func TestTxnResultSlots(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	idxC := set(t, s, "s/c", "C")
	idxD := set(t, s, "s/d", "D")
	set(t, s, "s/e", "E")
	idxF := set(t, s, "s/f", "F")
	sess := session(t, s, broker.SessionSpec{Name: "slots"})

	ops := []broker.Op{
		{Verb: broker.OpSet, Key: "s/a", Value: []byte("A"), Flags: 7},                 // 0
		{Verb: broker.OpCheckNotExists, Key: "s/new"},                                  // 1
		{Verb: broker.OpLock, Key: "s/b", Value: []byte("B"), Session: sess, Flags: 9}, // 2
		{Verb: broker.OpCheckSession, Key: "s/b", Session: sess},                       // 3
		{Verb: broker.OpCAS, Key: "s/c", Value: []byte("C2"), Index: idxC},             // 4
		{Verb: broker.OpDeleteCAS, Key: "s/d", Index: idxD},                            // 5
		{Verb: broker.OpDelete, Key: "s/e"},                                            // 6
		{Verb: broker.OpGet, Key: "s/b"},                                               // 7
		{Verb: broker.OpUnlock, Key: "s/b", Session: sess},                             // 8
		{Verb: broker.OpCheckIndex, Key: "s/f", Index: idxF},                           // 9
		{Verb: broker.OpCAS, Key: "s/new", Value: []byte("N"), Index: 0},               // 10
	}
	out, err := s.Txn(ctx, ops)
	require.NoError(t, err)
	require.Len(t, out, len(ops))
	for _, i := range []int{1, 5, 6} {
		assert.Nil(t, out[i], "op %d (%s) has no result", i, ops[i].Verb)
	}
	for _, i := range []int{0, 2, 3, 4, 7, 8, 9, 10} {
		if assert.NotNil(t, out[i], "op %d (%s) has a result", i, ops[i].Verb) {
			assert.Equal(t, ops[i].Key, out[i].Key, "op %d", i)
		}
	}
	// Every entry this transaction wrote carries its Raft index.
	txnIndex := out[0].ModifyIndex
	assert.Greater(t, txnIndex, idxF)
	for _, i := range []int{2, 3, 4, 7, 8, 10} {
		assert.Equal(t, txnIndex, out[i].ModifyIndex, "op %d", i)
	}
	assert.Equal(t, idxF, out[9].ModifyIndex, "check-index returns the entry it checked")
	assert.Equal(t, []byte("B"), out[7].Value, "get returns the value")
	for _, i := range []int{0, 2, 3, 4, 8, 9, 10} {
		assert.Empty(t, out[i].Value, "op %d (%s) returns no value", i, ops[i].Verb)
	}
	assert.Equal(t, uint64(7), out[0].Flags)
	assert.Equal(t, uint64(9), out[2].Flags)
	assert.Equal(t, sess, out[2].Session)
	assert.Equal(t, uint64(1), out[2].LockIndex)
	assert.Equal(t, sess, out[3].Session)
	assert.Empty(t, out[8].Session, "unlocked")

	// A read-only transaction maps its slots the same way.
	out, err = s.Txn(ctx, []broker.Op{
		{Verb: broker.OpCheckNotExists, Key: "s/none"},
		{Verb: broker.OpGet, Key: "s/a"},
		{Verb: broker.OpCheckIndex, Key: "s/a", Index: txnIndex},
		{Verb: broker.OpCheckSession, Key: "s/a", Session: ""},
	})
	require.NoError(t, err)
	require.Len(t, out, 4)
	assert.Nil(t, out[0])
	if assert.NotNil(t, out[1]) && assert.NotNil(t, out[2]) && assert.NotNil(t, out[3]) {
		assert.Equal(t, []byte("A"), out[1].Value)
		assert.Empty(t, out[2].Value)
		assert.Equal(t, "s/a", out[3].Key)
	}
}

// TestCheck proves that Check, on the hand path and through api.Txn, passes
// when every check passes, names every failing op of a batch that does not,
// writes nothing, is counted as a read, and refuses an op that is not a
// check before any call.
func TestCheck(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{})
	ctx := t.Context()

	idx := set(t, s, "c/a", "A")
	sess := session(t, s, broker.SessionSpec{Name: "c"})
	_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "c/locked", Session: sess}})
	require.NoError(t, err)

	pass := []broker.Op{
		{Verb: broker.OpCheckIndex, Key: "c/a", Index: idx},
		{Verb: broker.OpCheckNotExists, Key: "c/missing"},
		{Verb: broker.OpCheckSession, Key: "c/locked", Session: sess},
	}
	failing := []broker.Op{
		{Verb: broker.OpCheckIndex, Key: "c/a", Index: idx},           // 0: fine
		{Verb: broker.OpCheckIndex, Key: "c/a", Index: idx + 1},       // 1: stale
		{Verb: broker.OpCheckNotExists, Key: "c/a"},                   // 2: exists
		{Verb: broker.OpCheckSession, Key: "c/locked", Session: sess}, // 3: fine
		{Verb: broker.OpCheckSession, Key: "c/a", Session: sess},      // 4: no session
	}
	for _, tt := range []struct {
		name string
		s    *Store
	}{{"hand", s}, {"api", New(s.Client(), 0)}} {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.s.OpCounts()
			require.NoError(t, tt.s.Check(ctx, pass))
			requireTxnError(t, tt.s.Check(ctx, failing),
				broker.TxnFailure{Op: 1, Kind: broker.TxnCheckFailed},
				broker.TxnFailure{Op: 2, Kind: broker.TxnCheckFailed},
				broker.TxnFailure{Op: 4, Kind: broker.TxnCheckFailed})
			after := tt.s.OpCounts()
			assert.Equal(t, before["kv_txn_read"]+2, after["kv_txn_read"], "each Check is one read")
			assert.Equal(t, before["kv_txn_write"], after["kv_txn_write"])

			err := tt.s.Check(ctx, append(pass[:1:1], broker.Op{Verb: broker.OpGet, Key: "c/a"}))
			requireStoreError(t, err, broker.StoreRejected, "kv txn")
			assert.ErrorContains(t, err, `operation 1: "get" is not a check`)
			require.NoError(t, tt.s.Check(ctx, nil))
			assert.Equal(t, after, tt.s.OpCounts(), "no call for a refused or empty Check")
		})
	}
	// Nothing was written: the entries are as they were.
	entries, _, err := s.List(ctx, "c/", true)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, idx, entries[0].ModifyIndex)
}

// TestTxnRejectedWithoutCall proves that a transaction Consul would refuse
// for its size or verb fails as StoreRejected before any call.
func TestTxnRejectedWithoutCall(t *testing.T) {
	t.Parallel()
	// No agent at all: a call would fail as unavailable, not rejected.
	s, err := Open(unreachableConfig(t), Options{})
	require.NoError(t, err)
	defer s.Close()

	tooMany := make([]broker.Op, broker.MaxTxnOps+1)
	for i := range tooMany {
		tooMany[i] = broker.Op{Verb: broker.OpGet, Key: "k"}
	}
	tests := []struct {
		name string
		ops  []broker.Op
	}{
		{"more than MaxTxnOps", tooMany},
		{"unknown verb", []broker.Op{{Verb: "delete-tree", Key: "k"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Txn(context.Background(), tt.ops)
			requireStoreError(t, err, broker.StoreRejected, "kv txn")
		})
	}
	for op, n := range s.OpCounts() {
		assert.Zero(t, n, "no %s call", op)
	}
	out, err := s.Txn(context.Background(), nil)
	require.NoError(t, err)
	assert.Empty(t, out)
}

// TestFailureKindExactMessages checks the classifier on Consul's messages
// for keys that quote or contain the phrases of other messages.
func TestFailureKindExactMessages(t *testing.T) {
	t.Parallel()
	const key = `a "b" exists, lock is already held`
	tests := []struct {
		name string
		op   broker.Op
		what string
		want broker.TxnFailureKind
	}{
		{"lock held", broker.Op{Verb: broker.OpLock, Key: key}, `failed to lock key "a \"b\" exists, lock is already held", lock is already held`, broker.TxnLockHeld},
		{"lock of another key's message", broker.Op{Verb: broker.OpLock, Key: "x"}, `failed to lock key "y", lock is already held`, broker.TxnOther},
		{"lock delay", broker.Op{Verb: broker.OpLock, Key: key}, `failed to lock key "a \"b\" exists, lock is already held" due to lock delay`, broker.TxnLockDelay},
		{"invalid session", broker.Op{Verb: broker.OpLock, Key: key, Session: "s1"}, `invalid session "s1"`, broker.TxnSessionInvalid},
		{"session lookup failure", broker.Op{Verb: broker.OpLock, Key: key, Session: "s1"}, `failed session lookup: boom`, broker.TxnOther},
		{"check-not-exists", broker.Op{Verb: broker.OpCheckNotExists, Key: key}, `key "a \"b\" exists, lock is already held" exists`, broker.TxnCheckFailed},
		{"get message for a check-not-exists", broker.Op{Verb: broker.OpCheckNotExists, Key: key}, `key "a \"b\" exists, lock is already held" doesn't exist`, broker.TxnOther},
		{"check-index", broker.Op{Verb: broker.OpCheckIndex, Key: key}, `failed index check for key "a \"b\" exists, lock is already held", current modify index 5 != 4`, broker.TxnCheckFailed},
		{"unlock", broker.Op{Verb: broker.OpUnlock, Key: "u"}, `failed to unlock key "u", lock isn't held, or is held by another session`, broker.TxnNotHeld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, failureKind(tt.op, tt.what))
		})
	}
}
