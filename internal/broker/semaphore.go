package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

func contenderKey(prefix, session string) string { return prefix + "/" + session }

// errNoContender: the state does not show this session's contender entry.
var errNoContender = errors.New("contender entry missing")

// enterSemaphore writes this session's contender entry under prefix.
func (b *Broker) enterSemaphore(ctx context.Context, prefix, session string, value []byte) error {
	_, err := b.store.Txn(ctx, []Op{{Verb: OpLock, Key: contenderKey(prefix, session), Value: value, Flags: SemaphoreFlagValue, Session: session}})
	if te := asTxnError(err); te != nil {
		return fmt.Errorf("%w: cannot write contender entry %q", ErrConflict, contenderKey(prefix, session))
	}
	return err
}

// semaphoreConflict says why st cannot be used as a semaphore with limit.
func semaphoreConflict(st *State, limit uint32) error {
	switch {
	case st.lock != nil && st.lock.Flags == LockFlagValue:
		return fmt.Errorf("%w: %q is a lock key; acquire it with limit 0 or 1", ErrConflict, st.Key)
	case st.semLock != nil && st.semLock.Flags != SemaphoreFlagValue:
		return fmt.Errorf("%w: %q holds flags %#x, not a semaphore's (%#x)", ErrConflict, st.semLock.Key, st.semLock.Flags, SemaphoreFlagValue)
	case st.semErr != nil:
		return st.semErr
	case st.sem != nil && uint32(st.sem.Limit) != limit:
		return fmt.Errorf("%w: semaphore %q has limit %d, requested limit %d", ErrConflict, st.Key, st.sem.Limit, limit)
	}
	return nil
}

// trySemaphore makes one attempt to admit session to the semaphore at
// prefix, on state st (which must include the session's contender entry).
// It returns the sequencer when admitted, (nil, nil) when full (or, with
// fair, when older waiters go first), errRace, ErrConflict, or a store
// error.
func (b *Broker) trySemaphore(ctx context.Context, prefix string, limit uint32, session string, st *State, fair bool) (*Sequencer, error) {
	if err := semaphoreConflict(st, limit); err != nil {
		return nil, err
	}
	me, ok := st.contenders[session]
	if !ok {
		return nil, errNoContender // not in this state yet, or removed
	}
	holders := map[string]bool{}
	for _, h := range st.Holders { // already pruned to live contenders
		holders[h.Session] = true
	}
	if holders[session] {
		return &Sequencer{Key: prefix, Session: session, LockIndex: me.LockIndex, Token: st.semLock.ModifyIndex, Kind: KindSemaphore}, nil
	}
	free := int(limit) - len(holders)
	if free <= 0 {
		return nil, nil
	}
	if fair && waitRank(st, holders, session) >= free {
		return nil, nil
	}
	holders[session] = true
	body, err := json.Marshal(semBody{Limit: int(limit), Holders: holders})
	if err != nil {
		return nil, err
	}
	ops := []Op{{Verb: OpCheckSession, Key: me.Key, Session: session}}
	lockKey := prefix + semLockSuffix
	if st.semLock == nil {
		ops = append(ops, Op{Verb: OpCAS, Key: lockKey, Value: body, Flags: SemaphoreFlagValue, Index: 0})
		if st.lock == nil {
			ops = append(ops, Op{Verb: OpCheckNotExists, Key: prefix})
		}
	} else {
		ops = append(ops, Op{Verb: OpCAS, Key: lockKey, Value: body, Flags: SemaphoreFlagValue, Index: st.semLock.ModifyIndex})
	}
	res, err := b.store.Txn(ctx, ops)
	var te *TxnError
	if errors.As(err, &te) {
		return nil, errRace
	}
	if err != nil {
		return nil, err
	}
	if res[1] == nil {
		return nil, fmt.Errorf("consul returned no entry for %q", lockKey)
	}
	return &Sequencer{Key: prefix, Session: session, LockIndex: me.LockIndex, Token: res[1].ModifyIndex, Kind: KindSemaphore}, nil
}

// waitRank is session's place among the live contenders that do not hold
// a slot, oldest (lowest CreateIndex) first.
func waitRank(st *State, holders map[string]bool, session string) int {
	type w struct {
		sid string
		ci  uint64
	}
	var ws []w
	for sid, e := range st.contenders {
		if !holders[sid] {
			ws = append(ws, w{sid, e.CreateIndex})
		}
	}
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].ci != ws[j].ci {
			return ws[i].ci < ws[j].ci
		}
		return ws[i].sid < ws[j].sid
	})
	for i, x := range ws {
		if x.sid == session {
			return i
		}
	}
	return len(ws)
}

// semaphoreLoss says whether st shows the semaphore hold seq lost.
func semaphoreLoss(st *State, seq *Sequencer, limit uint32) (lost bool, reason LostReason, detail string) {
	if st.Kind != KindSemaphore || st.semErr != nil || (st.sem != nil && uint32(st.sem.Limit) != limit) {
		return true, LostLimitConflict, fmt.Sprintf("the semaphore's .lock no longer agrees with limit %d", limit)
	}
	if _, ok := st.contenders[seq.Session]; !ok {
		return true, LostDeletedByOther, "the contender entry was deleted or released"
	}
	if !st.sem.Holders[seq.Session] {
		return true, LostReleasedByOther, "this holder was removed from the semaphore's holders"
	}
	return false, 0, ""
}

// leaveSemaphore removes session from the holders of the semaphore at
// prefix (check-and-set, retried on races) and deletes its contender
// entry, in one transaction, with extra ops appended.
func (b *Broker) leaveSemaphore(ctx context.Context, prefix, session string, extra []Op) (bool, error) {
	for range 50 {
		entries, idx, err := b.store.List(ctx, prefix, true)
		if err != nil {
			return false, err
		}
		st := deriveState(prefix, entries, idx)
		ops := []Op{}
		held := st.sem != nil && st.sem.Holders[session]
		if held {
			delete(st.sem.Holders, session)
			body, err := json.Marshal(st.sem)
			if err != nil {
				return false, err
			}
			ops = append(ops, Op{Verb: OpCAS, Key: prefix + semLockSuffix, Value: body, Flags: SemaphoreFlagValue, Index: st.semLock.ModifyIndex})
		}
		if c, ok := findEntry(entries, contenderKey(prefix, session)); ok {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
		}
		if len(ops) == 0 {
			return false, nil
		}
		ops = append(ops, extra...)
		_, err = b.store.Txn(ctx, ops)
		var te *TxnError
		if errors.As(err, &te) {
			continue
		}
		return held, err
	}
	return false, fmt.Errorf("%w: too many check-and-set races leaving semaphore %q", ErrUnavailable, prefix)
}

func findEntry(entries []*Entry, key string) (*Entry, bool) {
	for _, e := range entries {
		if e.Key == key {
			return e, true
		}
	}
	return nil, false
}
