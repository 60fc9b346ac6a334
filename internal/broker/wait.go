package broker

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// maxRaces bounds the attempts that lose a check-and-set race; each one
// re-reads the key and backs off a little.
const maxRaces = 100

// errRace: a check of the attempt failed; the state changed under us.
var errRace = errors.New("state changed during the attempt")

// errLockDelay: Consul refused the acquire because of a lock-delay.
var errLockDelay = errors.New("blocked by consul lock-delay")

// waiter is the state of one waiting loop.
type waiter struct {
	h      *hold
	queued *State
	// delays: lock-delay of holders seen; lastHolders/freedAt: who held
	// the key before it was freed, and when.
	delays      map[string]time.Duration
	lastHolders []Holder
	freedAt     time.Time
	// gone: when each holder of a read-write lock was last seen leaving
	// the holders (rwDelayLeft).
	gone  map[string]time.Time
	races int
	fresh bool         // the state comes from a consistent read made just now
	slot  *handoffSlot // offered while sleeping (see handoff.go)
	// freeSince is when this waiter first saw the key free with a live
	// ticket ahead of its own (zero otherwise): after queueGrace it
	// takes the key all the same (ticket.go).
	freeSince time.Time
	// touched is touchMark of the tickets ahead when freeSince was last
	// set: a touch of one of them since restarts the grace (ticket.go).
	touched  uint64
	position int // in the shared queue, as last reported
	// courteous: turn refused the free key for the courtesy to Consul's
	// own clients (handoffChain); the sleep that follows wakes when it
	// ends, even if it ended meanwhile (graceLeft).
	courteous bool
}

// QueuedHeartbeat is how often a waiting request hears `queued` again when
// nothing changed (AcquireQueued.heartbeat): a waiter hears from its
// replica only when the key's holders change, so without it a client
// could not tell a stopped replica from a quiet key. The libraries move a
// waiting request to another replica after three heartbeats of silence.
const QueuedHeartbeat = 2 * time.Second

// wait is the waiting loop: attempt, and when busy, report who is in the
// way and sleep until the key changes (the shared watch), the lock-delay
// ends, or the wait times out.
func (h *hold) wait(ctx context.Context) (_ *Sequencer, err error) {
	var timeout <-chan time.Time
	if !h.spec.WaitForever && h.spec.Wait > 0 {
		t := time.NewTimer(h.spec.Wait)
		defer t.Stop()
		timeout = t.C
	}
	var failed <-chan error
	if h.ren != nil {
		failed = h.ren.failed
	}
	st, err := h.first(ctx)
	if err != nil {
		return nil, err
	}
	h.sub.setWaiting(true, false)
	granted := false
	defer func() {
		testHookLeaving(h.spec.Key, granted)
		// A waiter that gives up makes room for the next. So does a
		// semaphore's grantee: a waiter behind it may already have read
		// the state with its grant, and a free slot left, while it still
		// counted as ahead (rank); that waiter sleeps on a state no
		// publication will change, and only this wake tells it its turn
		// came. A lock's grantee fills the only slot: the next change of
		// the key wakes its waiters.
		h.sub.setWaiting(false, !granted || h.sem)
		r, _ := ReasonOf(err)
		h.movable = r == ReasonReplicaCutOff || r == ReasonBrokerShuttingDown
		if !granted && h.ticketTried && !h.leaveQueue() {
			h.b.log.Debug("cannot delete a queue ticket; the session ends with it", zap.String("key", h.spec.Key))
		}
	}()
	w := &waiter{h: h, delays: map[string]time.Duration{}, fresh: h.sem}
	for {
		seq, delayLeft, raced, err := w.attempt(ctx, st)
		if seq != nil || err != nil {
			granted = seq != nil
			return seq, err
		}
		if raced || st == nil {
			if st, err = h.b.readState(ctx, h.spec.Key); err != nil {
				return nil, err
			}
			w.fresh = true
			if raced {
				continue
			}
		}
		if !h.sem && h.ticket == nil && st != nil && !h.tryOnce() && !mutantNoSharedQueue {
			// Busy, or free with waiters queued: take a ticket.
			if err := h.enqueue(ctx, st); errors.Is(err, errRace) {
				// The guard (or the ticket) moved: read the queue again.
				if st, err = h.b.readState(ctx, h.spec.Key); err != nil {
					return nil, err
				}
				w.fresh = true
				continue
			} else if err != nil {
				return nil, err
			}
		}
		// The slot is offered before `queued` goes out: a release the
		// client makes as soon as it sees `queued` hands the lock over.
		w.offer()
		next, err := w.queue(ctx, st, delayLeft, timeout, failed)
		if seq := w.withdraw(); seq != nil {
			granted = true // a releaser of this replica handed the lock over
			return seq, nil
		}
		if err != nil {
			return nil, err
		}
		st = next
	}
}

