package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
)

// keep holds a multi-key grant until its outcome is decided, as a hold of
// one key does (keep.go), watching every key.
func (m *multiHold) keep(ctx context.Context) error {
	h := m.h
	k := h.newKeeper(ctx)
	defer k.stop()
	return k.loop(ctx, keepHooks{changed: m.changed, checkLoss: func(ctx context.Context) { m.checkLoss(ctx, k) }, conclude: m.conclude})
}

// checkLoss looks at every key's newest listing; the first that shows
// its grant lost starts a consistent read that decides (see readLoss).
func (m *multiHold) checkLoss(ctx context.Context, k *keeper) {
	h := m.h
	if k.lossRead != nil {
		return
	}
	seqs := m.grants()
	for i, s := range m.subs {
		st, began := s.newest()
		if st == nil || (st.Index < seqs[i].Token && !began.After(h.grantSeen())) {
			continue // older than the grant
		}
		if isLost, _, _ := lockLoss(st, seqs[i]); !isLost {
			if e := st.entry(seqs[i].Key); e != nil {
				m.mu.Lock()
				m.values[i] = e.Value
				m.mu.Unlock()
			}
			continue
		}
		switch h.life.Phase() {
		case PhaseReleasing:
			k.recheck = time.After(releaseRecheck)
			return
		case PhaseEnded:
			return
		}
		rctx, cancel := context.WithCancel(ctx)
		k.stopReads, k.lossRead = cancel, make(chan Outcome, 1)
		h.b.holds.Add(1)
		go func() {
			defer h.b.holds.Done()
			k.lossRead <- m.readLoss(rctx, seqs[i])
		}()
		return
	}
}

// readLoss decides a loss of seq's key on consistent reads of the key and
// the record, as readLoss does for a hold of one key; a loss (not a
// release) names the key.
func (m *multiHold) readLoss(ctx context.Context, seq Sequencer) Outcome {
	h := m.h
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, lossReadTimeout)
		st, rec, err := h.b.readHold(rctx, seq.Key, seq.Session)
		cancel()
		if err == nil {
			isLost, reason, detail := lockLoss(st, seq)
			if !isLost {
				return Outcome{}
			}
			o := h.lossOutcome(rec, seq, lost(reason, fmt.Sprintf("key %q: %s", seq.Key, detail)))
			if o.Kind == OutcomeLost {
				m.mu.Lock()
				m.lostKey = seq.Key
				m.mu.Unlock()
			}
			return o
		}
		if ctx.Err() != nil {
			return Outcome{}
		}
		backoff(ctx, attempt)
	}
}

// conclude carries out the outcome, as conclude does for one key: tell
// the client, then clean up every key.
func (m *multiHold) conclude(ctx context.Context, o Outcome) error {
	h := m.h
	seqs := m.grants()
	switch o.Kind {
	case OutcomeReleased:
		err := h.send(Event{Kind: EventReleased, Sequencer: seqs[0], Sequencers: seqs})
		if !m.recycle(true) {
			m.finish(true)
		}
		m.tidy()
		return err
	case OutcomeCanceled:
		if !m.recycle(false) {
			m.finish(false)
		}
		m.tidy()
		return ctx.Err()
	case OutcomeResumed:
		h.b.log.Info("multi-key hold resumed on another replica", zap.Strings("keys", m.keys), zap.String("session", h.session))
		return h.sendLost(LostResumedElsewhere, "the hold was resumed on another broker replica; this stream ends without touching it")
	case OutcomeShutdown:
		until := h.b.drainDeadline()
		if h.ren != nil && h.ren.safeUntil().Before(until) {
			until = h.ren.safeUntil()
		}
		err := h.send(Event{Kind: EventLost, Reason: LostBrokerShutdown, Sequencer: seqs[0], GuaranteedFor: h.promise(until),
			Detail: "the broker is shutting down; resume the hold on another replica with this sequencer (and the same keys) before guaranteed_for runs out"})
		select {
		case <-ctx.Done():
			if disconnected(ctx) {
				<-h.b.drained
			}
		case <-h.b.drained:
		}
		if !h.b.abandoning() {
			m.finish(false)
		}
		return err
	case OutcomeCutOff:
		until := h.ren.safeUntil()
		err := h.send(Event{Kind: EventLost, Reason: LostReplicaCutOff, Sequencer: seqs[0], GuaranteedFor: h.promise(until),
			Detail: "this broker replica is cut off from its Consul agent and cannot renew the session; resume the hold on another replica with this sequencer (and the same keys) before guaranteed_for runs out"})
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		select {
		case <-ctx.Done():
			if disconnected(ctx) {
				<-t.C
			}
		case <-t.C:
		case <-h.b.drained:
		}
		if !h.b.abandoning() {
			m.finish(false)
		}
		return err
	}
	m.mu.Lock()
	key := m.lostKey
	m.mu.Unlock()
	h.b.log.Info("multi-key hold lost", zap.Strings("keys", m.keys), zap.String("lost_key", key), zap.String("session", h.session), zap.Stringer("reason", o.Reason), zap.String("detail", o.Detail))
	err := h.send(Event{Kind: EventLost, Reason: o.Reason, Detail: o.Detail, Sequencer: seqs[0], LostKey: key})
	if o.Reason == LostRenewalFailed {
		h.b.holds.Add(1)
		go func() { defer h.b.holds.Done(); m.finish(false) }()
		return err
	}
	m.finish(false)
	m.tidy()
	return err
}

