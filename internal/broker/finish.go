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
	if h.owned && h.movable && (h.ticketTried || h.sem) && h.movedAway(ctx) {
		return // the wait goes on elsewhere, in its place
	}
	h.settle(ctx)
	// Destroy first: a contender write the cancelled request left in flight
	// fails once the session is gone, so the removal below is final. But
	// the session's record goes before it, fenced (dropRecord).
	if h.owned {
		if !h.dropRecord(ctx) {
			return // resumed elsewhere (or Consul would not say): not ours to end
		}
		h.destroy(ctx)
		h.dropLateRecord(ctx)
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

// movedAway reports whether the wait, which ended with its replica (cut
// off, shutting down), was resumed on another replica within moveWait
// (its record's owner moved).
func (h *hold) movedAway(ctx context.Context) bool {
	deadline := time.Now().Add(moveWait)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		rec, err := h.b.readRecord(rctx, h.session)
		cancel()
		if err == nil && rec.index != 0 && rec.Owner != h.owner {
			return true
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
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
	if err != nil || (rec.index != 0 && rec.Owner != h.owner) {
		return // a resume elsewhere took the grant over (dropRecord sees it)
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

// dropRecord deletes the session's record before abandon destroys the
// session, conditioned on the record as this replica last wrote it. A
// wait resumed on another replica meanwhile moved the record's owner
// (takeOwner), so the deletion fails, a read shows the new owner, and the
// session, that replica's now, is left alone: the client may have moved
// the wait before this replica heard it leave (a stopped replica), or
// while this clean-up ran. A check by a read before destroying could
// not tell; nor can a read that fails. Once the record is gone, no
// replica can resume the wait. It reports whether the session may be
// destroyed: false when it moved, or when Consul did not answer (the
// session then ends with its TTL).
func (h *hold) dropRecord(ctx context.Context) bool {
	rec := h.record()
	if rec.index == 0 && !h.unsure && !h.recUnknown {
		return true // nothing written: there is nothing to resume
	}
	var err error
	for attempt := range dropAttempts {
		if attempt > 0 {
			backoff(ctx, attempt+5)
		}
		if rec.index != 0 {
			_, err = h.st.Txn(ctx, rec.deleteOps())
			if err == nil {
				return true
			}
			if asTxnError(err) == nil {
				continue // Consul busy or away: again
			}
		}
		// The record moved, or was never known: read it.
		var r *record
		if r, err = h.b.readRecord(ctx, h.session); err != nil {
			continue
		}
		switch {
		case r.index == 0:
			return true // gone, or never written
		case r.Owner != h.owner:
			return false // resumed elsewhere: not this replica's
		}
		rec = r
		h.setRecord(r)
	}
	h.b.log.Warn("cannot end the session of an abandoned request; it expires with its TTL", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Error(err))
	return false
}

// dropLateRecord deletes, once the session is gone, the record that a
// transaction left in flight (unsure, recUnknown) may have written after
// dropRecord read it absent, and before the destroy: a write Consul
// applies after the destroy fails (it needs the live session, or the
// record dropRecord deleted), so this read is the last word.
func (h *hold) dropLateRecord(ctx context.Context) {
	if h.unsure || h.recUnknown {
		h.b.dropDead(ctx, h.st, h.session)
	}
}

// dropAttempts bounds dropRecord's rounds (each within cleanupContext).
const dropAttempts = 8
