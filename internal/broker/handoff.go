package broker

import (
	"context"
	"sync"
	"time"
)

// Direct hand-off: when a holder on this replica releases a lock key whose
// shared queue (ticket.go) a waiter of this replica heads, the release and
// the waiter's grant are one transaction: unlock with the holder's
// session, then lock with the waiter's, each with its session's record,
// and the waiter's ticket deleted.
// One Raft write hands the lock over (Consul applies a transaction's ops
// in order, and an unlock starts no lock-delay), where releasing and then
// acquiring takes two, and the waiter never has to learn of the release.
// The grant is as good as one the waiter made itself: its token is the
// transaction's index, its record lists it, and it is checked in the same
// transaction that the holder still held the key.
//
// The waiter offers a slot while it sleeps; the releaser claims the slot
// of the head of the key's queue (only that one), and delivers the grant, or
// nil when the transaction failed (the waiter then tries by itself, as
// after any wake-up). A waiter never attempts while its slot is claimed.
//
// A releaser that handed the lock over answers its caller once the new
// holder has announced the grant (its `acquired` is queued on its
// stream), or after announceWait. The new holder's `acquired` then leaves
// before the old holder's answer, not after it: the hand-off is over for
// the waiter as soon as it is for the releaser.
type handoffSlot struct {
	mu      sync.Mutex
	state   slotState
	ready   chan struct{} // closed when the releaser is done
	granted *Sequencer
	// announced is made when a releaser claims the slot, and closed when
	// the waiter that took the grant has sent `acquired`, or has ended
	// without sending it (begin returned).
	announced chan struct{}
}

// announceWait bounds how long a releaser waits for the new holder's
// `acquired` to go out: that stream may be blocked (a client that does
// not read it), and the releaser's answer must not wait on that for
// long. A var for tests.
var announceWait = 20 * time.Millisecond

type slotState int

const (
	slotOpen slotState = iota
	slotClaimed
	slotDone
	slotClosed
)

// offer opens a slot for the next sleep.
func (w *waiter) offer() {
	h := w.h
	if h.sem || (h.spec.Resume != nil && !h.resumedWait) || (h.ticket == nil && !mutantNoSharedQueue) {
		h.sub.kw.mu.Lock()
		h.sub.decided()
		h.sub.kw.mu.Unlock()
		return
	}
	s := &handoffSlot{ready: make(chan struct{})}
	h.sub.kw.mu.Lock()
	h.sub.slot = s
	h.sub.decided()
	h.sub.kw.mu.Unlock()
	w.slot = s
}