// queue reports st (`queued`, see report) and sleeps until the key
// changes; a listing that cannot be current (see staleListing) is read
// again. The hand-off slot stays offered throughout: a release here
// meanwhile hands the lock over all the same, and the caller's withdraw
// takes that grant before any error.
func (w *waiter) queue(ctx context.Context, st *State, delayLeft time.Duration, timeout <-chan time.Time, failed <-chan error) (*State, error) {
	if err := w.report(ctx, st, delayLeft); err != nil {
		return nil, err
	}
	next, err := w.sleep(ctx, st, delayLeft, timeout, failed)
	if err == nil && next != st && w.h.staleListing(next) {
		if next, err = w.h.b.readState(ctx, w.h.spec.Key); err == nil {
			w.fresh = true
		}
	}
	return next, err
}

// sleep waits until the key changes (the newest state is returned), the
// lock-delay ends, or the wait must end (the error).
func (w *waiter) sleep(ctx context.Context, st *State, delayLeft time.Duration, timeout <-chan time.Time, failed <-chan error) (*State, error) {
	h := w.h
	if h.needsWatch(st) {
		h.sub.activate() // a waiter needs the key's changes now
	}
	var grace <-chan time.Time
	if d, ok := w.graceLeft(st); ok {
		t := time.NewTimer(d)
		defer t.Stop()
		grace = t.C
	}
	var delayTimer <-chan time.Time
	delayEnds := time.Now().Add(delayLeft)
	if delayLeft > 0 {
		delayTimer = time.After(delayLeft)
	}
	w.fresh = false
	cutOff := h.b.reach.lost()
	beat := time.NewTimer(QueuedHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-h.b.shutdown:
			return nil, newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; retry on another replica")
		case <-timeout:
			h.b.fillTokens(ctx, st)
			return nil, holdersError(ErrTimeout, ReasonWaitTimeout, st)
		case err := <-failed:
			return nil, newError(ErrAborted, ReasonSessionLost, "the request's session was lost while it waited: %v", err)
		case <-cutOff:
			// The key may be free with nobody here able to see or take
			// it: another replica can (see reach.go).
			return nil, newError(ErrUnavailable, ReasonReplicaCutOff, "this replica's Consul agent has not answered for %s; wait on another replica", reachGrace)
		case <-beat.C:
			// Nothing changed, and the replica is alive: the last
			// `queued` again, with the lock-delay left now.
			var left time.Duration
			if delayLeft > 0 {
				left = max(time.Until(delayEnds), time.Millisecond)
			}
			if err := w.sendQueued(w.queued, left); err != nil {
				return nil, err
			}
			beat.Reset(QueuedHeartbeat)
			continue
		case <-delayTimer:
		case <-grace:
		case <-w.readyChan():
		case <-h.sub.wake:
			if next, _ := h.sub.state(); next != nil {
				if len(st.Holders) > 0 && len(next.Holders) == 0 {
					w.lastHolders, w.freedAt = st.Holders, time.Now()
				}
				if h.isRW() {
					w.noteGone(st, next)
				}
				return next, nil
			}
		}
		return st, nil
	}
}

