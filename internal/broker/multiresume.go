package broker

import (
	"context"
	"slices"
	"sync"
	"time"
)

// openResumed renews the session of a multi-key hold to resume, once
// consistent reads of the record and of every key show that the caller
// may resume it (see readResumable): no Consul write is made for a
// request that is then refused.
func (m *multiHold) openResumed(ctx context.Context) error {
	h := m.h
	s := h.spec.Resume
	if s.Key != h.spec.Key {
		return invalid("resume.key", "%q differs from key %q", s.Key, h.spec.Key)
	}
	rec, sts, err := m.readResumable(ctx)
	if err != nil {
		if rec != nil && !rec.live {
			if _, serr := h.st.Session(ctx, s.Session); serr != nil {
				return sessionError(serr, s.Session)
			}
		}
		return err
	}
	h.start = time.Now()
	info, err := h.st.RenewSession(ctx, s.Session)
	if err != nil {
		return sessionError(err, s.Session)
	}
	h.session, h.owned, h.ttl, h.del = info.ID, true, info.TTL, info.Delete
	h.rec = rec
	m.resumeReads = sts
	return nil
}

// readResumable reads the session's record and every key consistently,
// and checks that the caller may resume the hold they show: the record is
// live, broker-owned and the caller's tenant's; it names exactly the
// request's keys as one multi-key hold; the first key's grant is the
// sequencer named; and the session holds every key.
func (m *multiHold) readResumable(ctx context.Context) (*record, []*State, error) {
	h := m.h
	seq := *h.spec.Resume
	var wg sync.WaitGroup
	var rec *record
	var recErr error
	wg.Go(func() { rec, recErr = h.b.readRecord(ctx, seq.Session) })
	sts, err := h.b.readStates(ctx, m.keys)
	wg.Wait()
	if recErr != nil {
		return nil, nil, recErr
	}
	if err != nil {
		return rec, nil, err
	}
	if err := allowed(ctx, rec, h.tenant); err != nil {
		return rec, nil, err
	}
	if seq.Token == 0 {
		if err := m.waitPlaces(rec, sts); err != nil {
			return rec, nil, err
		}
		return rec, sts, nil
	}
	if err := resumable(sts[0], rec, seq, false, 1); err != nil {
		return rec, nil, err
	}
	same := len(rec.Keys) == len(m.keys)
	for _, k := range m.keys {
		same = same && slices.Contains(rec.Keys, k)
	}
	if !same {
		return rec, nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: session %s holds the multi-key lock %q, not %q (name the same keys: resume with the first key's sequencer, keys the others)", seq.Session, rec.Keys, m.keys).withState(sts[0])
	}
	for _, st := range sts {
		if _, ok := st.holder(seq.Session); !ok || rec.token(st.Key) == 0 {
			return rec, nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: session %s no longer holds %q", seq.Session, st.Key).withState(st)
		}
	}
	return rec, sts, nil
}

// resume re-attaches a multi-key hold made on another replica: it moves
// the record's owner to this replica by check-and-set, in one transaction
// with a check that the session still holds every key (see hold.resume).
func (m *multiHold) resume(ctx context.Context) ([]Sequencer, error) {
	h := m.h
	seq := *h.spec.Resume
	rec, sts := h.record(), m.resumeReads
	m.resumeReads = nil
	for range 5 {
		if sts == nil {
			var err error
			if rec, sts, err = m.readResumable(ctx); err != nil {
				return nil, err
			}
			h.setRecord(rec)
		}
		next := rec.next()
		h.owner = h.b.id + "/" + newNonce()
		next.Owner = h.owner
		ops := rec.writeOps(next)
		for _, st := range sts {
			e := st.entry(st.Key)
			ops = append(ops, Op{Verb: OpCheckIndex, Key: st.Key, Index: e.ModifyIndex}, Op{Verb: OpCheckSession, Key: st.Key, Session: seq.Session})
		}
		res, err := h.st.Txn(ctx, ops)
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return nil, sessionError(ErrSessionNotFound, seq.Session)
			}
			sts = nil // something moved: check again
			continue
		}
		if err != nil {
			return nil, err
		}
		next.index, next.live = recordWritten(ops, res, seq.Session), true
		h.setRecord(next)
		seqs := make([]Sequencer, len(m.keys))
		for i, st := range sts {
			hd, _ := st.holder(seq.Session)
			seqs[i] = Sequencer{Key: st.Key, Session: seq.Session, LockIndex: hd.LockIndex, Token: rec.token(st.Key), Kind: KindLock}
			m.values[i] = hd.Value
		}
		return seqs, nil
	}
	return nil, newError(ErrUnavailable, ReasonConsulUnavailable, "keys %q kept changing while resuming; retry", m.keys)
}

