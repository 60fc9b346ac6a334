package broker

import (
	"context"
	"time"
)

// openResumed renews the session of a hold to resume: the replica that
// renewed it last is gone, so only a renewal of our own tells how long it
// is safe.
//
// For a tenant of a shared broker it renews only once the key's state and
// the session's record, read consistently, show that the caller may
// resume it (the session is its tenant's, broker-owned, and its current
// grant of the key is the one named): no Consul write is made for a
// request that is then refused, so nobody keeps another tenant's session
// alive by asking to resume it. That costs the resume a round trip to
// Consul (three: the reads, the renewal, the transaction).
//
// Single-tenant, where any caller may renew any session anyway
// (RenewSession), the reads go out with the renewal: the client hears
// nothing while it resumes, and this makes a resume two round trips (these
// three at once, then the transaction), not three; reading before the
// renewal answers is safe, as resume's transaction is conditioned on
// everything it read. Either way resume's first check uses these reads.
func (h *hold) openResumed(ctx context.Context) error {
	s := h.spec.Resume
	if s.Key != h.spec.Key {
		return invalid("resume.key", "%q differs from key %q", s.Key, h.spec.Key)
	}
	ahead := h.b.startReadHold(ctx, s.Key, s.Session)
	if h.tenant != "" {
		st, rec, err := ahead.wait()
		if err != nil {
			return err
		}
		if err := h.resumable(ctx, st, rec); err != nil {
			if !rec.live { // perhaps no session at all: NOT_FOUND, as a renewal would say
				if _, serr := h.st.Session(ctx, s.Session); serr != nil {
					return sessionError(serr, s.Session)
				}
			}
			return err
		}
		ahead = readDone(st, rec)
	}
	h.start = time.Now()
	info, err := h.st.RenewSession(ctx, s.Session)
	if err != nil {
		ahead.abandon()
		return sessionError(err, s.Session)
	}
	h.ahead = ahead
	h.session, h.owned, h.ttl, h.del = info.ID, true, info.TTL, info.Delete
	return nil
}

// resumable says why the caller may not resume its spec's Resume from st
// and rec, or nil: another tenant's session is NOT_FOUND, as if it did not
// exist.
func (h *hold) resumable(ctx context.Context, st *State, rec *record) error {
	if err := allowed(ctx, rec, h.tenant); err != nil {
		return err
	}
	if h.resumingWait() {
		_, err := h.waitPlace(st, rec)
		return err
	}
	if err := rwResumeConflict(st, h.spec.Mode, *h.spec.Resume); err != nil {
		return err
	}
	return resumable(st, rec, *h.spec.Resume, h.sem, h.limit)
}

// resume re-attaches a hold made on another replica: it checks, with
// consistent reads, that the sequencer is still the session's current
// grant and that the session is broker-owned, then moves the record's
// owner to this replica by check-and-set, in one transaction with a check
// that the hold's entry did not move. The old replica's writes are all
// conditioned on the record, so from then on it can change nothing; its
// sweeper notices the record moved (guards), and its stream ends with
// RESUMED_ELSEWHERE.
func (h *hold) resume(ctx context.Context) (*Sequencer, error) {
	seq := *h.spec.Resume
	for range 5 {
		st, rec, err := h.readResumable(ctx)
		if err != nil {
			return nil, err
		}
		target := seq.Key
		if st.Kind == KindSemaphore || st.Kind == KindRWLock {
			target = contenderKey(seq.Key, seq.Session)
		}
		e := st.entry(target)
		if moved, err := h.takeOwner(ctx, rec, e); err != nil {
			return nil, err
		} else if moved {
			continue // something moved: check again
		}
		h.mu.Lock()
		h.value = e.Value
		h.mu.Unlock()
		out := seq
		out.Kind = st.Kind
		if hd, ok := st.holder(seq.Session); ok {
			out.Read = hd.Read
		}
		out.Token = rec.token(seq.Key)
		return &out, nil
	}
	return nil, newError(ErrUnavailable, ReasonConsulUnavailable, "key %q kept changing while resuming; retry", seq.Key)
}

// readResumable reads the key's state and the session's record
// consistently (the first time, openResumed's reads) and checks that the
// caller may resume its spec's Resume from them.
func (h *hold) readResumable(ctx context.Context) (*State, *record, error) {
	read := h.ahead
	h.ahead = nil
	if read == nil {
		read = h.b.startReadHold(ctx, h.spec.Resume.Key, h.spec.Resume.Session)
	}
	st, rec, err := read.wait()
	if err != nil {
		return nil, nil, err
	}
	if err := h.resumable(ctx, st, rec); err != nil {
		return nil, nil, err
	}
	return st, rec, nil
}

// takeOwner moves the session's record to an owner of this hold's own by
// check-and-set, in one transaction with a check that entry (what the
// session holds or waits with) did not move and is still the session's. A
// copy of the hold left on this replica (its connection lost) is fenced
// too. It reports moved when a check failed (read again and retry).
func (h *hold) takeOwner(ctx context.Context, rec *record, entry *Entry) (moved bool, err error) {
	next := rec.next()
	h.owner = h.b.id + "/" + newNonce()
	next.Owner = h.owner
	ops := append(rec.writeOps(next),
		Op{Verb: OpCheckIndex, Key: entry.Key, Index: entry.ModifyIndex},
		Op{Verb: OpCheckSession, Key: entry.Key, Session: rec.session})
	res, err := h.st.Txn(ctx, ops)
	if te := asTxnError(err); te != nil {
		if te.Has(TxnSessionInvalid) {
			return false, sessionError(ErrSessionNotFound, rec.session)
		}
		return true, nil
	}
	if err != nil {
		return false, err
	}
	next.index, next.live = recordWritten(ops, res, rec.session), true
	h.setRecord(next)
	return false, nil
}

// resumable says why seq cannot be resumed from st and rec, or nil.
func resumable(st *State, rec *record, seq Sequencer, sem bool, limit uint32) error {
	switch {
	case rec.index == 0 || !rec.live:
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: session %s has no live broker record (it ended, or the broker did not grant it)", seq.Session).withState(st)
	case rec.Owner == "":
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: session %s is client-owned; its holds outlive streams already", seq.Session).withState(st)
	case st.Kind == KindSemaphore && !sem && limit <= 1:
		return newError(ErrConflict, ReasonLimitConflict, "%q is a semaphore prefix; resume it as a semaphore", seq.Key).withState(st)
	case st.Kind == KindSemaphore && st.Limit != limit:
		return newError(ErrConflict, ReasonLimitConflict, "semaphore %q has limit %d, requested limit %d", seq.Key, st.Limit, limit).withState(st)
	case st.Kind == KindLock && sem:
		return newError(ErrConflict, ReasonLimitConflict, "%q is a lock key; resume it as a lock", seq.Key).withState(st)
	}
	if ok, why := current(st, rec, seq); !ok {
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: %s", why).withState(st)
	}
	return nil
}
