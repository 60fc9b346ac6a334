package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Whether this replica reaches Consul.
//
// A request can only be served through its replica's Consul agent. When
// the replica is cut off from it (a broken link, the agent stopped or
// without servers) the key may well be free and other replicas able to
// grant it, while a waiter here keeps hearing `queued` heartbeats, which
// say only that its replica runs; a watch here shows the keys as they
// were; and a new request waits for its Consul call's timeout (10 s
// through a link that drops everything) before it fails. So the replica
// asks its agent for the cluster's leader every reachProbeEvery, always;
// once no probe has been answered for reachGrace it counts as cut off:
// every waiter and watch ends UNAVAILABLE (REPLICA_CUT_OFF), every new
// request is refused so at once (Admit), and the client libraries take
// them to another replica. The first answer ends it. A cluster without a
// leader still answers the probe: during an election every replica is as
// stuck as this one, and waiters stay where they are.
const (
	reachProbeEvery = time.Second
	reachGrace      = 3 * time.Second
	reachTick       = 250 * time.Millisecond
	// reachGap: ticks this far apart mean the process was stopped
	// (SIGSTOP) or starved, not that Consul was silent: the time between
	// them is not held against Consul (without it, every wait and watch
	// ended as a replica woke from a pause longer than reachGrace).
	reachGap = time.Second
	// reachCheck bounds the probe that places a failed request (Placed):
	// shorter than reachGrace, as the request's own call already failed.
	reachCheck = time.Second
)

// reach tracks the probes. Its zero value is not usable: see newReach.
type reach struct {
	mu     sync.Mutex
	lastOK time.Time // when a probe was last answered
	// cut is done while no probe has been answered for reachGrace (cutNow
	// ends it); a probe answered after that makes a new one.
	cut    context.Context
	cutNow context.CancelFunc
	ticked time.Time  // the last judge
	check  *reachCall // Placed's probe, while one is out
	// checkFailed: Placed's last probe went unanswered (for logging the
	// changes only).
	checkFailed bool
	// told counts the requests and streams that ended REPLICA_CUT_OFF.
	told atomic.Uint64
}

// reachCall is one probe of Placed, shared by the requests that fail
// while it is out.
type reachCall struct {
	done chan struct{} // closed once err is set
	err  error
}

func newReach() *reach {
	r := &reach{lastOK: time.Now()}
	r.cut, r.cutNow = context.WithCancel(context.Background())
	return r
}

// lost is closed once the replica counts as cut off from Consul; a
// waiter selects on it.
func (r *reach) lost() <-chan struct{} {
	return r.cutContext().Done()
}

// cutContext is done once the replica counts as cut off from Consul.
func (r *reach) cutContext() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cut
}

// answered records that Consul answered a probe at t. It reports whether
// the replica counted as cut off until now.
func (r *reach) answered(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.After(r.lastOK) {
		r.lastOK = t
	}
	if r.cut.Err() == nil {
		return false
	}
	r.cut, r.cutNow = context.WithCancel(context.Background())
	return true
}

// judge counts the replica cut off when no probe has been answered for
// reachGrace at now. It reports whether that is new. A judge more than
// reachGap after the last one starts the count again at now (see
// reachGap).
func (r *reach) judge(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	gap := now.Sub(r.ticked)
	r.ticked = now
	if gap > reachGap && now.After(r.lastOK) {
		r.lastOK = now
	}
	if now.Sub(r.lastOK) < reachGrace || r.cut.Err() != nil {
		return false
	}
	r.cutNow()
	return true
}

// since is how long ago a probe was last answered.
func (r *reach) since() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Since(r.lastOK)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// watchReach probes Consul, one probe at a time, started at most every
// reachProbeEvery and given reachGrace to be answered, and judges every
// reachTick; until ctx ends.
// A slow agent is not a cut-off one: answers that take up to about 2.5 s
// still come at least every reachGrace.
func (b *Broker) watchReach(ctx context.Context) {
	var probes sync.WaitGroup
	defer probes.Wait()
	t := time.NewTicker(reachTick)
	defer t.Stop()
	inFlight := make(chan struct{}, 1)
	var lastStart time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if b.reach.judge(now) {
			b.log.Warn("consul: this replica's agent has not answered for a while; its waiting requests and watches end, and new requests are refused, UNAVAILABLE (REPLICA_CUT_OFF) so that clients go to another replica",
				zap.Duration("unanswered_for", b.reach.since()))
		}
		if now.Sub(lastStart) < reachProbeEvery {
			continue
		}
		select {
		case inFlight <- struct{}{}:
		default:
			continue // the last probe is still out
		}
		lastStart = now
		probes.Go(func() {
			defer func() { <-inFlight }()
			pctx, cancel := context.WithTimeout(ctx, reachGrace)
			defer cancel()
			if b.store.Reachable(pctx) != nil {
				return
			}
			if b.reach.answered(time.Now()) {
				b.log.Info("consul: this replica's agent answers again")
			}
			if b.hub.historyBusy.CompareAndSwap(false, true) {
				// Apart from the probe: a consistent read waits for a
				// leader, and the probe must not.
				probes.Go(func() {
					defer b.hub.historyBusy.Store(false)
					hctx, cancel := context.WithTimeout(ctx, reachGrace)
					defer cancel()
					b.checkHistory(hctx)
				})
			}
		})
	}
}

