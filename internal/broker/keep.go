package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// lossReadTimeout bounds one read of a session's record that tells a loss
// its reason (and checkOwner's read). A loss's read is tried again until
// it answers: a Release elsewhere must never be told as a loss because
// this replica is slow to Consul (issue 41), and while it waits the hold
// sends no keepalive.
const lossReadTimeout = 5 * time.Second

// slowLossStep: a step of a loss notice (reading the key's listing, the
// record, sending `lost`) that takes longer is logged (warn).
const slowLossStep = 250 * time.Millisecond

// keep holds the grant until its outcome is decided, then carries it out.
// It returns nil after `lost` or `released`, and ctx's error when the
// client went away. Its frame is on the stack for the hold's life (see
// Acquire): what a case does beyond a call is in a method of its own.
func (h *hold) keep(ctx context.Context) error {
	k := h.newKeeper(ctx)
	defer k.stop()
	return k.loop(ctx, keepHooks{changed: h.sub.wake, checkLoss: k.checkLoss, conclude: h.conclude})
}

// keepHooks is what the keep loop needs from its kind of hold: a single
// key's (keep) or a multi-key hold's (multiHold.keep).
type keepHooks struct {
	changed   <-chan struct{}                      // the held keys' listings changed
	checkLoss func(context.Context)                // judge whether they show the hold lost
	conclude  func(context.Context, Outcome) error // carry out the decided outcome
}

// loop is the keep loop: it waits for what can decide the hold's outcome
// (each case a call), and returns once it is decided and carried out.
func (k *keeper) loop(ctx context.Context, hk keepHooks) error {
	h := k.h
	for {
		select {
		case <-h.life.Done():
			o, _ := h.life.Outcome()
			return hk.conclude(ctx, o)
		case <-k.canceled:
			k.canceled = nil
			k.streamEnded(ctx)
		case <-k.linger:
			h.life.End(Outcome{Kind: OutcomeCanceled})
		case <-k.shutdown:
			k.shutdown = nil
			h.life.End(Outcome{Kind: OutcomeShutdown})
		case <-k.cut:
			k.cut = nil
			k.cutOff()
		case d := <-k.renewed:
			k.deadline.Reset(time.Until(d))
			k.keepalive(ctx, d)
		case <-k.tick:
			k.keepalive(ctx, h.ren.safeUntil())
		case err := <-k.failed:
			k.renewalFailed(err)
		case <-k.deadline.C:
			k.pastDeadline()
		case <-hk.changed:
			hk.checkLoss(ctx)
		case o := <-k.lossRead:
			k.lossDecided(o)
		case <-k.recheck:
			k.recheck = nil
			hk.checkLoss(ctx)
		case <-h.guard.moved:
			h.checkOwner(ctx)
		}
	}
}

// renewalFailed ends the hold whose renewal failed for good.
func (k *keeper) renewalFailed(err error) {
	h := k.h
	if errors.Is(err, ErrSessionNotFound) {
		if h.sub != nil { // a single key's hold (a multi-key hold has a watch per key)
			// The key's watch should have told first (its loss bound is 1
			// s, a renewal comes every TTL/3): say how it was watched.
			h.b.log.Warn("session gone, noticed by its renewal before the key's watch",
				append([]zap.Field{zap.String("key", h.spec.Key), zap.String("session", h.session)}, h.sub.describe()...)...)
		}
		h.life.End(lost(LostSessionInvalidated, "the session no longer exists in Consul"))
		return
	}
	h.life.End(lost(LostRenewalFailed, err.Error()))
}

// pastDeadline ends the hold no renewal kept safe.
func (k *keeper) pastDeadline() {
	k.h.life.End(lost(LostRenewalFailed, fmt.Sprintf("no session renewal succeeded within the TTL (%s) less the safety margin; giving the hold up before Consul may grant it to another", k.h.ttl)))
}

// cutOff: this replica counts as cut off from Consul (see reach.go), so
// nothing it does can renew the session. The client is told to resume
// the hold on another replica, which can, while the session lives (see
// OutcomeCutOff in conclude). A hold whose connection is lost already
// waits for that resume anyway.
func (k *keeper) cutOff() {
	if !k.lingering {
		k.h.life.End(Outcome{Kind: OutcomeCutOff})
	}
}