// withdraw closes the slot after a sleep. It returns the grant a releaser
// handed over, waiting for one that claimed the slot to finish; the hold
// then owes that releaser its announcement (see announced).
func (w *waiter) withdraw() *Sequencer {
	s := w.slot
	if s == nil {
		return nil
	}
	w.slot = nil
	w.h.sub.kw.mu.Lock()
	w.h.sub.slot = nil
	if w.h.sub.waiting && w.h.sub.offered == nil {
		w.h.sub.offered = make(chan struct{}) // until the next offer
	}
	w.h.sub.kw.mu.Unlock()
	s.mu.Lock()
	if s.state == slotOpen {
		s.state = slotClosed
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	<-s.ready
	if s.granted != nil {
		w.h.handedOver = s
		w.h.setTicket(nil, nil) // deleted by the hand-off
	}
	return s.granted
}

// announced tells the releaser that handed h its grant that the grant is
// announced, or never will be. begin calls it on its way out, after the
// `acquired` it sends (or its error, or a panic).
func (h *hold) announced() {
	if s := h.handedOver; s != nil {
		h.handedOver = nil
		close(s.announced)
	}
}

// awaitAnnounced waits until the new holder has announced the grant the
// slot delivered, at most announceWait.
func (s *handoffSlot) awaitAnnounced() {
	select {
	case <-s.announced:
		return
	default:
	}
	t := time.NewTimer(announceWait)
	defer t.Stop()
	select {
	case <-s.announced:
	case <-t.C:
	}
}

// readyChan is what sleep selects on (nil without a slot).
func (w *waiter) readyChan() <-chan struct{} {
	if w.slot == nil {
		return nil
	}
	return w.slot.ready
}

// claimNext claims the slot of the waiter of this replica that heads the
// key's shared queue, if one does and can take the lock from h. The head
// is judged on the key's listing as this replica last saw it, which must
// tells which of the tickets ahead of the waiter's (known since it took
// its ticket: they only ever leave) have left; a listing older than one
// of them tells nothing of it, and a stale listing never makes a waiter
// the head wrongly. Only the queue's part of that listing is derived
// (queueState): the head and the hand-off's queue ops need no more.
// A head that is between two sleeps (it woke, and has not offered its
// next slot yet: a publication of its own ticket, say) is waited for, at
// most announceWait: its next offer comes within microseconds unless it
// leaves, and a release that found the head there would otherwise free
// the key rather than hand it over.
func (h *hold) claimNext() (*hold, *handoffSlot, []Op) {
	var timer *time.Timer
	for {
		w, slot, ops, between := h.claimHead()
		if between == nil {
			return w, slot, ops
		}
		if timer == nil {
			timer = time.NewTimer(announceWait)
			defer timer.Stop()
		}
		select {
		case <-between:
		case <-timer.C:
			return nil, nil, nil
		}
	}
}

// claimHead is one try of claimNext: when the head is between two
// sleeps, it returns the channel that its next offer closes.
func (h *hold) claimHead() (*hold, *handoffSlot, []Op, <-chan struct{}) {
	kw := h.sub.kw
	kw.mu.Lock()
	var st *State
	if kw.ready {
		st = queueState(kw.key, kw.entries, kw.index)
		st.partial = kw.own
	}
	var head *sub
	for s := range kw.subs {
		if mutantNoSharedQueue {
			if s.waiting && s != h.sub && s.holder != nil && (head == nil || s.order < head.order) {
				head = s
			}
			continue
		}
		if !s.waiting || s == h.sub || s.ticket == 0 || s.holder == nil {
			continue
		}
		if s.pruneAhead(st) == 0 && (head == nil || s.ticket < head.ticket) {
			head = s
		}
	}
	var slot *handoffSlot
	var w *hold
	var ops []Op
	if head != nil {
		if head.slot == nil && head.offered != nil {
			between := head.offered
			kw.mu.Unlock()
			return nil, nil, nil, between
		}
		slot, w = head.slot, head.holder
		ops = handOffQueueOps(kw.key, st, w.session, head.ticket)
	}
	kw.mu.Unlock()
	if slot == nil || w == nil {
		return nil, nil, nil, nil
	}
	if w.sem || w.tenant != h.tenant || w.session == "" {
		return nil, nil, nil, nil
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.state != slotOpen {
		return nil, nil, nil, nil
	}
	slot.state, slot.announced = slotClaimed, make(chan struct{})
	return w, slot, ops, nil
}

// handoffChain bounds how long a key passes from holder to holder of
// this replica by direct hand-off without standing free: then a release
// frees it, and this replica's waiters leave it free for handoffCourtesy
// before they take it, so that a client of Consul's own (api.Lock,
// `consul lock`), which cannot join the shared queue, gets its turn.
var (
	handoffChain    = time.Second
	handoffCourtesy = 50 * time.Millisecond
)

// handOff releases h's lock and grants it to the next waiter in one
// transaction. It reports whether it did; on false nothing changed and
// the caller releases as usual. It returns once the new holder has
// announced the grant (or after announceWait).
func (h *hold) handOff(ctx context.Context) bool {
	if time.Since(h.chainStart) >= handoffChain && !mutantNoSharedQueue {
		// The chain ends here: if this replica has a waiter the key would
		// have gone to, its waiters leave the key free a moment.
		kw := h.sub.kw
		kw.mu.Lock()
		for s := range kw.subs {
			if s.waiting && s != h.sub && s.ticket != 0 {
				kw.courtesy = time.Now().Add(handoffCourtesy)
				break
			}
		}
		kw.mu.Unlock()
		return false
	}
	w, slot, queueOps := h.claimNext()
	if w == nil {
		return false
	}
	if !h.handOffTo(ctx, w, slot, queueOps) {
		return false
	}
	h.handedOff.Store(true)
	slot.awaitAnnounced()
	return true
}

// handOffTo runs the hand-off's transaction, and delivers its grant to
// the slot w offered (nil when it failed).
func (h *hold) handOffTo(ctx context.Context, w *hold, slot *handoffSlot, queueOps []Op) bool {
	var granted *Sequencer
	defer func() {
		slot.mu.Lock()
		slot.state, slot.granted = slotDone, granted
		slot.mu.Unlock()
		close(slot.ready)
	}()
	ops, next, err := h.releaseOps(nil)
	if err != nil {
		return false
	}
	key := h.spec.Key
	ops = append(ops, queueOps...)
	grant, wnext := w.lockGrantOps()
	ops = append(ops, grant...)
	res, err := h.st.Txn(ctx, ops)
	var e *Entry
	switch {
	case err == nil:
		e = res[len(res)-1]
		next.index, wnext.index = recordWritten(ops, res, h.session), recordWritten(ops, res, w.session)
	case asTxnError(err) == nil:
		// No answer, which is not a "no": Consul may have committed it
		// (its leader changed under the transaction, say).
		if e = h.b.committedHandOff(ctx, key, w.session); e == nil {
			return false
		}
		next.index, wnext.index = e.ModifyIndex, e.ModifyIndex // one transaction, one index
	default:
		return false // rolled back
	}
	next.live, wnext.live = true, true
	h.setRecord(next)
	w.setRecord(wnext)
	h.b.hub.known.forget(key)
	w.chainStart = h.chainStart // read by w once slot.ready is closed
	granted = &Sequencer{Key: key, Session: w.session, LockIndex: e.LockIndex, Token: e.ModifyIndex, Kind: KindLock}
	return true
}

// committedHandOff tells, after a hand-off's transaction got no answer,
// whether Consul committed it: the key held by the waiter's session (one
// consistent read). It returns the key's entry then, else nil (not
// committed, or not known: the releaser then releases as usual, and the
// waiter that finds the key its own adopts the record, see ownGrant).
// Only the hand-off can have given the waiter's session the key: the
// waiter makes no attempt of its own while its slot is claimed.
func (b *Broker) committedHandOff(ctx context.Context, key, session string) *Entry {
	st, err := b.readState(ctx, key)
	if err != nil {
		return nil
	}
	if e := st.entry(key); e != nil && e.Session == session {
		return e
	}
	return nil
}

// heldHere reports whether every holder st shows is a hold of this
// replica: a waiter then needs no blocking query of its own at once (its
// holder's release here wakes it, or hands it the lock; its watch still
// starts when it is no longer young, for what only Consul can tell, such
// as the holder's session ending).
func (b *Broker) heldHere(st *State) bool {
	if st == nil || len(st.Holders) == 0 {
		return false
	}
	for _, hd := range st.Holders {
		if b.lookup(st.Key, hd.Session) == nil {
			return false
		}
	}
	return true
}

// handOffOnCancel hands the lock to the next local waiter when a
// broker-owned hold's stream was cancelled (or its linger ended), as a
// Release would; it reports whether it did.
func (h *hold) handOffOnCancel() bool {
	if h.sem || h.del || !h.owned || h.b.abandoning() {
		return false
	}
	if rec := h.record(); rec.index != 0 && rec.Owner != h.owner {
		return false // resumed elsewhere: not ours to touch
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	return h.handOff(ctx)
}

// heldNextDoor is the session of another hold of this replica that holds
// the subscriber's key, if any.
func (s *sub) heldNextDoor() (string, bool) {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	for o := range kw.subs {
		if o != s && o.holder != nil && o.holder.life.Phase() == PhaseHeld {
			return o.holder.session, true
		}
	}
	return "", false
}
