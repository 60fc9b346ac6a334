package broker

import (
	"context"
	"fmt"
	"time"
)

// Sequencer identifies one grant.
type Sequencer struct {
	Key       string
	Session   string
	LockIndex uint64
	Token     uint64
	Kind      Kind
	// Read: a read (shared) grant of a read-write lock (KindRWLock).
	Read bool
}

// tryLock makes one attempt to take the lock, based on st (a recent state
// of the key; fresh when it comes from a consistent read made just now).
// It returns the grant; (nil, nil) when the lock is busy; errRace when the
// state changed under the attempt (or only a fresh read can tell);
// errLockDelay; or a final error. The granting transaction also writes the
// session's record, whose guard fails the attempt if the record moved.
func (h *hold) tryLock(ctx context.Context, st *State, fresh bool) (*Sequencer, error) {
	key := h.spec.Key
	if st == nil {
		st = &State{Key: key, Kind: KindNone} // not read yet: assume absent
	}
	if err := lockConflict(st); err != nil {
		return nil, err
	}
	if hd, ok := st.holder(h.session); ok {
		// Already held by this session (a client-owned session, or a
		// grant whose answer was lost, see ownGrant): its current grant,
		// as api.Lock would answer; but only a fresh read tells it from
		// the session's earlier, released grant.
		if !fresh {
			return nil, errRace
		}
		if err := h.ownGrant(ctx); err != nil {
			return nil, err
		}
		return &Sequencer{Key: key, Session: h.session, LockIndex: hd.LockIndex, Token: h.currentToken(st, hd), Kind: KindLock}, nil
	}
	if len(st.Holders) > 0 {
		return nil, nil
	}
	var ops []Op
	if st.lock == nil {
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: key}, Op{Verb: OpCheckNotExists, Key: key + semLockSuffix})
	} else {
		ops = append(ops, Op{Verb: OpCheckIndex, Key: key, Index: st.lock.ModifyIndex})
	}
	ops = append(ops, queueGrantOps(st, h.session, h.ticket != nil)...)
	recAt := len(ops)
	grant, next := h.lockGrantOps()
	ops = append(ops, grant...)
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		// Cancelled in flight: Consul may have committed it (see settle).
		h.unsure = h.unsure || ctx.Err() != nil
		return nil, h.txnFailure(ctx, err, recAt)
	}
	e := res[len(res)-1]
	if e == nil {
		return nil, fmt.Errorf("consul returned no entry for the lock of %q", key)
	}
	next.index, next.live = e.ModifyIndex, true
	h.setRecord(next)
	h.b.hub.known.forget(key)
	if h.ticket != nil {
		h.setTicket(nil, nil) // deleted by the grant
	}
	h.chainStart = time.Now()
	return &Sequencer{Key: key, Session: h.session, LockIndex: e.LockIndex, Token: e.ModifyIndex, Kind: KindLock}, nil
}

// ownGrant adopts the session's record when a broker-owned session turns
// out to hold the key already. Only a grant of this hold's own can have
// done that, one whose answer never arrived: a hand-off whose transaction
// Consul committed without answering (make chaos, seed 487355972: its
// leader died in flight). That grant wrote the record, which the hold
// does not know yet; every later write of the hold is conditioned on the
// record (finish, recycle, Release, SetValue), and a resume on another
// replica fences this one only through it. A record owned by another
// replica means the hold was resumed there meanwhile.
func (h *hold) ownGrant(ctx context.Context) error {
	if !h.owned {
		return nil
	}
	return h.reloadRecord(ctx)
}

// reloadRecord reads the session's record and makes it the hold's, unless
// another replica owns it now (a broker-owned session resumed there).
func (h *hold) reloadRecord(ctx context.Context) error {
	rec, err := h.b.readRecord(ctx, h.session)
	if err != nil {
		return err
	}
	if h.owned && rec.Owner != h.owner && rec.index != 0 {
		return newError(ErrAborted, ReasonSessionLost, "the request's session %s is now owned by another replica", h.session)
	}
	h.setRecord(rec)
	return nil
}