// keeper is keep's state: the channels it selects on. Each of canceled,
// shutdown and cut is handled once (set to nil after): while a release is
// in flight the lifecycle defers the End, and a closed channel would
// otherwise fire again and again.
type keeper struct {
	h                  *hold
	canceled, shutdown <-chan struct{}
	cut                <-chan struct{} // the replica is cut off from Consul (broker-owned sessions only)
	renewed            <-chan time.Time
	failed             <-chan error
	deadline           *time.Timer
	ticker             *time.Ticker
	tick               <-chan time.Time
	linger             <-chan time.Time // set once the connection was lost
	lingering          bool
	// lossRead brings the outcome of a loss once the session's record
	// told its reason (see checkLoss); it is set while that read runs,
	// and the hold sends no keepalive meanwhile.
	lossRead  chan Outcome
	stopReads context.CancelFunc
	// recheck fires checkLoss again after a loss was seen while a Release
	// of this replica was in flight (see checkLoss).
	recheck <-chan time.Time
}

func (h *hold) newKeeper(ctx context.Context) *keeper {
	k := &keeper{h: h, canceled: ctx.Done(), shutdown: h.b.shutdown, deadline: time.NewTimer(time.Hour)}
	k.deadline.Stop()
	if h.ren != nil {
		k.renewed, k.failed = h.ren.renewed, h.ren.failed
		k.cut = h.b.reach.lost()
		k.deadline.Reset(time.Until(h.ren.safeUntil()))
		// Renewals (every TTL/3) send the keepalives; when they are too
		// far apart for the promise bound, a ticker sends more.
		if every := h.b.promiseBound / 3; every > 0 && h.ttl/3 > every {
			k.ticker = time.NewTicker(every)
			k.tick = k.ticker.C
		}
	}
	return k
}

func (k *keeper) stop() {
	if k.stopReads != nil {
		k.stopReads()
	}
	k.deadline.Stop()
	if k.ticker != nil {
		k.ticker.Stop()
	}
}

// streamEnded decides what the end of the stream means: a cancel ends the
// hold; a lost connection keeps it until the last promised deadline (see
// link.go), and so does a resume cancelled right after its grant: a
// library gives a resume attempt a few seconds (the Go one 3 s), and one
// whose `acquired` came just late cancels the stream and tries elsewhere,
// still believing it holds the lock (issue 41). Released at once, the key
// would be free while the client still counts on its deadline; kept, it
// is resumed on the next replica (which fences this copy) or released when
// the promise ends.
func (k *keeper) streamEnded(ctx context.Context) {
	h := k.h
	if !disconnected(ctx) && !(h.spec.Resume != nil && time.Since(h.grantSeen()) < resumeSettle) {
		h.life.End(Outcome{Kind: OutcomeCanceled})
		return
	}
	until := h.lingerUntil()
	h.b.log.Debug("stream ended without giving the hold up; keeping it until its promise ends", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Time("until", until))
	k.lingering = true
	k.linger = time.After(time.Until(until))
}

// keepalive tells the client how long the hold is safe (nobody listens
// once the connection is lost).
func (k *keeper) keepalive(ctx context.Context, safeUntil time.Time) {
	h := k.h
	if k.lingering || k.lossRead != nil {
		return
	}
	if h.send(Event{Kind: EventKeepalive, GuaranteedFor: h.promise(safeUntil), Sequencer: h.grant()}) != nil {
		k.canceled = nil // the stream is broken: decide now
		k.streamEnded(ctx)
	}
}

// releaseRecheck: see checkLoss.
const releaseRecheck = 10 * time.Millisecond

// resumeSettle: a resumed hold whose stream is cancelled sooner after its
// grant is kept as after a lost connection (see streamEnded).
const resumeSettle = 2 * time.Second

func lost(r LostReason, detail string) Outcome {
	return Outcome{Kind: OutcomeLost, Reason: r, Detail: detail}
}

// checkLoss looks at the key's newest listing. One that shows the hold
// lost starts readLoss, which decides on a consistent read; one that
// leaves the hold in place is followed for its value. A loss seen while
// a Release of this replica is in flight (most often that release's own
// write) is looked at again every releaseRecheck until the release is
// done: a release that did not happen leaves the hold held, and the loss
// is then decided (issue 41: the wake-up was dropped, and a hold whose
// release failed because its key had just been taken kept sending
// keepalives).
func (k *keeper) checkLoss(ctx context.Context) {
	h := k.h
	if k.lossRead != nil {
		return // a loss is being read already
	}
	seq := h.grant()
	st, began := h.sub.newest()
	if st == nil || (st.Index < seq.Token && !began.After(h.grantSeen())) {
		return // older than the grant
	}
	if isLost, _, _ := h.loss(st, seq); !isLost {
		h.followValue(st)
		return
	}
	switch h.life.Phase() {
	case PhaseReleasing:
		k.recheck = time.After(releaseRecheck)
		return
	case PhaseEnded:
		return // decided meanwhile (a release of this replica, say)
	}
	if age := h.sub.listingAge(); age > slowLossStep {
		h.b.log.Warn("a lost hold read its key's listing late", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Duration("listing_age", age))
	}
	rctx, cancel := context.WithCancel(ctx)
	k.stopReads, k.lossRead = cancel, make(chan Outcome, 1)
	h.b.holds.Add(1)
	go func() {
		defer h.b.holds.Done()
		k.lossRead <- h.readLoss(rctx, seq)
	}()
}