// Placed returns err as this replica's client should see it. A request
// that failed because Consul did not answer (CONSUL_UNAVAILABLE) fails
// UNAVAILABLE with REPLICA_CUT_OFF instead when the fault is this
// replica's: it counts as cut off (see watchReach), or its agent does not
// answer a probe within reachCheck either. The client libraries then go
// to another replica at once. When the agent answers (a cluster without a
// leader, Consul overloaded) the error stays CONSUL_UNAVAILABLE: another
// replica would fail the same way.
//
// The services pass every error of the broker here (and the quota check
// its count of sessions), so this is also where the REPLICA_CUT_OFF
// answers are counted (CutOffAnswers).
func (b *Broker) Placed(err error) error {
	r, ok := ReasonOf(err)
	if ok && r == ReasonReplicaCutOff {
		b.reach.told.Add(1) // a wait or a watch that ended so
	}
	if !ok || r != ReasonConsulUnavailable {
		return err
	}
	if !isClosed(b.reach.lost()) && b.checkReach() == nil {
		return err
	}
	b.reach.told.Add(1)
	return newError(ErrUnavailable, ReasonReplicaCutOff, "this replica's Consul agent does not answer (%v); try another replica", err)
}

// Admit refuses a new request while this replica counts as cut off from
// its Consul agent (see watchReach): UNAVAILABLE with REPLICA_CUT_OFF at
// once, where the request's own Consul call would wait for its timeout.
// It returns nil otherwise. The services call it once a request is let in
// and valid, before any Consul call (the tenant quota's count included);
// the error then passes Placed like any other.
func (b *Broker) Admit() error {
	if b.reach.cutContext().Err() == nil {
		return nil
	}
	return b.cutOffError()
}

func (b *Broker) cutOffError() error {
	return newError(ErrUnavailable, ReasonReplicaCutOff, "this replica's Consul agent has not answered for %s; try another replica", b.reach.since().Round(100*time.Millisecond))
}

// Enter admits a request as Admit does, and gives it a context that is
// cancelled if the replica comes to count as cut off while the request
// runs: its Consul call then ends at once, not at its timeout. leave
// ends that; it returns the error to answer instead of the request's own
// when the cut cancelled it (nil otherwise: the request's own answer
// stands).
//
// For requests that end when they are answered (the unary ones): a
// stream's context is its hold's, which a cut must not end.
func (b *Broker) Enter(ctx context.Context) (_ context.Context, leave func() error, _ error) {
	cut := b.reach.cutContext()
	if cut.Err() != nil {
		return ctx, nil, b.cutOffError()
	}
	rctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(cut, cancel)
	return rctx, func() error {
		cancelled := !stop() && ctx.Err() == nil
		cancel()
		if cancelled {
			return b.cutOffError()
		}
		return nil
	}, nil
}

// CutOffAnswers is how many requests and streams this replica has ended
// UNAVAILABLE with REPLICA_CUT_OFF (lockbroker_replica_cut_off_total).
func (b *Broker) CutOffAnswers() uint64 { return b.reach.told.Load() }

// checkReach asks the agent whether it answers at all, bounded by
// reachCheck. Requests that fail while a check is out share its answer.
func (b *Broker) checkReach() error {
	b.reach.mu.Lock()
	c := b.reach.check
	first := c == nil
	if first {
		c = &reachCall{done: make(chan struct{})}
		b.reach.check = c
	}
	b.reach.mu.Unlock()
	if !first {
		<-c.done
		return c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), reachCheck)
	c.err = b.store.Reachable(ctx)
	cancel()
	if c.err == nil {
		b.reach.answered(time.Now())
	}
	b.reach.mu.Lock()
	b.reach.check = nil
	changed := b.reach.checkFailed != (c.err != nil)
	b.reach.checkFailed = c.err != nil
	b.reach.mu.Unlock()
	close(c.done)
	switch {
	case changed && c.err != nil:
		b.log.Warn("consul: a request failed and this replica's agent does not answer; such requests fail UNAVAILABLE (REPLICA_CUT_OFF) so that clients go to another replica", zap.Error(c.err))
	case changed:
		b.log.Info("consul: this replica's agent answers again after a failed request")
	}
	return c.err
}