// unlockAll are the ops that release every key of held (the session's
// grants still standing) and write next (the record without them) after
// rec: one transaction, so no client ever sees some keys released and
// others not. A session with DELETE behavior deletes its keys; when that
// (two ops a key) does not fit, the keys are unlocked here and deleted
// after (see deleteAfter).
func (m *multiHold) unlockAll(rec, next *record, held []int, del bool) (ops []Op, deleteAfter bool) {
	if next != nil {
		ops = rec.writeOps(next)
	} else {
		ops = rec.deleteOps()
	}
	if del && len(ops)+2*len(held) > MaxTxnOps {
		del, deleteAfter = false, true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, i := range held {
		ops = append(ops, unlockOps(m.keys[i], m.h.session, m.values[i], del)...)
	}
	return ops, deleteAfter
}

// deleteUnlocked deletes the keys an unlock of a DELETE session left
// (they were unlocked together; this only tidies them).
func (m *multiHold) deleteUnlocked(ctx context.Context, ops []Op, res []*Entry) {
	var dels []Op
	for i, op := range ops {
		if op.Verb == OpUnlock && i < len(res) && res[i] != nil {
			dels = append(dels, Op{Verb: OpDeleteCAS, Key: op.Key, Index: res[i].ModifyIndex})
		}
	}
	for len(dels) > 0 {
		n := min(len(dels), MaxTxnOps)
		_, _ = m.h.st.Txn(ctx, dels[:n])
		dels = dels[n:]
	}
}

// heldKeys reads every key consistently and returns the indexes of those
// the session still holds with its grant.
func (m *multiHold) heldKeys(ctx context.Context) ([]int, error) {
	sts, err := m.h.b.readStates(ctx, m.keys)
	if err != nil {
		return nil, err
	}
	seqs := m.grants()
	var held []int
	for i, st := range sts {
		if hd, ok := st.holder(m.h.session); ok && hd.LockIndex == seqs[i].LockIndex {
			held = append(held, i)
			m.mu.Lock()
			m.values[i] = hd.Value
			m.mu.Unlock()
		}
	}
	return held, nil
}

// watchHeld is the indexes of the keys that the watch does not show lost
// (after a loss, the others: an unlock of the lost key would fail the
// transaction). A watch that lags costs a failed transaction and a read.
func (m *multiHold) watchHeld() []int {
	seqs := m.grants()
	var held []int
	for i, s := range m.subs {
		if i >= len(seqs) {
			break
		}
		st, _ := s.state()
		if st != nil && st.Index >= seqs[i].Token {
			if isLost, _, _ := lockLoss(st, seqs[i]); isLost {
				continue
			}
		}
		held = append(held, i)
	}
	return held
}

// finish ends the hold's session: it releases what the session still
// holds of its keys (unless a Release did), deletes its record and
// destroys the session, conditioned on the record (a hold resumed
// elsewhere is left alone).
func (m *multiHold) finish(released bool) {
	h := m.h
	if !h.owned {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	warn := func(err error) {
		h.b.log.Warn("cannot release multi-key hold; its session expires with its TTL", zap.Strings("keys", m.keys), zap.String("session", h.session), zap.Error(err))
	}
	if h.record().index == 0 {
		rec, err := h.b.readRecord(ctx, h.session)
		if err != nil {
			warn(err)
			return
		}
		h.setRecord(rec)
	}
	var held []int
	if !released {
		held = m.watchHeld()
	}
	for attempt := range maxWriteAttempts {
		rec := h.record()
		if rec.index != 0 && rec.Owner != h.owner {
			return // resumed elsewhere: not ours to touch
		}
		ops, deleteAfter := m.unlockAll(rec, nil, held, h.del)
		res, err := h.st.Txn(ctx, ops)
		if err == nil {
			h.b.noteUnlocks(ops, res)
			if deleteAfter {
				m.deleteUnlocked(ctx, ops, res)
			}
			h.destroy(ctx)
			return
		}
		if errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
			backoff(ctx, attempt+10)
			continue
		}
		if asTxnError(err) == nil {
			warn(err)
			return
		}
		backoff(ctx, attempt)
		rec, err = h.b.readRecord(ctx, h.session)
		if err == nil {
			h.setRecord(rec)
			held, err = m.heldKeys(ctx)
		}
		if err != nil || attempt == maxWriteAttempts-1 {
			warn(err)
			return
		}
	}
}

// release releases a multi-key hold of this replica through any of its
// keys: every key in one transaction, with the record. done is false when
// the hold is not held any more (the remote path decides).
func (m *multiHold) release(ctx context.Context, key string, token uint64) (bool, error, bool) {
	h := m.h
	seqs := m.grants()
	i := slices.IndexFunc(seqs, func(s Sequencer) bool { return s.Key == key })
	if i < 0 || (token != 0 && token != seqs[i].Token) {
		return false, nil, false
	}
	if err := h.record().tokenRequired(token); err != nil {
		return false, err, true
	}
	if !h.life.BeginRelease() {
		return false, nil, false
	}
	released := false
	defer func() { h.life.EndRelease(released) }()
	held := make([]int, len(m.keys))
	for j := range held {
		held[j] = j
	}
	for attempt := range maxWriteAttempts {
		rec := h.record()
		next := rec.next()
		for _, k := range m.keys {
			delete(next.Holds, k)
			delete(next.Since, k)
			delete(next.Again, k)
		}
		next.Keys = nil
		ops, deleteAfter := m.unlockAll(rec, next, held, h.del)
		res, err := h.st.Txn(ctx, ops)
		if err == nil {
			h.b.noteUnlocks(ops, res)
			if deleteAfter {
				m.deleteUnlocked(ctx, ops, res)
			}
			next.index, next.live = recordWritten(ops, res, h.session), true
			h.setRecord(next)
			for _, k := range m.keys { // a retry through any key is answered OK
				h.b.noteReleased(k, h.session)
			}
			released = true
			return true, nil, true
		}
		if asTxnError(err) == nil {
			return false, err, true
		}
		backoff(ctx, attempt)
		rec, err = h.b.readRecord(ctx, h.session)
		if err == nil {
			h.setRecord(rec)
			held, err = m.heldKeys(ctx)
		}
		if err != nil {
			return false, err, true
		}
		if len(held) < len(m.keys) {
			return false, nil, false // a key was lost meanwhile: the loss decides
		}
	}
	return false, newError(ErrUnavailable, ReasonConsulUnavailable, "keys %q changed under every release attempt; retry", m.keys), true
}

// releaseMultiRemote releases, from a replica without its stream, the
// multi-key hold that rec (the session's record, read consistently) says
// key belongs to: every key the session holds, and the record without
// them, in one transaction. The hold's own replica sees its keys go and
// the record without them, and ends its stream with `released`.
func (b *Broker) releaseMultiRemote(ctx context.Context, rec *record, key, session string, token uint64) (bool, error) {
	st := b.storeFor(TenantFrom(ctx))
	for attempt := range maxWriteAttempts {
		if attempt > 0 {
			backoff(ctx, attempt)
			var err error
			if rec, err = b.readRecord(ctx, session); err != nil {
				return false, err
			}
			if !slices.Contains(rec.Keys, key) {
				return false, nil // released meanwhile
			}
		}
		if cur := rec.token(key); token != 0 && token != cur {
			if token < cur {
				return false, nil
			}
			return false, newError(ErrNotHolder, ReasonNotHolder, "session %s holds %q with another grant than token %d", session, key, token)
		}
		next := rec.next()
		for _, k := range rec.Keys {
			delete(next.Holds, k)
			delete(next.Since, k)
			delete(next.Again, k)
		}
		next.Keys = nil
		ops := rec.writeOps(next) // conditioned on the record as read
		sts, err := b.readStates(ctx, rec.Keys)
		if err != nil {
			return false, err
		}
		for _, kst := range sts {
			if hd, ok := kst.holder(session); ok {
				ops = append(ops, unlockOps(kst.Key, session, hd.Value, false)...)
			}
		}
		res, err := st.Txn(ctx, ops)
		if err == nil {
			b.noteUnlocks(ops, res)
		}
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return false, sessionError(ErrSessionNotFound, session)
			}
			continue
		}
		if err != nil {
			return false, err
		}
		for _, k := range rec.Keys { // a retry through any key is answered OK
			b.noteReleased(k, session)
		}
		return true, nil
	}
	return false, newError(ErrUnavailable, ReasonConsulUnavailable, "keys %q changed under every release attempt; retry", rec.Keys)
}