// lossDecided carries out the loss readLoss read: none (a listing older than
// the read, say) lets the hold go on.
func (k *keeper) lossDecided(o Outcome) {
	if o.Kind == 0 {
		k.stopReads()
		k.lossRead, k.stopReads = nil, nil
		return
	}
	k.h.life.End(o)
}

// loss says whether st shows the hold lost, and why.
func (h *hold) loss(st *State, seq Sequencer) (bool, LostReason, string) {
	if h.sem {
		return semaphoreLoss(st, seq, h.limit)
	}
	return lockLoss(st, seq)
}

// readLoss reads the key's state and the session's record, consistently,
// until they answer (each read bounded by lossReadTimeout), and decides
// the loss on them (see lossOutcome); the zero Outcome when the hold is
// not lost after all. The listing alone cannot tell a Release on another
// replica from a loss, and a guess would tell a released hold it was lost
// (issue 41: it guessed after 500 ms). Were Consul to stop answering, the
// hold ends otherwise meanwhile (its replica cut off, its renewals
// failing).
func (h *hold) readLoss(ctx context.Context, seq Sequencer) Outcome {
	began := time.Now()
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, lossReadTimeout)
		st, rec, err := h.b.readHold(rctx, seq.Key, seq.Session)
		cancel()
		if err == nil {
			if d := time.Since(began); d > slowLossStep {
				h.b.log.Warn("slow read of a lost hold's record", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Duration("took", d), zap.Int("attempts", attempt+1))
			}
			isLost, reason, detail := h.loss(st, seq)
			if !isLost {
				return Outcome{}
			}
			if st.Index < seq.Token {
				// Read after the grant, at a lower index: Consul's index
				// went back, a new history (see history.go).
				detail += "; Consul's index went back below the grant's token (a snapshot restore?)"
				h.b.hub.newHistory()
			}
			return h.lossOutcome(rec, seq, lost(reason, detail))
		}
		if ctx.Err() != nil {
			return Outcome{}
		}
		backoff(ctx, attempt)
	}
}

// followValue notes the hold's value as it now is in Consul (a SetValue
// through any replica changes it; an unlock writes it back unchanged).
func (h *hold) followValue(st *State) {
	target := st.Key
	if h.sem {
		target = contenderKey(st.Key, h.session)
	}
	if e := st.entry(target); e != nil {
		h.mu.Lock()
		h.value = e.Value
		h.mu.Unlock()
	}
}

// checkOwner reads the session's record after the sweeper saw it move:
// another replica that resumed the hold owns it now.
func (h *hold) checkOwner(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, lossReadTimeout)
	defer cancel()
	rec, err := h.b.readRecord(rctx, h.session)
	switch {
	case err != nil:
		return
	case rec.index != 0 && rec.Owner != h.owner:
		h.life.End(Outcome{Kind: OutcomeResumed})
	default:
		h.guard.index.Store(rec.index)
	}
}

// lossOutcome refines a loss with the session's record: a record owned by
// another replica means the hold was resumed there; a record no longer
// held by its session means the session ended; a live record without the
// key means a Release (on another replica) ended it. Otherwise the
// state's reason stands.
func (h *hold) lossOutcome(rec *record, seq Sequencer, o Outcome) Outcome {
	_, listed := rec.Holds[seq.Key]
	switch {
	case h.owned && rec.index != 0 && rec.Owner != h.owner:
		return Outcome{Kind: OutcomeResumed}
	case rec.index == 0 || !rec.live:
		return lost(LostSessionInvalidated, "the session was destroyed or invalidated in Consul ("+o.Detail+")")
	case !listed:
		return Outcome{Kind: OutcomeReleased}
	}
	return o
}

