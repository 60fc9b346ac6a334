package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// hold is one Acquire from request to end.
type hold struct {
	b    *Broker
	spec AcquireSpec
	send func(Event) error

	session string
	owned   bool // the broker renews and destroys the session
	del     bool // the session has DELETE behavior: ending the hold deletes the key
	ttl     time.Duration
	start   time.Time // when the session was created or last renewed
	sem     bool
	limit   uint32

	sub *sub
	ren *renewer
	// value is the holder's value as last seen in Consul (SetValue may
	// change it); a release writes it back unchanged.
	value  []byte
	handle *holdHandle
}

// Acquire runs one hold: it waits for the key, reports the grant, keeps the
// session alive and watches for loss until ctx ends, the hold is released,
// or it is lost. Events go to send; an error from send ends the hold. It
// returns nil after `lost` or `released`, ctx's error when the caller went
// away, and a domain error when the key could not be held.
func (b *Broker) Acquire(ctx context.Context, spec AcquireSpec, send func(Event) error) error {
	b.mu.Lock()
	select {
	case <-b.shutdown:
		b.mu.Unlock()
		return ErrShutdown
	default:
	}
	b.holds.Add(1)
	b.mu.Unlock()
	defer b.holds.Done()

	h := &hold{b: b, spec: spec, send: send, sem: spec.Limit > 1, limit: max(spec.Limit, 1), value: spec.Value}
	if err := h.openSession(ctx); err != nil {
		return err
	}
	h.sub = b.hub.subscribe(spec.Key)
	defer h.sub.close()

	rctx, stopRenew := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopRenew(); wg.Wait() }()
	if h.owned {
		h.ren = newRenewer(b.store, h.session, h.ttl, h.start)
		wg.Go(func() { h.ren.run(rctx) })
	}

	seq, resumed, err := h.obtain(ctx)
	if err != nil {
		h.abandon()
		return err
	}
	h.sub.setTerm(seq)
	h.sub.want(seq.Token) // see the first listing at or after the grant
	h.handle = b.register(spec.Key, h.session)
	h.handle.seq = *seq
	defer b.unregister(spec.Key, h.session, h.handle)
	if err := send(Event{Kind: EventAcquired, Sequencer: *seq, GuaranteedFor: h.guaranteed(), Resumed: resumed}); err != nil {
		h.finish()
		return err
	}
	return h.keep(ctx, seq)
}

// openSession creates, checks or resumes the hold's session.
func (h *hold) openSession(ctx context.Context) error {
	s := h.spec
	switch {
	case s.Resume != nil:
		if s.Resume.Key != s.Key {
			return fmt.Errorf("%w: resume.key %q differs from key %q", ErrInvalid, s.Resume.Key, s.Key)
		}
		// Renew first: the replica that renewed it last is gone, so only a
		// renewal of our own tells how long the session is safe.
		h.start = time.Now()
		info, err := h.b.store.RenewSession(ctx, s.Resume.Session)
		if err != nil {
			return err
		}
		h.session, h.owned, h.ttl, h.del = info.ID, true, info.TTL, info.Delete
		if h.ttl <= 0 {
			return fmt.Errorf("%w: session %s has no TTL; only broker-owned sessions can be resumed", ErrInvalid, info.ID)
		}
	case s.SessionID != "":
		info, err := h.b.store.Session(ctx, s.SessionID)
		if err != nil {
			return err
		}
		h.session, h.ttl, h.del = info.ID, info.TTL, info.Delete
	default:
		spec := withDefaults(s.NewSession)
		if err := validateSpec(spec); err != nil {
			return err
		}
		h.start = time.Now()
		id, err := h.b.store.CreateSession(ctx, spec)
		if err != nil {
			return err
		}
		h.session, h.owned, h.ttl, h.del = id, true, spec.TTL, spec.Delete
	}
	return nil
}

// guaranteed is how long the hold is safe from now (0 when unknown).
func (h *hold) guaranteed() time.Duration {
	if h.ren == nil {
		return 0
	}
	return max(time.Until(h.ren.safeUntil()), 0)
}

// obtain waits for the grant (or checks a resumed one).
func (h *hold) obtain(ctx context.Context) (*Sequencer, bool, error) {
	if h.spec.Resume != nil {
		seq, err := h.b.checkResume(ctx, *h.spec.Resume, h.limit)
		return seq, true, err
	}
	if h.sem {
		if err := h.b.enterSemaphore(ctx, h.spec.Key, h.session, h.spec.Value); err != nil {
			return nil, false, err
		}
	}
	seq, err := h.wait(ctx)
	return seq, false, err
}

