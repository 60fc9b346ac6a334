package broker

import "sync"

// Phase is where a hold is in its life.
type Phase int

// The phases of a hold: waiting → held → releasing → ended. Releasing goes
// back to held when the release does not happen.
const (
	PhaseWaiting Phase = iota + 1
	PhaseHeld
	PhaseReleasing
	PhaseEnded
)

// Outcome is how a hold ended.
type Outcome struct {
	// Kind is one of the Outcome* kinds.
	Kind OutcomeKind
	// Reason and Detail, for OutcomeLost.
	Reason LostReason
	Detail string
}

// OutcomeKind says how a hold ended.
type OutcomeKind int

// The ways a hold ends.
const (
	// OutcomeReleased: Release ended it (on this replica or another).
	OutcomeReleased OutcomeKind = iota + 1
	// OutcomeLost: taken away (see Reason).
	OutcomeLost
	// OutcomeResumed: resumed on another replica; this one must not touch
	// it.
	OutcomeResumed
	// OutcomeShutdown: the broker is draining; the client may resume.
	OutcomeShutdown
	// OutcomeCanceled: the client went away (stream cancelled).
	OutcomeCanceled
	// OutcomeFailed: it never got the grant (an error, a timeout).
	OutcomeFailed
	// OutcomeCutOff: this replica cannot reach Consul to renew the
	// session; the client may resume elsewhere.
	OutcomeCutOff
)

// Lifecycle decides a hold's outcome, once, under one lock. Every path
// that can end a hold (Release, loss detection, renewal failure, resume
// elsewhere, shutdown, cancel) asks it, and only the first decision
// counts. A loss seen while a release is in flight waits for the release:
// if the release happens the hold was released, otherwise the loss stands.
// It is a pure type (no Consul, no goroutines) so it can be fuzzed.
type Lifecycle struct {
	mu      sync.Mutex
	phase   Phase
	outcome Outcome
	pending *Outcome // an End that arrived while releasing
	done    chan struct{}
}

// NewLifecycle returns a waiting hold's lifecycle.
func NewLifecycle() *Lifecycle {
	return &Lifecycle{phase: PhaseWaiting, done: make(chan struct{})}
}

// Phase returns the current phase.
func (l *Lifecycle) Phase() Phase {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.phase
}

// Done is closed once the outcome is decided.
func (l *Lifecycle) Done() <-chan struct{} { return l.done }

// Outcome returns the outcome; ok is false before it is decided.
func (l *Lifecycle) Outcome() (Outcome, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outcome, l.phase == PhaseEnded
}

// Grant moves waiting → held. It fails when the hold already ended.
func (l *Lifecycle) Grant() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase != PhaseWaiting {
		return false
	}
	l.phase = PhaseHeld
	return true
}

// BeginRelease moves held → releasing. It fails unless held.
func (l *Lifecycle) BeginRelease() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase != PhaseHeld {
		return false
	}
	l.phase = PhaseReleasing
	return true
}

// EndRelease finishes a release begun with BeginRelease: released ends
// the hold as released; otherwise it is held again, unless an End came
// meanwhile, which then decides.
func (l *Lifecycle) EndRelease(released bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase != PhaseReleasing {
		return
	}
	switch {
	case released:
		l.endLocked(Outcome{Kind: OutcomeReleased})
	case l.pending != nil:
		l.endLocked(*l.pending)
	default:
		l.phase = PhaseHeld
	}
	l.pending = nil
}

// End decides the outcome o unless it is decided already. While a release
// is in flight it is deferred (see EndRelease) and End returns false. It
// reports whether o decided the outcome.
func (l *Lifecycle) End(o Outcome) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.phase {
	case PhaseEnded:
		return false
	case PhaseReleasing:
		if l.pending == nil {
			l.pending = &o
		}
		return false
	}
	l.endLocked(o)
	return true
}

func (l *Lifecycle) endLocked(o Outcome) {
	l.phase, l.outcome = PhaseEnded, o
	close(l.done)
}