// conclude carries out the outcome: tell the client first, then clean up
// in Consul (fenced by the session's record).
func (h *hold) conclude(ctx context.Context, o Outcome) error {
	seq := h.grant()
	switch o.Kind {
	case OutcomeReleased:
		err := h.send(Event{Kind: EventReleased, Sequencer: seq})
		if !h.recycle(true) {
			h.finish(true)
		}
		return err
	case OutcomeCanceled:
		released := h.handOffOnCancel()
		if !h.recycle(released) {
			h.finish(released)
		}
		return ctx.Err()
	case OutcomeResumed:
		h.b.log.Info("hold resumed on another replica", zap.String("key", seq.Key), zap.String("session", seq.Session))
		return h.sendLost(LostResumedElsewhere, "the hold was resumed on another broker replica; this stream ends without touching it")
	case OutcomeShutdown:
		// The promise never reaches past the drain: holds nobody resumed
		// are released when it ends.
		until := h.b.drainDeadline()
		if h.ren != nil && h.ren.safeUntil().Before(until) {
			until = h.ren.safeUntil()
		}
		var err error
		if !mutantNoLossNotice {
			err = h.send(Event{Kind: EventLost, Reason: LostBrokerShutdown, Sequencer: h.grant(), GuaranteedFor: h.promise(until),
				Detail: "the broker is shutting down; resume the hold on another replica with this sequencer before guaranteed_for runs out"})
		}
		h.drain(ctx)
		return err
	case OutcomeCutOff:
		// Only a renewal can extend the promise, and renewals cannot
		// reach Consul from here: the client resumes elsewhere, or stops,
		// by the last safe deadline.
		until := h.ren.safeUntil()
		h.b.log.Info("hold told to resume on another replica: this one is cut off from Consul", zap.String("key", seq.Key), zap.String("session", seq.Session), zap.Time("safe_until", until))
		var err error
		if !mutantNoLossNotice {
			err = h.send(Event{Kind: EventLost, Reason: LostReplicaCutOff, Sequencer: seq, GuaranteedFor: h.promise(until),
				Detail: "this broker replica is cut off from its Consul agent and cannot renew the session; resume the hold on another replica with this sequencer before guaranteed_for runs out"})
		}
		h.keepForResume(ctx, until)
		return err
	}
	h.b.log.Info("hold lost", zap.String("key", seq.Key), zap.String("session", seq.Session), zap.Stringer("reason", o.Reason), zap.String("detail", o.Detail))
	if mutantNoLossNotice {
		// The mutant's bug: the stream stays open and says nothing.
		select {
		case <-ctx.Done():
		case <-h.b.shutdown:
		}
		h.finish(false)
		return ctx.Err()
	}
	began := time.Now()
	err := h.sendLost(o.Reason, o.Detail)
	if d := time.Since(began); d > slowLossStep {
		h.b.log.Warn("slow send of `lost`", zap.String("key", seq.Key), zap.String("session", seq.Session), zap.Duration("took", d), zap.Error(err))
	}
	if o.Reason == LostRenewalFailed {
		// Consul is unreachable: clean up in the background, briefly.
		h.b.holds.Add(1)
		go func() { defer h.b.holds.Done(); h.finish(false) }()
		return err
	}
	h.finish(false)
	return err
}

func (h *hold) sendLost(r LostReason, detail string) error {
	if mutantNoLossNotice {
		return nil
	}
	return h.send(Event{Kind: EventLost, Reason: r, Detail: detail, Sequencer: h.grant()})
}

// keepForResume keeps a hold whose replica is cut off from Consul until
// the client closes its stream (having resumed the hold elsewhere, or
// given it up), or the hold's last promise has passed (for a lost
// connection, in any case); then it ends the hold as after a cancel,
// fenced by the record: a hold resumed elsewhere is not touched.
func (h *hold) keepForResume(ctx context.Context, until time.Time) {
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-ctx.Done():
		if disconnected(ctx) {
			<-t.C
		}
	case <-t.C:
	case <-h.b.drained: // the broker shut down: as drain does
	}
	if !h.b.abandoning() {
		h.finish(false)
	}
}

// drain keeps a hold whose broker is shutting down until the client has
// had the drain time to resume it elsewhere (or closed the stream), then
// releases it unless it was resumed: the record's guard decides.
// A lost connection is not a client giving up: the hold is kept for the
// whole drain, which is what the client was promised.
func (h *hold) drain(ctx context.Context) {
	select {
	case <-ctx.Done():
		if disconnected(ctx) {
			<-h.b.drained
		}
	case <-h.b.drained:
	}
	if !h.b.abandoning() {
		h.finish(false)
	}
}