// lockGrantOps are the ops that grant h the lock at its key: the
// session's record (conditioned on it) with the new grant, then the
// acquire; next is the record as they write it.
func (h *hold) lockGrantOps() (ops []Op, next *record) {
	rec := h.record()
	next = rec.with(h.spec.Key, h.again)
	ops = append(rec.writeOps(next), Op{Verb: OpLock, Key: h.spec.Key, Value: h.spec.Value, Flags: LockFlagValue, Session: h.session})
	return ops, next
}

// lockConflict says why st cannot be locked.
func lockConflict(st *State) error {
	switch {
	case st.Kind == KindRWLock:
		return rwKindConflict(st, "a lock")
	case st.Kind == KindForeign:
		return newError(ErrConflict, ReasonForeignFlags, "key %q holds flags %#x, not a lock's (%#x)", st.Key, st.lock.Flags, LockFlagValue).withState(st)
	case st.Kind == KindSemaphore:
		return newError(ErrConflict, ReasonLimitConflict, "key %q is a semaphore prefix (limit %d); acquire it as a semaphore with that limit", st.Key, st.Limit).withState(st)
	case st.semLock != nil:
		return newError(ErrConflict, ReasonForeignFlags, "key %q has a %q entry with flags %#x that is not a semaphore's", st.Key, st.semLock.Key, st.semLock.Flags).withState(st)
	}
	return nil
}

// currentToken is the token of hd's current grant of st's key: from the
// session's record when the broker made the grant, else Consul's best
// answer (the entry's ModifyIndex).
func (h *hold) currentToken(st *State, hd Holder) uint64 {
	if t := h.record().token(st.Key); t > 0 {
		return t
	}
	return hd.Token
}

// txnFailure classifies a failed grant attempt: a session that no longer
// exists ends the request at once; a moved record is read again; every
// other failed check is a race.
func (h *hold) txnFailure(ctx context.Context, err error, recAt int) error {
	te := asTxnError(err)
	switch {
	case te == nil:
		return err
	case te.Has(TxnSessionInvalid):
		if h.owned {
			return newError(ErrAborted, ReasonSessionLost, "the request's session %s was invalidated while it waited", h.session)
		}
		return sessionError(ErrSessionNotFound, h.session)
	case te.Has(TxnLockDelay):
		return errLockDelay
	}
	if te.Failed(recAt) {
		if err := h.reloadRecord(ctx); err != nil {
			return err
		}
	}
	return errRace
}

// sessionError is a NOT_FOUND for session.
func sessionError(err error, session string) error {
	if e, ok := err.(*Error); ok {
		return e
	}
	if isNotFound(err) {
		return newError(ErrSessionNotFound, ReasonSessionNotFound, "session %s does not exist (expired or destroyed)", session)
	}
	return err
}

// lockLoss says whether st shows the lock hold seq lost, and why.
func lockLoss(st *State, seq Sequencer) (lost bool, reason LostReason, detail string) {
	switch {
	case st.Kind == KindNone:
		return true, LostDeletedByOther, "the lock key was deleted"
	case st.Kind != KindLock:
		return true, LostDeletedByOther, "the lock key was overwritten by another writer"
	case len(st.Holders) == 0:
		return true, LostReleasedByOther, "the lock key was released"
	case st.Holders[0].Session != seq.Session || st.Holders[0].LockIndex != seq.LockIndex:
		return true, LostReleasedByOther, fmt.Sprintf("the lock is now held by session %s", st.Holders[0].Session)
	}
	return false, 0, ""
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
	// Consul's unlock fails unless session holds the key (TxnNotHeld).
	return []Op{{Verb: OpUnlock, Key: key, Value: value, Flags: LockFlagValue, Session: session}}
}