// needsWatch says whether a waiter needs its key's watch now: unless
// every holder st shows is a hold of this replica and no ticket is ahead
// of the waiter's, only Consul can tell it when its turn comes. A waiter
// that is next behind a holder of this replica learns it here: the
// holder's release hands it the lock (handoff.go), or, when it does not,
// the holder's end starts the watch (hold.close); a holder's loss is
// noticed by the holder (its young checks, or its watch once it is no
// longer young). So a hand-off to it is one transaction with no blocking
// query of the key to answer at the same moment (on a busy agent that
// answer slows the transaction down by a third or more). Its watch still
// starts when it is no longer young.
func (h *hold) needsWatch(st *State) bool {
	if !h.b.heldHere(st) {
		return true
	}
	return h.ticket != nil && h.aheadOf(st) > 0
}

// sendQueued tells the client that the request waits behind st, with the
// lock-delay left (0 when it is not what blocks).
func (w *waiter) sendQueued(st *State, delayLeft time.Duration) error {
	return w.h.send(Event{Kind: EventQueued, State: st, LockDelayRemaining: delayLeft, Session: w.h.session, Heartbeat: QueuedHeartbeat, Position: w.position})
}

// staleListing says whether st, a lock's state from the shared watch,
// cannot be the key's state now: another hold of this replica holds the
// key, and st does not list it (it shows the key free, or held by an
// earlier holder that is gone). The watch has not caught up with the
// grant yet (it can lag a grant made here by a listing or more). An
// attempt on a free listing is a transaction bound to fail, and a waiter
// queued on an earlier holder reports that holder and wakes when it goes;
// a consistent read tells more for the same wait. When the local holder
// lost the key and does not know yet, the read shows what the key has,
// and the waiter goes on from that.
func (h *hold) staleListing(st *State) bool {
	if h.sem {
		return false
	}
	session, ok := h.sub.heldNextDoor()
	if !ok {
		return false
	}
	if st == nil {
		return true
	}
	_, listed := st.holder(session)
	return !listed
}

// testHookLeaving runs as a waiter leaves the key's queue of waiters,
// before the others are woken (set in tests only).
var testHookLeaving = func(key string, granted bool) {}

// first is the state of the first attempt. A lock tries at once on what
// the shared watch knows (nil when it knows nothing yet: the attempt then
// assumes the key absent); its transaction checks that state, so a stale
// one costs a failed attempt and a consistent read, never a wrong grant. A
// semaphore reads the key consistently and enters this session's
// contender entry first.
func (h *hold) first(ctx context.Context) (*State, error) {
	if h.isRW() {
		return h.firstRW(ctx)
	}
	if !h.sem {
		st, _ := h.sub.state()
		if st == nil {
			st = h.b.hub.knownState(h.spec.Key)
		}
		if h.staleListing(st) {
			// Busy for sure: a read, not a transaction bound to fail
			// nor a queue behind a holder that is gone.
			return h.b.readState(ctx, h.spec.Key)
		}
		return st, nil
	}
	st, err := h.b.readState(ctx, h.spec.Key)
	if err != nil {
		return nil, err
	}
	if err := semaphoreConflict(st, h.limit); err != nil {
		return nil, err
	}
	if _, holds := st.holder(h.session); holds {
		return st, nil // already admitted (a client-owned session)
	}
	e, err := h.enterSemaphore(ctx, st)
	if err != nil {
		return nil, err
	}
	if e == nil || e.Session != h.session {
		return h.b.readState(ctx, h.spec.Key)
	}
	return withContender(st, h.session, e), nil
}

