package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A live record is rewritten with one check-and-set that keeps its
// session, and that check-and-set fails once the record moved or its
// session ended; an unlock alone refuses a key its session does not hold.
// These are what the grant, release and hand-off transactions rest on
// since they dropped the record's separate guard and the unlock's session
// check.
func TestRecordWriteAndUnlock(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get := func(key string) *broker.Entry {
		t.Helper()
		es, _, err := store.List(ctx, key, true)
		require.NoError(t, err)
		return broker.FindEntry(es, key)
	}
	failedWith := func(err error, kind broker.TxnFailureKind) bool {
		var te *broker.TxnError
		return errors.As(err, &te) && te.Has(kind)
	}
	for _, del := range []bool{false, true} {
		s, err := store.CreateSession(ctx, broker.SessionSpec{TTL: 10 * time.Second, Delete: del})
		require.NoError(t, err)
		rk := broker.RecordKey(s)

		// First write: a guard and a lock.
		ops := broker.RecordWriteOps(s, nil)
		require.Len(t, ops, 2)
		res, err := store.Txn(ctx, ops)
		require.NoError(t, err)
		first := get(rk)
		require.NotNil(t, first)
		assert.Equal(t, s, first.Session)
		assert.Equal(t, first.ModifyIndex, broker.RecordWritten(ops, res, s))

		// Rewrite of the live record: one check-and-set, session kept.
		ops = broker.RecordWriteOps(s, first)
		require.Len(t, ops, 1)
		assert.Equal(t, broker.OpCAS, ops[0].Verb)
		res, err = store.Txn(ctx, ops)
		require.NoError(t, err)
		second := get(rk)
		require.NotNil(t, second)
		assert.Equal(t, s, second.Session, "the check-and-set keeps the record's session")
		assert.Greater(t, second.ModifyIndex, first.ModifyIndex)
		assert.Equal(t, second.ModifyIndex, broker.RecordWritten(ops, res, s))

		// A write on a stale record changes nothing.
		_, err = store.Txn(ctx, broker.RecordWriteOps(s, first))
		assert.True(t, failedWith(err, broker.TxnCheckFailed), "stale record: %v", err)
		assert.Equal(t, second.ModifyIndex, get(rk).ModifyIndex)

		// The session ends: a write built on the live record fails, and
		// one built on what is left (released or deleted) fails too.
		require.NoError(t, store.DestroySession(ctx, s))
		_, err = store.Txn(ctx, broker.RecordWriteOps(s, second))
		assert.True(t, failedWith(err, broker.TxnCheckFailed), "record of an ended session (delete=%v): %v", del, err)
		left := get(rk)
		if del {
			assert.Nil(t, left, "a DELETE session's record is gone")
		} else {
			require.NotNil(t, left)
			assert.Empty(t, left.Session)
		}
		_, err = store.Txn(ctx, broker.RecordWriteOps(s, left))
		assert.Error(t, err, "a record cannot be written for an ended session")
		if left != nil {
			assert.Equal(t, left.ModifyIndex, get(rk).ModifyIndex)
			_, _ = store.Txn(ctx, []broker.Op{{Verb: broker.OpDeleteCAS, Key: rk, Index: left.ModifyIndex}})
		} else {
			assert.Nil(t, get(rk))
		}
	}

	// Unlock without a session check: Consul's unlock itself refuses a key
	// the session does not hold.
	holder, err := store.CreateSession(ctx, broker.SessionSpec{TTL: 10 * time.Second})
	require.NoError(t, err)
	other, err := store.CreateSession(ctx, broker.SessionSpec{TTL: 10 * time.Second})
	require.NoError(t, err)
	defer func() {
		_ = store.DestroySession(context.Background(), holder)
		_ = store.DestroySession(context.Background(), other)
	}()
	const key = "record-test/lock"
	_, err = store.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: key, Value: []byte("v"), Flags: broker.LockFlagValue, Session: holder}})
	require.NoError(t, err)
	held := get(key)
	_, err = store.Txn(ctx, broker.UnlockOps(key, other))
	assert.True(t, failedWith(err, broker.TxnNotHeld), "unlock by another session: %v", err)
	assert.Equal(t, held.ModifyIndex, get(key).ModifyIndex, "the refused unlock changed nothing")
	assert.Equal(t, holder, get(key).Session)
	_, err = store.Txn(ctx, broker.UnlockOps(key, holder))
	require.NoError(t, err)
	assert.Empty(t, get(key).Session)
	_, err = store.Txn(ctx, broker.UnlockOps(key, holder))
	assert.True(t, failedWith(err, broker.TxnNotHeld), "unlock of a free key: %v", err)
	_, err = store.Txn(ctx, broker.UnlockOps("record-test/absent", holder))
	assert.True(t, failedWith(err, broker.TxnNotHeld), "unlock of an absent key: %v", err)
	_, _ = store.Txn(ctx, []broker.Op{{Verb: broker.OpDelete, Key: key}})
}
