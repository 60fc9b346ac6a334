package broker

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
)

// finish ends a broker-owned session after its hold ended: it releases
// what the session still holds of the key (unless a Release did),
// deletes the session's record and destroys the session. The transaction
// is conditioned on the record as this replica last knew it, so a session
// another replica resumed meanwhile is left alone. A client-owned
// session's hold outlives the stream: nothing is done.
func (h *hold) finish(released bool) {
	if !h.owned {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	st, err := h.leaveState(ctx)
	if err != nil {
		h.b.log.Warn("cannot release hold; its session expires with its TTL", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Error(err))
		return
	}
	if h.record().index == 0 && !mutantNoResumeFence {
		// The record was never known here (a grant whose answer was lost,
		// see ownGrant): without it nothing below is conditioned on the
		// record, and a resume on another replica would not fence this
		// clean-up. Read it first.
		rec, err := h.b.readRecord(ctx, h.session)
		if err != nil {
			h.b.log.Warn("cannot release hold; its session expires with its TTL", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Error(err))
			return
		}
		h.setRecord(rec)
	}
	for attempt := range maxWriteAttempts {
		rec := h.record()
		if rec.index != 0 && rec.Owner != h.owner && !mutantNoResumeFence {
			return // resumed elsewhere: not ours to touch
		}
		ops, err := h.finishOps(rec, st, released)
		var res []*Entry
		if err == nil {
			res, err = h.st.Txn(ctx, ops)
		}
		if err == nil {
			h.noteRelease(ops, res)
			h.destroy(ctx)
			return
		}
		if errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
			backoff(ctx, attempt+10) // Consul busy (429) or away: try again
			continue
		}
		if asTxnError(err) == nil {
			h.b.log.Warn("cannot release hold; its session expires with its TTL", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Error(err))
			return
		}
		// Something moved: read the record and the key again.
		backoff(ctx, attempt)
		rec, err = h.b.readRecord(ctx, h.session)
		if err == nil {
			h.setRecord(rec)
			st, err = h.b.readState(ctx, h.spec.Key)
		}
		if err != nil || attempt == maxWriteAttempts-1 {
			h.b.log.Warn("cannot release hold; its session expires with its TTL", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Error(err))
			return
		}
	}
}

// leaveState is the state a release is built on: for a lock, none (an
// unlock needs no state: it is conditioned on the session holding the
// key, and a failed attempt reads the key again); for a semaphore, a
// consistent read, since leaving it is a check-and-set of `.lock` and the
// shared watch may not show the admission yet. A release must never rest
// on a watch state older than the grant: it would skip the unlock, and
// destroying a session that still holds a key starts Consul's lock-delay.
func (h *hold) leaveState(ctx context.Context) (*State, error) {
	if h.isRW() {
		return h.rwLeaveState(ctx)
	}
	if h.sem {
		return h.b.readState(ctx, h.spec.Key)
	}
	return nil, nil
}

// finishOps are the ops that end the hold: the record's guard and
// deletion, and the release of whatever st shows the session holding.
func (h *hold) finishOps(rec *record, st *State, released bool) ([]Op, error) {
	var ops []Op
	if !mutantNoResumeFence {
		ops = append(ops, rec.deleteOps()...)
	}
	if released {
		return ops, nil
	}
	if h.sem {
		leave, _, err := h.leaveOps(st)
		return append(ops, leave...), err
	}
	// st is nil on the first attempt: the hold believes it holds.
	if hd, ok := st.holderOrSelf(h.session, h.grant().LockIndex); ok && hd.LockIndex == h.grant().LockIndex {
		h.mu.Lock()
		value := h.value
		h.mu.Unlock()
		ops = append(ops, unlockOps(h.spec.Key, h.session, value, h.del)...)
	}
	return ops, nil
}