// wait is the waiting loop: attempt, and when busy, report who is in the
// way and sleep until the key changes (one shared blocking query), the
// lock-delay ends, or the wait times out.
func (h *hold) wait(ctx context.Context) (*Sequencer, error) {
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
	st, _ := h.sub.state()
	var (
		queued      *State
		delays      = map[string]time.Duration{} // lock-delay of holders seen
		lastHolders []Holder
		freedAt     time.Time
		races       int
	)
	fresh := false // st comes from a consistent read made just now
	for {
		seq, err := h.attempt(ctx, st)
		var delayLeft time.Duration
		switch {
		case seq != nil:
			return seq, nil
		case errors.Is(err, errNoContender) && fresh:
			return nil, fmt.Errorf("%w: this request's contender entry %q was removed while it waited", ErrAborted, contenderKey(h.spec.Key, h.session))
		case errors.Is(err, errRace), errors.Is(err, errNoContender):
			races++
			if races > 1000 {
				return nil, fmt.Errorf("%w: too many races on %q", ErrAborted, h.spec.Key)
			}
			st, err = h.read(ctx)
			if err != nil {
				return nil, err
			}
			fresh = true
			continue
		case errors.Is(err, errLockDelay):
			delayLeft = 200 * time.Millisecond // unknown: poll
			known := false
			for _, prev := range lastHolders {
				if d, ok := delays[prev.Session]; ok && !freedAt.IsZero() {
					delayLeft, known = max(time.Until(freedAt.Add(d)), 10*time.Millisecond), true
				}
			}
			if h.tryOnce() {
				if !known {
					return nil, fmt.Errorf("%w: key %q is in Consul's lock-delay (its end is unknown to this broker)", ErrBusy, h.spec.Key)
				}
				return nil, fmt.Errorf("%w: key %q is in Consul's lock-delay for about %s more", ErrBusy, h.spec.Key, delayLeft.Round(time.Millisecond))
			}
		case err != nil:
			return nil, err
		case h.tryOnce():
			return nil, holdersError(ErrBusy, ReasonLockHeld, st)
		}
		// Learn the holders' lock-delay before telling the client it waits:
		// once a holder's session is gone it can no longer be read.
		if st != nil && !h.sem {
			for _, hd := range st.Holders {
				if _, ok := delays[hd.Session]; !ok {
					if d, ok := h.sub.holderDelay(ctx, hd.Session); ok {
						delays[hd.Session] = d
					}
				}
			}
		}
		if st != nil && (queued == nil || !sameHolders(st, queued) || delayLeft > 0) {
			queued = st
			if err := h.send(Event{Kind: EventQueued, State: st, LockDelayRemaining: delayLeft, Session: h.session}); err != nil {
				return nil, err
			}
		}
		var delayTimer <-chan time.Time
		if delayLeft > 0 {
			delayTimer = time.After(delayLeft)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-h.b.shutdown:
			return nil, ErrShutdown
		case <-timeout:
			return nil, holdersError(ErrTimeout, ReasonWaitTimeout, st)
		case err := <-failed:
			return nil, fmt.Errorf("%w: the session was lost while waiting: %v", ErrAborted, err)
		case <-delayTimer:
			fresh = false
		case <-h.sub.wake:
			next, _ := h.sub.state()
			fresh = false
			if next != nil {
				if st != nil && len(st.Holders) > 0 && len(next.Holders) == 0 {
					lastHolders, freedAt = st.Holders, time.Now()
				}
				st = next
			}
		}
	}
}

func (h *hold) tryOnce() bool { return !h.spec.WaitForever && h.spec.Wait == 0 }

// attempt makes one try on state st.
func (h *hold) attempt(ctx context.Context, st *State) (*Sequencer, error) {
	if h.sem {
		if st == nil {
			return nil, errRace
		}
		return h.b.trySemaphore(ctx, h.spec.Key, h.limit, h.session, st, h.spec.Fair)
	}
	return h.b.tryLock(ctx, h.spec.Key, h.spec.Value, h.session, st)
}

// read is a consistent read of the key's state.
func (h *hold) read(ctx context.Context) (*State, error) {
	return h.b.readState(ctx, h.spec.Key)
}

