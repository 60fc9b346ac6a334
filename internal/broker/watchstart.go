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

// start starts a pending watch (unless nobody wants it any more).
func (h *hub) start(kw *keyWatch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kw.mu.Lock()
	idle := len(kw.subs) == 0
	kw.mu.Unlock()
	if idle && kw.pending && h.watches[kw.key] == kw {
		delete(h.watches, kw.key)
		return
	}
	h.startLocked(kw)
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
// and starts again when the youngest hold is no longer young. It reports
// whether it did; the caller's query loop (r) then ends.
func (kw *keyWatch) park(r *dedicatedRun) bool {
	h := kw.h
	h.mu.Lock()
	defer h.mu.Unlock()
	kw.mu.Lock()
	var until time.Time
	young := len(kw.subs) > 0
	for s := range kw.subs {
		if s.waiting || !s.young.After(time.Now()) {
			young = false
			break
		}
		if s.young.After(until) {
			until = s.young
		}
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
	time.AfterFunc(time.Until(until), func() { h.start(kw) })
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
