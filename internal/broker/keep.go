package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// lossReadTimeout bounds the reads that tell a loss's reason; without an
// answer in time the loss is reported with the reason the state shows.
const lossReadTimeout = 500 * time.Millisecond

// slowLossStep: a step of a loss notice (reading the key's listing, the
// record, sending `lost`) that takes longer is logged (warn).
const slowLossStep = lossReadTimeout / 2

// keep holds the grant until its outcome is decided, then carries it out.
// It returns nil after `lost` or `released`, and ctx's error when the
// client went away. Its frame is on the stack for the hold's life (see
// Acquire): what a case does beyond a call is in a method of its own.
func (h *hold) keep(ctx context.Context) error {
	k := h.newKeeper(ctx)
	defer k.stop()
	for {
		select {
		case <-h.life.Done():
			o, _ := h.life.Outcome()
			return h.conclude(ctx, o)
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
		case <-h.sub.wake:
			h.checkLoss(ctx)
		case <-h.guard.moved:
			h.checkOwner(ctx)
		}
	}
}

// renewalFailed ends the hold whose renewal failed for good.
func (k *keeper) renewalFailed(err error) {
	h := k.h
	if errors.Is(err, ErrSessionNotFound) {
		// The key's watch should have told first (its loss bound is 1 s,
		// a renewal comes every TTL/3): say how it was watched.
		h.b.log.Warn("session gone, noticed by its renewal before the key's watch",
			append([]zap.Field{zap.String("key", h.spec.Key), zap.String("session", h.session)}, h.sub.describe()...)...)
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
	k.deadline.Stop()
	if k.ticker != nil {
		k.ticker.Stop()
	}
}

// streamEnded decides what the end of the stream means: a cancel ends the
// hold; a lost connection keeps it until the last promised deadline (see
// link.go).
func (k *keeper) streamEnded(ctx context.Context) {
	h := k.h
	if !disconnected(ctx) {
		h.life.End(Outcome{Kind: OutcomeCanceled})
		return
	}
	until := h.lingerUntil()
	h.b.log.Debug("connection lost; keeping the hold until its promise ends", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Time("until", until))
	k.lingering = true
	k.linger = time.After(time.Until(until))
}

// keepalive tells the client how long the hold is safe (nobody listens
// once the connection is lost).
func (k *keeper) keepalive(ctx context.Context, safeUntil time.Time) {
	h := k.h
	if k.lingering {
		return
	}
	if h.send(Event{Kind: EventKeepalive, GuaranteedFor: h.promise(safeUntil), Sequencer: h.grant()}) != nil {
		k.canceled = nil // the stream is broken: decide now
		k.streamEnded(ctx)
	}
}

func lost(r LostReason, detail string) Outcome {
	return Outcome{Kind: OutcomeLost, Reason: r, Detail: detail}
}

// checkLoss looks at the key's newest state. A loss is decided with the
// reason the state and a bounded read of the session's record and release
// marker show; a change that leaves the hold in place is checked for a
// resume on another replica.
func (h *hold) checkLoss(ctx context.Context) {
	seq := h.grant()
	st, _ := h.sub.state()
	if st == nil || st.Index < seq.Token {
		return // older than the grant
	}
	var isLost bool
	var reason LostReason
	var detail string
	if h.sem {
		isLost, reason, detail = semaphoreLoss(st, seq, h.limit)
	} else {
		isLost, reason, detail = lockLoss(st, seq)
	}
	if !isLost {
		h.followValue(st)
		return
	}
	if h.life.Phase() != PhaseHeld {
		return // a release by this replica is in flight: it decides
	}
	if age := h.sub.listingAge(); age > slowLossStep {
		h.b.log.Warn("a lost hold read its key's listing late", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Duration("listing_age", age))
	}
	rctx, cancel := context.WithTimeout(ctx, lossReadTimeout)
	defer cancel()
	began := time.Now()
	o := h.lossOutcome(rctx, seq, lost(reason, detail))
	if d := time.Since(began); d > slowLossStep {
		h.b.log.Warn("slow read of a lost hold's record", zap.String("key", h.spec.Key), zap.String("session", h.session), zap.Duration("took", d))
	}
	h.life.End(o)
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

// lossOutcome refines a loss with the session's record (one bounded
// read): a record owned by another replica means the hold was resumed
// there; a record no longer held by its session means the session ended;
// a live record without the key means a Release (on another replica)
// ended it. Without an answer in time the state's reason stands.
func (h *hold) lossOutcome(ctx context.Context, seq Sequencer, o Outcome) Outcome {
	rec, err := h.b.readRecord(ctx, seq.Session)
	if err != nil {
		return o
	}
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
		h.tidyAfter()
		return err
	case OutcomeCanceled:
		released := h.handOffOnCancel()
		if !h.recycle(released) {
			h.finish(released)
		}
		h.tidyAfter()
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
	h.b.log.Info("hold lost", zap.String("key", seq.Key), zap.String("session", seq.Session), zap.Int("reason", int(o.Reason)), zap.String("detail", o.Detail))
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
