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