// attempt makes one try on st. It returns the grant; or the lock-delay
// left when that is what blocks; or raced when the state changed under
// the attempt (after a short backoff); or a final error.
func (w *waiter) attempt(ctx context.Context, st *State) (*Sequencer, time.Duration, bool, error) {
	h := w.h
	if st != nil {
		if err := h.conflict(st); err != nil {
			return nil, 0, false, err
		}
	}
	if st != nil && !w.turn(st) {
		// Older waiters of this replica go first: no Consul call.
		if h.tryOnce() {
			h.b.fillTokens(ctx, st)
			return nil, 0, false, holdersError(ErrBusy, ReasonLockHeld, st)
		}
		return nil, 0, false, nil
	}
	var seq *Sequencer
	var err error
	if h.sem {
		seq, err = h.trySemaphore(ctx, st, w.fresh)
	} else {
		seq, err = h.tryLock(ctx, st, w.fresh)
	}
	switch {
	case seq != nil:
		return seq, 0, false, nil
	case errors.Is(err, errNoContender) && w.fresh:
		if !h.owned {
			if _, serr := h.st.Session(ctx, h.session); isNotFound(serr) {
				return nil, 0, false, sessionError(serr, h.session)
			}
		}
		return nil, 0, false, newError(ErrAborted, ReasonSessionLost, "this request's contender entry %q was removed while it waited", contenderKey(h.spec.Key, h.session))
	case errors.Is(err, errRace), errors.Is(err, errNoContender):
		w.races++
		if w.races > maxRaces {
			e := newError(ErrUnavailable, ReasonConsulUnavailable, "key %q changed under %d attempts in a row; retry later", h.spec.Key, maxRaces)
			e.RetryAfter = time.Second
			return nil, 0, false, e
		}
		// The first race re-reads at once (usually a watch state a moment
		// old); repeated ones back off a little, with jitter.
		if w.races > 1 {
			backoff(ctx, w.races)
		}
		return nil, 0, true, ctx.Err()
	case errors.Is(err, errLockDelay):
		seq, left, err := w.lockDelay(st)
		return seq, left, false, err
	case err != nil:
		return nil, 0, false, err
	case h.tryOnce():
		h.b.fillTokens(ctx, st)
		return nil, 0, false, holdersError(ErrBusy, ReasonLockHeld, st)
	}
	return nil, 0, false, nil
}

// lockDelay says how long Consul's lock-delay still blocks the key, as far
// as the holders' sessions were learnt; a try-once fails with it.
func (w *waiter) lockDelay(st *State) (*Sequencer, time.Duration, error) {
	left, known := 200*time.Millisecond, false // unknown: poll
	for _, prev := range w.lastHolders {
		if d, ok := w.delays[prev.Session]; ok && !w.freedAt.IsZero() {
			left, known = max(time.Until(w.freedAt.Add(d)), 10*time.Millisecond), true
		}
	}
	if w.h.isRW() {
		left, known = w.rwDelayLeft(st)
	}
	if !w.h.tryOnce() {
		return nil, left, nil
	}
	key := w.h.spec.Key
	e := newError(ErrBusy, ReasonLockDelay, "key %q is in Consul's lock-delay (its end is unknown to this broker)", key)
	if known {
		e = newError(ErrBusy, ReasonLockDelay, "key %q is in Consul's lock-delay for about %s more", key, left.Round(time.Millisecond))
		e.RetryAfter = left
	}
	return nil, 0, e.withState(st)
}

// report learns the holders' lock-delays and tells the client it waits,
// when the holders changed or the lock-delay is what blocks.
func (w *waiter) report(ctx context.Context, st *State, delayLeft time.Duration) error {
	h := w.h
	if !h.sem || h.isRW() {
		// Learn a holder's lock-delay while it holds: once its session is
		// gone it can no longer be read.
		for _, hd := range st.Holders {
			if _, ok := w.delays[hd.Session]; !ok {
				if d, ok := h.sub.holderDelay(ctx, hd.Session); ok {
					w.delays[hd.Session] = d
				}
			}
		}
	}
	pos := h.position(st)
	if h.sem {
		pos = h.semPosition(st)
	} else if h.ticket != nil {
		if e := st.entry(h.ticket.Key); e == nil || e.Session != h.session {
			// A listing from before the ticket: count it all the same.
			cp := *st
			cp.Waiting++
			st = &cp
		}
	}
	if w.queued != nil && sameHolders(st, w.queued) && delayLeft == 0 && pos == w.position && st.Waiting == w.queued.Waiting {
		return nil
	}
	w.queued, w.position = st, pos
	h.b.fillTokensCached(st)
	return w.sendQueued(st, delayLeft)
}

