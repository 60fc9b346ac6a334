package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
)

func contenderKey(prefix, session string) string { return prefix + "/" + session }

// errNoContender: the state does not show this session's contender entry
// (not in this state yet, or removed).
var errNoContender = errors.New("contender entry missing")

// enterSemaphore writes this session's contender entry. An entry the
// session already has (a client-owned session coming back) is released
// and acquired again in one transaction, which bumps its LockIndex: a
// slot granted now is never mistaken for an earlier grant to the session.
//
// A broker-owned session's record goes with the entry, naming the replica
// that owns the wait (Waiting), as a lock waiter's goes with its ticket
// (enqueue) and a read-write waiter's with its entry (enterRW): a wait
// moved to another replica is resumed in its place (resumeWait). No extra
// call: it rides on the transaction that enters the contender.
func (h *hold) enterSemaphore(ctx context.Context, st *State) (*Entry, error) {
	ck := contenderKey(h.spec.Key, h.session)
	var ops []Op
	if _, ok := st.contenders[h.session]; ok {
		ops = append(ops, Op{Verb: OpUnlock, Key: ck, Flags: SemaphoreFlagValue, Session: h.session})
	} else if c := st.child(h.session); c != nil {
		return nil, newError(ErrConflict, ReasonForeignFlags, "contender entry %q exists and is not this session's (flags %#x)", ck, c.Flags)
	}
	ops = append(ops, Op{Verb: OpLock, Key: ck, Value: h.spec.Value, Flags: SemaphoreFlagValue, Session: h.session})
	entryAt := len(ops) - 1
	for attempt := 0; ; attempt++ {
		all, recAt := ops, -1
		var next *record
		if h.owned {
			rec := h.record()
			next = rec.next()
			next.Waiting = h.spec.Key
			recAt = len(all)
			all = append(slices.Clip(all), rec.writeOps(next)...)
		}
		res, err := h.st.Txn(ctx, all)
		h.noteUnanswered(err, recAt)
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return nil, sessionError(ErrSessionNotFound, h.session)
			}
			if recAt >= 0 && te.Failed(recAt) && attempt == 0 {
				// The record moved (a pooled session's, known from
				// before): read it and try once more.
				if err := h.reloadRecord(ctx); err != nil {
					return nil, err
				}
				continue
			}
			return nil, newError(ErrAborted, ReasonSessionLost, "cannot write contender entry %q: it changed meanwhile", ck)
		}
		if err != nil {
			return nil, err
		}
		if next != nil {
			next.index, next.live = recordWritten(all, res, h.session), true
			h.setRecord(next)
		}
		return res[entryAt], nil
	}
}

// withContender is st with this session's contender entry e as written:
// the first attempt needs no second read.
func withContender(st *State, session string, e *Entry) *State {
	entries := make([]*Entry, 0, len(st.entries)+1)
	for _, x := range st.entries {
		if x.Key != e.Key {
			entries = append(entries, x)
		}
	}
	return deriveState(st.Key, under(st.Key, append(entries, e)), max(st.Index, e.ModifyIndex))
}

// semaphoreConflict says why st cannot be used as a semaphore with limit.
func semaphoreConflict(st *State, limit uint32) error {
	switch {
	case st.Kind == KindRWLock:
		return rwKindConflict(st, "a semaphore")
	case st.lock != nil && st.lock.Flags == LockFlagValue:
		return newError(ErrConflict, ReasonLimitConflict, "%q is a lock key; acquire it as a lock", st.Key).withState(st)
	case st.lock != nil:
		return newError(ErrConflict, ReasonForeignFlags, "%q holds flags %#x of neither recipe", st.Key, st.lock.Flags).withState(st)
	case st.semLock != nil && st.semLock.Flags != SemaphoreFlagValue:
		return newError(ErrConflict, ReasonForeignFlags, "%q holds flags %#x, not a semaphore's (%#x)", st.semLock.Key, st.semLock.Flags, SemaphoreFlagValue).withState(st)
	case st.semErr != nil:
		return newError(ErrConflict, ReasonMalformedSemaphore, "%v", st.semErr).withState(st)
	case st.sem != nil && uint32(st.sem.Limit) != limit:
		return newError(ErrConflict, ReasonLimitConflict, "semaphore %q has limit %d, requested limit %d", st.Key, st.sem.Limit, limit).withState(st)
	}
	return nil
}