// waitPlaces says why the multi-key wait the request names (a sequencer
// with no token) cannot be resumed from rec and sts, or nil: the record
// must be live, broker-owned, waiting, and name exactly the request's
// keys; every key must be a lock's (or free) and still hold the
// session's live ticket, its place in that key's queue.
func (m *multiHold) waitPlaces(rec *record, sts []*State) error {
	seq := *m.h.spec.Resume
	if rec.index == 0 || !rec.live || rec.Owner == "" || rec.Waiting == "" {
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s has no live broker record of a wait (it ended, was granted, or it is client-owned)", seq.Session).withState(sts[0])
	}
	same := len(rec.Keys) == len(m.keys)
	for _, k := range m.keys {
		same = same && slices.Contains(rec.Keys, k)
	}
	if !same {
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s waits for the multi-key lock %q, not %q (name the same keys)", seq.Session, rec.Keys, m.keys).withState(sts[0])
	}
	for _, st := range sts {
		if err := lockConflict(st); err != nil {
			return err
		}
		t := st.entry(ticketKey(st.Key, seq.Session))
		if t == nil || t.Flags != QueueFlagValue || !ticketLive(st.Key, t) {
			return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s has no place in the queue of %q", seq.Session, st.Key).withState(st)
		}
	}
	return nil
}

// resumeWait re-attaches a multi-key wait made on another replica, as
// hold.resumeWait does for one key: it moves the record's owner to this
// replica by check-and-set, in one transaction with a check that every
// key's ticket is still the session's, then takes those tickets as the
// request's places (same CreateIndex): the wait goes on from them.
func (m *multiHold) resumeWait(ctx context.Context) error {
	h := m.h
	seq := *h.spec.Resume
	rec, sts := h.record(), m.resumeReads
	m.resumeReads = nil
	for range 5 {
		if sts == nil {
			var err error
			if rec, sts, err = m.readResumable(ctx); err != nil {
				return err
			}
			h.setRecord(rec)
		}
		next := rec.next()
		h.owner = h.b.id + "/" + newNonce()
		next.Owner = h.owner
		ops := rec.writeOps(next)
		tickets := make([]*Entry, len(sts))
		for i, st := range sts {
			t := st.entry(ticketKey(st.Key, seq.Session))
			tickets[i] = t
			ops = append(ops, Op{Verb: OpCheckIndex, Key: t.Key, Index: t.ModifyIndex}, Op{Verb: OpCheckSession, Key: t.Key, Session: seq.Session})
		}
		if len(ops) > MaxTxnOps {
			return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: %d keys are too many to check in one transaction", len(m.keys))
		}
		res, err := h.st.Txn(ctx, ops)
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return sessionError(ErrSessionNotFound, seq.Session)
			}
			sts = nil // something moved: check again
			continue
		}
		if err != nil {
			return err
		}
		next.index, next.live = recordWritten(ops, res, seq.Session), true
		h.setRecord(next)
		for i, st := range sts {
			t := tickets[i]
			m.tickets[i], m.ticketMod[i] = t.CreateIndex, t.ModifyIndex
			m.ahead[i] = nil
			for _, o := range st.tickets {
				if o.CreateIndex < t.CreateIndex && o.Session != seq.Session && ticketLive(st.Key, o) {
					m.ahead[i] = append(m.ahead[i], o)
				}
			}
		}
		m.ticketTried, h.enqueued, h.resumedWait = true, true, true
		return nil
	}
	return newError(ErrUnavailable, ReasonConsulUnavailable, "keys %q kept changing while resuming the wait; retry", m.keys)
}