// turn says whether this waiter may attempt on st. A request that already
// holds the key (a client-owned session asking again) always may. A
// semaphore's waiter may when there is a free slot for it among the older
// waiters of this replica (its place in the shared order is checked by
// the attempt, see trySemaphore). A lock's may when the key is free and
// it is at the head of the key's shared queue: a newcomer when nobody is
// queued, a waiter when no live ticket is older than its own, or when the
// key has stood free for queueGrace with the head not taking it nor
// touching its ticket.
func (w *waiter) turn(st *State) bool {
	h := w.h
	if _, ok := st.holder(h.session); ok {
		return true
	}
	if h.isRW() {
		return h.rwTurn(st)
	}
	if h.sem {
		// The shared order (the contender entries' CreateIndex) decides,
		// as the attempt does (trySemaphore): a local order that
		// disagreed would leave two waiters each waiting for the other.
		free := int(h.limit) - len(st.Holders)
		if _, ok := st.contenders[h.session]; ok && !mutantNoSharedQueue {
			return h.semPosition(st)-1 < free
		}
		return h.sub.rank() < free
	}
	if mutantNoSharedQueue {
		return h.sub.rank() < 1-len(st.Holders)
	}
	if len(st.Holders) > 0 {
		w.freeSince = time.Time{}
		return false
	}
	if h.ticket == nil {
		return !st.othersQueued(h.session)
	}
	if h.sub.courtesyLeft() > 0 {
		w.courteous = true
		testHookCourtesy(h.spec.Key)
		return false // a newcomer finds the ticket holders queued
	}
	if h.aheadOf(st) == 0 {
		return true
	}
	if mark := h.aheadTouched(st); w.freeSince.IsZero() || mark > w.touched {
		// The key is newly free, or a head touched its ticket since:
		// alive, and waiting for more than this key (a multi-key waiter).
		w.freeSince, w.touched = time.Now(), mark
	}
	return time.Since(w.freeSince) >= queueGrace
}

// testHookCourtesy runs when the courtesy keeps a waiter from the free
// key (handoff_test.go lets it end there).
var testHookCourtesy = func(key string) {}

// graceLeft is how long until a waiter may take the free key (see turn)
// when time is what it waits for: a courtesy to Consul's own clients, or
// the grace of a silent head.
func (w *waiter) graceLeft(st *State) (time.Duration, bool) {
	if st == nil || len(st.Holders) > 0 || w.h.sem {
		return 0, false
	}
	// A courtesy that turn waited for may have ended since: the sleep
	// must end all the same, or it waits for a change of a free key that
	// nobody makes.
	if c := w.h.sub.courtesyLeft(); c > 0 || w.courteous {
		w.courteous = false
		return max(c, time.Millisecond), true
	}
	if w.freeSince.IsZero() {
		return 0, false
	}
	return max(time.Until(w.freeSince.Add(queueGrace)), time.Millisecond), true
}

// courtesyLeft is how long this replica's waiters still leave the key
// free (handoffChain).
func (s *sub) courtesyLeft() time.Duration {
	s.kw.mu.Lock()
	defer s.kw.mu.Unlock()
	return time.Until(s.kw.courtesy)
}

// conflict says why st cannot be held the way this request asks.
func (h *hold) conflict(st *State) error {
	if h.isRW() {
		return rwConflict(st)
	}
	if h.sem {
		return semaphoreConflict(st, h.limit)
	}
	return lockConflict(st)
}

// noteGone notes when holders of a read-write lock that st listed are no
// longer holders in next (a dead holder's lock-delay runs from then).
func (w *waiter) noteGone(st, next *State) {
	for _, hd := range st.Holders {
		if _, ok := next.holder(hd.Session); !ok {
			if w.gone == nil {
				w.gone = map[string]time.Time{}
			}
			w.gone[hd.Session] = time.Now()
		}
	}
	for _, hd := range next.Holders {
		delete(w.gone, hd.Session)
	}
}

// rwDelayLeft is how long the lock-delay of the dead holders of st (a
// read-write lock's) still blocks a grant: known when this waiter saw each
// of them hold (its session's lock-delay) and go. Once the end it knows
// has passed, or when it does not know, it polls.
func (w *waiter) rwDelayLeft(st *State) (time.Duration, bool) {
	var end time.Time
	for _, d := range st.rwDead {
		delay, ok := w.delays[d.Session]
		at, seen := w.gone[d.Session]
		if !ok || !seen {
			return 200 * time.Millisecond, false
		}
		if e := at.Add(delay); e.After(end) {
			end = e
		}
	}
	if left := time.Until(end); left > 0 {
		return left, true
	}
	return 50 * time.Millisecond, false
}
