package broker

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// watchDelay is how long a hold's new watch waits before it starts (see
// subscribeLazy).
const watchDelay = 200 * time.Millisecond

// subscribe returns a subscription to key, starting a watch if needed.
func (h *hub) subscribe(key string) *sub { return h.subscribeAt(key, false) }

// subscribeLazy is subscribe for a hold: a new watch starts only after
// watchDelay, or as soon as the subscriber needs it (activate: a waiter),
// so that a short uncontended hold costs Consul no query at all. Its
// grant needs no state (the granting transaction checks the key), and
// until its watch starts its key is checked every youngEvery (young.go),
// so that its loss is noticed as soon as an older hold's.
func (h *hub) subscribeLazy(key string) *sub { return h.subscribeAt(key, true) }

// start starts a pending watch when its subscribers need it: unless
// nobody wants it any more, or every subscriber is still a young hold
// (each checked every youngEvery, young.go) that has not asked for it
// (activate); then it starts when the first of them stops being young.
// On a hot key passed from young hold to young hold (a hand-off chain),
// the watch so stays pending, where starting it when the key's first
// hold stopped being young, long gone, ran a blocking query that Consul
// answered at each hand-off, in the same moment as the hand-off's
// transaction (on a busy agent it slows that transaction by a third or
// more).
func (h *hub) start(kw *keyWatch, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if kw.startGen == gen {
		kw.startTimer = nil
	}
	if !kw.pending || h.watches[kw.key] != kw {
		return
	}
	kw.mu.Lock()
	idle := len(kw.subs) == 0
	until, young := kw.youngUntilLocked(time.Now())
	kw.mu.Unlock()
	switch {
	case idle:
		delete(h.watches, kw.key)
	case young:
		h.startAfterLocked(kw, until)
	default:
		h.startLocked(kw)
	}
}

// startAfterLocked has start called at t (once: an earlier schedule is
// replaced; its number, startGen, tells start whether it is still the
// key's current one).
func (h *hub) startAfterLocked(kw *keyWatch, t time.Time) {
	if kw.startTimer != nil {
		kw.startTimer.Stop()
	}
	kw.startGen++
	gen := kw.startGen
	kw.startTimer = time.AfterFunc(time.Until(t), func() { h.start(kw, gen) })
}

// youngUntilLocked reports whether every subscriber is a young hold at
// now, and then when the first of them stops being one. Under kw.mu.
func (kw *keyWatch) youngUntilLocked(now time.Time) (time.Time, bool) {
	var until time.Time
	for s := range kw.subs {
		if !s.young.After(now) {
			return time.Time{}, false
		}
		if until.IsZero() || s.young.Before(until) {
			until = s.young
		}
	}
	return until, !until.IsZero()
}

// startLocked makes a pending watch dedicated (within the budget) or
// swept.
func (h *hub) startLocked(kw *keyWatch) {
	if !kw.pending || h.closed {
		return
	}
	kw.pending = false
	if h.dedicated >= h.maxDedicated {
		h.preemptLocked()
	}
	if h.dedicated < h.maxDedicated {
		kw.dedicated = true
		h.dedicated++
		ctx, cancel := context.WithCancel(h.ctx)
		r := &dedicatedRun{cancel: cancel}
		h.running[kw] = r
		h.wg.Go(func() { kw.run(ctx, r) })
	} else {
		h.kickLocked()
	}
}

// preemptLocked ends one dedicated query that nobody needs any more (it
// lingers until it returns, see hub.go), so that a key that is wanted now
// gets its slot: its connection closes with it.
func (h *hub) preemptLocked() {
	for kw, r := range h.running {
		kw.mu.Lock()
		idle := len(kw.subs) == 0
		kw.mu.Unlock()
		if !idle {
			continue
		}
		r.cancel()
		delete(h.running, kw)
		h.dedicated--
		if h.watches[kw.key] == kw {
			delete(h.watches, kw.key)
		}
		return
	}
}

// dedicatedRun is one dedicated query loop of a key. A parked key may
// start its next loop before the parked one has returned: each loop
// counts itself out only while it is still the key's current one, so that
// the old loop never ends its successor (the key would stay dedicated
// with no query: blind to every change until the replica restarts).
type dedicatedRun struct{ cancel context.CancelFunc }

// activate starts the subscriber's watch now if it is still pending.
func (s *sub) activate() {
	h := s.kw.h
	s.kw.mu.Lock()
	s.young = time.Time{}
	s.kw.mu.Unlock()
	h.mu.Lock()
	h.startLocked(s.kw)
	h.mu.Unlock()
}

// park stops a dedicated watch whose subscribers are all young lazy holds
// (a hot key cycled by short holds would otherwise keep a blocking query
// running, answering every grant and release): it goes back to pending
// and starts again when the first of its holds is no longer young (a
// hold that stops being young is no longer checked, so its watch must
// run from then: see start). It reports
// whether it did; the caller's query loop (r) then ends.
func (kw *keyWatch) park(r *dedicatedRun) bool {
	h := kw.h
	h.mu.Lock()
	defer h.mu.Unlock()
	kw.mu.Lock()
	until, young := kw.youngUntilLocked(time.Now())
	for s := range kw.subs {
		young = young && !s.waiting
	}
	kw.mu.Unlock()
	if !young || h.watches[kw.key] != kw {
		return false
	}
	kw.dedicated, kw.pending = false, true
	if h.running[kw] == r { // counted out here: a restart may come before run's return
		r.cancel()
		delete(h.running, kw)
		h.dedicated--
	}
	h.startAfterLocked(kw, until) // the first of them to stop being young needs the watch
	return true
}

// Watch modes of a key, as modeLocked names them.
const (
	modeSwept     = "swept"
	modeDropped   = "dropped" // no longer the hub's watch of its key
	modePending   = "pending"
	modeDedicated = "dedicated"
	modeBlind     = "dedicated, no query" // never expected (see dedicatedRun)
)

// modeLocked says how kw's key is watched. h.mu is held.
func (h *hub) modeLocked(kw *keyWatch) string {
	switch {
	case h.watches[kw.key] != kw:
		return modeDropped
	case kw.pending:
		return modePending
	case kw.dedicated && h.running[kw] != nil:
		return modeDedicated
	case kw.dedicated:
		return modeBlind
	}
	return modeSwept
}

// describe says how the subscriber's key is watched, for a log line.
func (s *sub) describe() []zap.Field {
	kw := s.kw
	h := kw.h
	h.mu.Lock()
	how := h.modeLocked(kw)
	h.mu.Unlock()
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return []zap.Field{zap.String("watch", how), zap.Uint64("listing_index", kw.index),
		zap.Duration("listing_age", time.Since(kw.published)), zap.Bool("young", s.young.After(time.Now())),
		zap.Uint64("unread", s.seen-s.read)}
}

// listingAge is how long ago the subscriber's key was last published.
func (s *sub) listingAge() time.Duration {
	s.kw.mu.Lock()
	defer s.kw.mu.Unlock()
	return time.Since(s.kw.published)
}
