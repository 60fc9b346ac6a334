package broker

import (
	"context"
	"errors"
	"fmt"
)

// errLockDelay: Consul refused the acquire because of a lock-delay.
var errLockDelay = errors.New("blocked by consul lock-delay")

// Sequencer identifies one grant.
type Sequencer struct {
	Key       string
	Session   string
	LockIndex uint64
	Token     uint64
	Kind      Kind
}

// tryLock makes one attempt to take the lock at key for session, based on
// st (the latest known state; nil if none). It returns the sequencer when
// granted, (nil, nil) when the lock is busy, errLockDelay, ErrConflict, or
// a store error. A lost race returns (nil, errRace) so the caller re-reads.
func (b *Broker) tryLock(ctx context.Context, key string, value []byte, session string, st *State) (*Sequencer, error) {
	var ops []Op
	switch {
	case st == nil || st.Kind == KindNone:
		// Optimistic: the key and a semaphore at it do not exist.
		ops = []Op{
			{Verb: OpCheckNotExists, Key: key},
			{Verb: OpCheckNotExists, Key: key + semLockSuffix},
		}
	case st.Kind == KindForeign:
		return nil, fmt.Errorf("%w: key %q holds flags %#x, not a lock's (%#x)", ErrConflict, key, st.lock.Flags, LockFlagValue)
	case st.Kind == KindSemaphore:
		return nil, fmt.Errorf("%w: key %q is a semaphore prefix (limit %d); acquire it with that limit", ErrConflict, key, st.Limit)
	case len(st.Holders) > 0:
		return nil, nil
	default: // a free lock key
		ops = []Op{{Verb: OpCheckIndex, Key: key, Index: st.lock.ModifyIndex}}
		if st.semLock == nil {
			ops = append(ops, Op{Verb: OpCheckNotExists, Key: key + semLockSuffix})
		}
	}
	ops = append(ops, Op{Verb: OpLock, Key: key, Value: value, Flags: LockFlagValue, Session: session})
	res, err := b.store.Txn(ctx, ops)
	if te := asTxnError(err); te != nil {
		if te.Has(TxnLockDelay) {
			return nil, errLockDelay
		}
		return nil, errRace
	}
	if err != nil {
		return nil, err
	}
	e := res[len(res)-1]
	if e == nil {
		return nil, fmt.Errorf("consul returned no entry for the lock of %q", key)
	}
	return &Sequencer{Key: key, Session: session, LockIndex: e.LockIndex, Token: e.ModifyIndex, Kind: KindLock}, nil
}

// errRace: a check of the transaction failed; the state changed under us.
var errRace = errors.New("state changed during the attempt")

// lockLoss says whether st shows the lock hold seq lost, and why.
func lockLoss(st *State, seq *Sequencer) (lost bool, gone bool, detail string) {
	switch {
	case st.Kind == KindNone:
		return true, true, "the lock key was deleted"
	case st.Kind != KindLock:
		return true, true, "the lock key was overwritten by another writer"
	case len(st.Holders) == 0:
		return true, false, "the lock key was released"
	case st.Holders[0].Session != seq.Session || st.Holders[0].LockIndex != seq.LockIndex:
		return true, false, fmt.Sprintf("the lock is now held by session %s", st.Holders[0].Session)
	}
	return false, false, ""
}

// unlockOps releases the lock at key held by session. With del (a session
// with DELETE behavior) the key is deleted instead, as Consul would do when
// the session ends; neither triggers a lock-delay.
func unlockOps(key, session string, value []byte, del bool) []Op {
	if del {
		return []Op{
			{Verb: OpCheckSession, Key: key, Session: session},
			{Verb: OpDelete, Key: key},
		}
	}
	return []Op{
		{Verb: OpCheckSession, Key: key, Session: session},
		{Verb: OpUnlock, Key: key, Value: value, Flags: LockFlagValue, Session: session},
	}
}