// trySemaphore makes one attempt to admit the session on state st (which
// must show its contender entry). It returns the grant, (nil, nil) when
// full (or, with fair, when older waiters go first), errRace, or a final
// error. The admitting check-and-set of `.lock` and the session's record
// are one transaction: the token is its Raft index.
//
// The grant's LockIndex is the contender entry's as the transaction found
// it (its check-session answers with the entry), not as st shows it: a
// watch listing can lag the entry. A moved wait enters its entry again
// (enterSemaphore bumps the LockIndex); a listing from before that, which
// shows the slot free, passes every check of the grant, and its LockIndex
// would make the next listing look like the entry was taken away.
func (h *hold) trySemaphore(ctx context.Context, st *State, fresh bool) (*Sequencer, error) {
	if h.isRW() {
		return h.tryRW(ctx, st, fresh)
	}
	prefix := h.spec.Key
	if err := semaphoreConflict(st, h.limit); err != nil {
		return nil, err
	}
	me, ok := st.contenders[h.session]
	if !ok {
		return nil, errNoContender
	}
	holders := map[string]bool{}
	for _, hd := range st.Holders { // already pruned to live contenders
		holders[hd.Session] = true
	}
	if hd, ok := st.holder(h.session); ok {
		if !fresh {
			return nil, errRace // only a fresh read tells it from an earlier grant
		}
		if err := h.ownGrant(ctx); err != nil {
			return nil, err
		}
		return &Sequencer{Key: prefix, Session: h.session, LockIndex: me.LockIndex, Token: h.currentToken(st, hd), Kind: KindSemaphore}, nil
	}
	free := int(h.limit) - len(holders)
	if free <= 0 || ((h.spec.Fair || !mutantNoSharedQueue) && waitRank(st, holders, h.session) >= free) {
		return nil, nil
	}
	holders[h.session] = true
	body, err := json.Marshal(semBody{Limit: int(h.limit), Holders: holders})
	if err != nil {
		return nil, err
	}
	lockKey := prefix + semLockSuffix
	ops := []Op{{Verb: OpCheckSession, Key: me.Key, Session: h.session}}
	if st.semLock == nil {
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: prefix}, Op{Verb: OpCAS, Key: lockKey, Value: body, Flags: SemaphoreFlagValue, Index: 0})
	} else {
		ops = append(ops, Op{Verb: OpCAS, Key: lockKey, Value: body, Flags: SemaphoreFlagValue, Index: st.semLock.ModifyIndex})
	}
	casAt := len(ops) - 1
	ops = append(ops, deadContenderOps(st, h.session)...)
	rec := h.record()
	next := rec.with(prefix, false)
	recAt := len(ops)
	ops = append(ops, rec.writeOps(next)...)
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		// Cancelled in flight: Consul may have committed it (see settle).
		h.unsure = h.unsure || ctx.Err() != nil
		return nil, h.txnFailure(ctx, err, recAt)
	}
	if res[casAt] == nil || res[0] == nil {
		return nil, fmt.Errorf("consul returned no entry for %q", lockKey)
	}
	next.index, next.live = res[casAt].ModifyIndex, true
	h.setRecord(next)
	return &Sequencer{Key: prefix, Session: h.session, LockIndex: res[0].LockIndex, Token: res[casAt].ModifyIndex, Kind: KindSemaphore}, nil
}

// semPosition is the hold's place among the semaphore's waiters as st
// shows it (1: next), or 0 when its contender entry is not listed.
func (h *hold) semPosition(st *State) int {
	if _, ok := st.contenders[h.session]; !ok {
		return 0
	}
	holders := map[string]bool{}
	for _, hd := range st.Holders {
		holders[hd.Session] = true
	}
	return waitRank(st, holders, h.session) + 1
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
func semaphoreLoss(st *State, seq Sequencer, limit uint32) (lost bool, reason LostReason, detail string) {
	if seq.Kind == KindRWLock {
		return rwLoss(st, seq)
	}
	if st.Kind != KindSemaphore || st.semErr != nil || (st.sem != nil && uint32(st.sem.Limit) != limit) {
		return true, LostLimitConflict, fmt.Sprintf("the semaphore's .lock no longer agrees with limit %d", limit)
	}
	c, ok := st.contenders[seq.Session]
	if !ok || c.LockIndex != seq.LockIndex {
		return true, LostDeletedByOther, "the contender entry was deleted or released"
	}
	if !st.sem.Holders[seq.Session] {
		return true, LostReleasedByOther, "this holder was removed from the semaphore's holders"
	}
	return false, 0, ""
}

// maxDeadCleanup bounds the dead contender entries one transaction
// deletes.
const maxDeadCleanup = 16

// deadContenderOps delete contender entries whose session ended (Consul
// releases them but leaves them; api.Semaphore does not delete them
// either), except session's own: any transaction the broker writes on a
// semaphore carries them, so they do not pile up.
func deadContenderOps(st *State, session string) []Op {
	var ops []Op
	for name, c := range st.children {
		if len(ops) == maxDeadCleanup {
			break
		}
		if name != session && c.Session == "" && c.Flags == SemaphoreFlagValue && c.Key != st.Key+semLockSuffix {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
		}
	}
	return ops
}

// leaveOps removes session from the semaphore in st (its slot in `.lock`
// by check-and-set, and its contender entry), or nil when it is in
// neither.
func leaveOps(st *State, session string) ([]Op, bool, error) {
	if st.Kind == KindRWLock {
		return rwLeaveOps(st, session)
	}
	var ops []Op
	held := st.sem != nil && st.sem.Holders[session]
	if held {
		body := semBody{Limit: st.sem.Limit, Holders: map[string]bool{}}
		for k, v := range st.sem.Holders {
			if k != session {
				body.Holders[k] = v
			}
		}
		b, err := json.Marshal(body)
		if err != nil {
			return nil, false, err
		}
		ops = append(ops, Op{Verb: OpCAS, Key: st.Key + semLockSuffix, Value: b, Flags: SemaphoreFlagValue, Index: st.semLock.ModifyIndex})
	}
	if c := st.child(session); c != nil && c.Flags == SemaphoreFlagValue && (c.Session == session || c.Session == "") {
		ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
	}
	if len(ops) > 0 {
		ops = append(ops, deadContenderOps(st, session)...)
	}
	return ops, held, nil
}
