package broker

import (
	"context"
	"time"
)

// Young holds and the loss bound.
//
// A hold's watch starts watchDelay after it subscribed (see
// subscribeLazy), so that a short uncontended hold costs Consul no query.
// Until then nothing watched its key, and a loss in that window was heard
// when the watch's first listing came: about 200 ms after the session was
// destroyed, against 2.5 ms for an older hold (issue 41, finding 7). So
// every youngEvery, while a granted hold waits for its watch, one
// read-only transaction checks that each such key is still locked by its
// hold's session (a check-session op per hold: the lock key, or a
// semaphore's contender entry); a hold whose check fails starts its watch
// at once, whose first listing tells the loss. The cost is one read-only
// transaction per youngEvery while young holds exist, whatever their
// number (up to MaxTxnOps per transaction), and none for a hold released
// before the next tick.
const youngEvery = 5 * time.Millisecond

// youngFirst: a young hold is checked from this long after its grant (a
// short hold, as in an uncontended cycle, is released before).
const youngFirst = 2 * time.Millisecond

// youngCheck is a young hold's check, and when it was granted.
type youngCheck struct {
	op      Op
	granted time.Time
}

// checkYoung has s's key checked every youngEvery while s is a young
// hold (see watchstart.go) and its key's watch is pending (not started
// yet, or parked): key must stay locked by session.
func (s *sub) checkYoung(key, session string) {
	h := s.kw.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if h.young == nil {
		h.young = make(map[*sub]youngCheck)
	}
	h.young[s] = youngCheck{Op{Verb: OpCheckSession, Key: key, Session: session}, time.Now()}
	if !h.youngRunning {
		h.youngRunning = true
		h.wg.Go(func() { h.checkYoungLoop(h.ctx) })
	}
}

// checkYoungLoop runs while young holds exist.
func (h *hub) checkYoungLoop(ctx context.Context) {
	t := time.NewTicker(youngEvery)
	defer t.Stop()
	var checks checkBatches[*sub]
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !h.youngChecks(&checks) {
			return
		}
		for _, s := range failedOwners(ctx, h, &checks) {
			if s.letGo() {
				// Its release (or hand-off) changed the key under the
				// check: no loss to hear, and no watch wanted for it.
				continue
			}
			s.activate()
		}
	}
}

// youngChecks gathers the checks of the young holds whose watch is
// pending, and forgets the holds no longer young. It reports false, the
// loop ending, when there are none left.
func (h *hub) youngChecks(checks *checkBatches[*sub]) bool {
	checks.reset()
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for s, c := range h.young {
		kw := s.kw
		kw.mu.Lock()
		_, subscribed := kw.subs[s]
		young := s.young.After(now)
		kw.mu.Unlock()
		switch {
		case !subscribed || !young || h.watches[kw.key] != kw:
			delete(h.young, s) // ended, or watched from now on
		case kw.pending && now.Sub(c.granted) >= youngFirst:
			checks.add(s, c.op)
		}
	}
	if len(h.young) == 0 {
		h.youngRunning = false // the next young hold starts the loop again
		return false
	}
	return true
}

// letGo says whether the subscriber is a hold that no longer holds its
// key by its own doing: releasing it, or ended.
func (s *sub) letGo() bool {
	s.kw.mu.Lock()
	h := s.holder
	s.kw.mu.Unlock()
	if h == nil {
		return false
	}
	p := h.life.Phase()
	return p == PhaseReleasing || p == PhaseEnded
}