// recycle gives a pooled session back to the pool after a clean end: the
// record loses the key and (unless a Release did it) the key is unlocked,
// in one transaction conditioned on the record. It reports whether it
// did; otherwise the caller finishes the session as usual.
func (h *hold) recycle(released bool) bool {
	if h.pooled == nil || h.b.abandoning() || h.ticketTried {
		// (A queue ticket that could not be deleted ends with the
		// session: see leaveQueue.)
		return false
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	rec := h.record()
	if rec.Owner != h.owner {
		return false
	}
	giveBack := func(rec *record) bool {
		h.pooled.rec = rec
		if h.ren != nil {
			h.pooled.renewed = h.ren.lastRenewal()
		}
		h.pooled.pool.put(h.pooled)
		return true
	}
	if _, listed := rec.Holds[h.spec.Key]; released && !listed {
		return giveBack(rec) // the releasing transaction dropped the key
	}
	var ops []Op
	next := rec.without(h.spec.Key)
	if released {
		ops = rec.writeOps(next)
	} else {
		st, err := h.leaveState(ctx)
		if err != nil {
			return false
		}
		if ops, next, err = h.releaseOps(st); err != nil {
			return false
		}
	}
	res, err := h.st.Txn(ctx, ops)
	for attempt := 0; errors.Is(err, ErrUnavailable) && attempt < 20 && ctx.Err() == nil; attempt++ {
		backoff(ctx, attempt+10) // Consul busy (429) or away: try again
		res, err = h.st.Txn(ctx, ops)
	}
	if err != nil {
		return false
	}
	h.noteRelease(ops, res)
	next.index, next.live = recordWritten(ops, res, h.session), true
	return giveBack(next)
}

// maxWriteAttempts bounds the check-and-set rounds of a release or clean
// up; a busy semaphore's `.lock` can take a few dozen.
const maxWriteAttempts = 50

// backoff sleeps a little, more after more failed attempts, with jitter
// so that contenders on one `.lock` spread out.
func backoff(ctx context.Context, attempt int) {
	d := time.Duration(1+rand.IntN(1+min(attempt, 10))) * time.Millisecond
	sleep(ctx, d)
}

// destroy destroys the hold's session.
func (h *hold) destroy(ctx context.Context) {
	if err := h.st.DestroySession(ctx, h.session); err != nil {
		h.b.log.Warn("cannot destroy session; it expires with its TTL", zap.String("session", h.session), zap.Error(err))
	}
}

// abandon cleans up after a request that never got its grant: its
// contender entry and, for a session the broker made for it, the session.
// A resumed session that could not be re-attached is not ours: nothing is
// done to it.
func (h *hold) abandon() {
	if h.spec.Resume != nil && !h.resumedWait {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	if h.owned && (h.ticketTried || h.sem) && h.movedAway(ctx, h.movable) {
		return // the wait goes on elsewhere, in its place
	}
	h.settle(ctx)
	// Destroy first: a contender write the cancelled request left in flight
	// fails once the session is gone, so the removal below is final.
	if h.owned {
		h.destroy(ctx)
		h.dropDeadRecord(ctx)
	}
	if h.abandonLater && !h.sem && h.sub != nil && h.sub.lastOut(h.usedQueue()) {
		// Begun in the background after close: the queue is tidied here,
		// now that the session ended (its ticket is dead) or the ticket
		// is deleted. (Otherwise close tidies after this.)
		h.b.tidyQueue(h.st, h.spec.Key)
	}
	if !h.sem || h.session == "" {
		return
	}
	for attempt := range maxWriteAttempts {
		backoff(ctx, attempt)
		st, err := h.b.readState(ctx, h.spec.Key)
		if err != nil {
			return
		}
		ops, _, err := leaveOps(st, h.session)
		if err != nil || len(ops) == 0 {
			return
		}
		if _, err := h.st.Txn(ctx, ops); asTxnError(err) == nil {
			return
		}
	}
}

// moveWait bounds how long a wait that ended with its replica (cut off,
// shutting down) waits for its client to resume it elsewhere before its
// session is destroyed, which would cost it its place in the queue.
var moveWait = 5 * time.Second

// movedAway reports whether the hold's wait was resumed on another
// replica (its record's owner moved): within moveWait when wait, else
// already. A wait whose client went away may have moved before this
// replica heard of it (the replica was stopped, and its client resumed
// the wait elsewhere): its session is not this replica's to destroy.
func (h *hold) movedAway(ctx context.Context, wait bool) bool {
	deadline := time.Now().Add(moveWait)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		rec, err := h.b.readRecord(rctx, h.session)
		cancel()
		if err == nil && rec.index != 0 && rec.Owner != h.owner {
			return true
		}
		if !wait || !time.Now().Before(deadline) || ctx.Err() != nil {
			return false
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// settle undoes a lock grant whose transaction the request stopped waiting
// for (its context ended in flight) but Consul committed: it unlocks the
// key and deletes the record in one transaction, so that neither a held
// key (whose session's end would start a lock-delay) nor a record is left.
func (h *hold) settle(ctx context.Context) {
	if !h.unsure || h.sem || h.session == "" {
		return
	}
	st, err := h.b.readState(ctx, h.spec.Key)
	if err != nil {
		return
	}
	hd, ok := st.holder(h.session)
	if !ok {
		return
	}
	rec, err := h.b.readRecord(ctx, h.session)
	if err != nil {
		return
	}
	_, _ = h.st.Txn(ctx, append(rec.deleteOps(), unlockOps(h.spec.Key, h.session, hd.Value, h.del)...))
}

// noteUnanswered notes a transaction that wrote the session's record
// (recAt >= 0) and failed without Consul's answer (cancelled in flight, a
// timeout): it may have committed (see recUnknown).
func (h *hold) noteUnanswered(err error, recAt int) {
	if err != nil && recAt >= 0 && asTxnError(err) == nil {
		h.recUnknown = true
	}
}

// dropDeadRecord deletes the session's record once its session is gone
// (the janitor would, 15 s later): the record a wait wrote with its
// ticket or contender entry (Waiting), or one a grant cut off in flight
// may have written.
func (h *hold) dropDeadRecord(ctx context.Context) {
	if !h.unsure && !h.recUnknown && h.record().index == 0 {
		return
	}
	h.b.dropDead(ctx, h.st, h.session)
}