// keep holds the grant until it ends. It returns nil after `lost` or
// `released`.
func (h *hold) keep(ctx context.Context, seq *Sequencer) error {
	var (
		renewed  <-chan time.Time
		failed   <-chan error
		deadline <-chan time.Time
	)
	if h.ren != nil {
		renewed, failed = h.ren.renewed, h.ren.failed
		deadline = time.After(time.Until(h.ren.safeUntil()))
	}
	lost := func(r LostReason, detail string) error {
		h.b.log.Info("hold lost", zap.String("key", seq.Key), zap.String("session", seq.Session), zap.Int("reason", int(r)), zap.String("detail", detail))
		err := h.send(Event{Kind: EventLost, Reason: r, Detail: detail, Sequencer: *seq})
		switch r {
		case LostBrokerShutdown:
			// keep the session: the client may resume it elsewhere
		case LostRenewalFailed:
			// Consul is unreachable: try to clean up briefly, in the
			// background, so the stream ends now.
			h.b.holds.Add(1)
			go func() { defer h.b.holds.Done(); h.finish() }()
		default:
			h.finish()
		}
		return err
	}
	for {
		select {
		case <-ctx.Done():
			h.finish()
			return ctx.Err()
		case <-h.b.shutdown:
			return lost(LostBrokerShutdown, fmt.Sprintf("the broker is shutting down; the session stays valid for up to its TTL (%s): resume it on another replica with this sequencer", h.ttl))
		case d := <-renewed:
			deadline = time.After(time.Until(d))
			if err := h.send(Event{Kind: EventKeepalive, GuaranteedFor: max(time.Until(d), 0), Sequencer: *seq}); err != nil {
				h.finish()
				return err
			}
		case err := <-failed:
			if errors.Is(err, ErrSessionNotFound) {
				return lost(LostSessionInvalidated, "the session no longer exists in Consul")
			}
			return lost(LostRenewalFailed, err.Error())
		case <-deadline:
			return lost(LostRenewalFailed, fmt.Sprintf("no session renewal succeeded within the TTL (%s) less the safety margin; giving the hold up before Consul may grant it to another", h.ttl))
		case <-h.handle.released:
			return h.released(ctx, seq)
		case <-h.sub.wake:
			st, _ := h.sub.state()
			if st == nil || st.Index < seq.Token {
				continue // older than the grant
			}
			isLost, reason, detail := h.lossIn(st, seq)
			if !isLost {
				if hd, ok := st.holder(seq.Session); ok {
					h.value = hd.Value
				}
				continue
			}
			if h.releasedByAPI(ctx, seq) {
				return h.released(ctx, seq)
			}
			if reason != LostLimitConflict {
				if _, err := h.b.store.Session(ctx, seq.Session); errors.Is(err, ErrSessionNotFound) {
					reason, detail = LostSessionInvalidated, "the session was destroyed or invalidated in Consul ("+detail+")"
				}
			}
			return lost(reason, detail)
		}
	}
}

// released ends a hold that Release ended (the key is already released):
// it tells the client and destroys a broker-owned session.
func (h *hold) released(_ context.Context, seq *Sequencer) error {
	err := h.send(Event{Kind: EventReleased, Sequencer: *seq})
	if h.owned {
		cctx, cancel := cleanupContext()
		h.destroy(cctx)
		cancel()
	}
	return err
}

// lossIn says whether st shows the hold lost.
func (h *hold) lossIn(st *State, seq *Sequencer) (bool, LostReason, string) {
	if h.sem {
		return semaphoreLoss(st, seq, h.limit)
	}
	isLost, gone, detail := lockLoss(st, seq)
	if gone {
		return isLost, LostDeletedByOther, detail
	}
	return isLost, LostReleasedByOther, detail
}

// releasedByAPI reports whether the change that ended the hold was a
// Release call (on this replica or another).
func (h *hold) releasedByAPI(ctx context.Context, seq *Sequencer) bool {
	select {
	case <-h.handle.released:
		return true
	default:
	}
	h.handle.mu.Lock()
	releasing := h.handle.releasing
	h.handle.mu.Unlock()
	if releasing {
		select {
		case <-h.handle.released:
			return true
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return false
	}
	return h.b.takeMarker(ctx, seq.Key, seq.Session)
}

// abandon cleans up after a request that never got its grant.
func (h *hold) abandon() {
	ctx, cancel := cleanupContext()
	defer cancel()
	// Destroy first: a contender write that the cancelled request left in
	// flight fails once the session is gone, so the removal below is final.
	if h.owned && h.spec.Resume == nil {
		h.destroy(ctx)
	}
	if h.sem && h.session != "" {
		if _, err := h.b.leaveSemaphore(ctx, h.spec.Key, h.session, nil); err != nil {
			h.b.log.Warn("cannot remove contender entry", zap.String("key", h.spec.Key), zap.Error(err))
		}
	}
}

// finish ends a hold that was granted: a broker-owned session's hold is
// released and the session destroyed. A client-owned session's hold
// outlives the stream. (On broker shutdown finish is not called: the
// session is left for the client to resume elsewhere.)
func (h *hold) finish() {
	if !h.owned {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	if h.sem {
		if _, err := h.b.leaveSemaphore(ctx, h.spec.Key, h.session, nil); err != nil {
			h.b.log.Warn("cannot leave semaphore", zap.String("key", h.spec.Key), zap.Error(err))
		}
	} else if _, err := h.b.store.Txn(ctx, unlockOps(h.spec.Key, h.session, h.value, h.del)); err != nil {
		var te *TxnError
		if !errors.As(err, &te) { // a rolled-back unlock means it was no longer ours
			h.b.log.Warn("cannot release lock", zap.String("key", h.spec.Key), zap.Error(err))
		}
	}
	h.destroy(ctx)
}

func (h *hold) destroy(ctx context.Context) {
	if err := h.b.store.DestroySession(ctx, h.session); err != nil {
		h.b.log.Warn("cannot destroy session; it expires with its TTL", zap.String("session", h.session), zap.Error(err))
	}
}
