package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Lease is a held lock, semaphore slot, read or write hold (RWMutex), or
// multi-key lock (WithKeys).
type Lease struct {
	c    *Client
	key  string
	req  *lockbrokerv1.AcquireRequest
	seq  *lockbrokerv1.Sequencer
	seqs []*lockbrokerv1.Sequencer // one per key (WithKeys), else seq alone

	lost    chan struct{}
	stopped chan struct{}
	cancel  context.CancelFunc

	mu        sync.Mutex
	replica   int
	deadline  time.Time
	releasing bool // Release was called: `released` is this lease's own
	err       error
}

// Lock waits until it holds key (or ctx ends) and returns the lease.
// With WithKeys it takes key and those keys as one (a multi-key lock, see
// WithKeys). Broker errors are *StatusError: ErrWaitTimeout after
// WithWaitTimeout, ErrBusy with a zero wait, ErrConflict, ErrKindConflict,
// ErrInvalidArgument, ... A grant
// the broker could not announce safely is a *LostError (the stream said
// `lost` instead of `acquired`). With WithReplicas, an UNAVAILABLE replica
// is skipped for the next one.
func (c *Client) Lock(ctx context.Context, key string, opts ...LockOption) (*Lease, error) {
	return c.acquire(ctx, key, opts)
}

// TryLock takes key if it is free now. A busy key fails with a
// *StatusError that matches ErrBusy and names the holders.
func (c *Client) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lease, error) {
	return c.acquire(ctx, key, append(opts, tryOnce))
}

// tryOnce makes an acquisition a try: a zero wait.
func tryOnce(r *lockbrokerv1.AcquireRequest) { r.WaitTimeout = durationpb.New(0) }

func (c *Client) acquire(ctx context.Context, key string, opts []LockOption) (*Lease, error) {
	req := &lockbrokerv1.AcquireRequest{Key: key}
	for _, o := range opts {
		o(req)
	}
	var lastErr error
	place := "" // the session the wait queued with, to keep its place
	for i := range c.locks {
		l, sid, err := c.openAt(ctx, i, req, place)
		if err == nil {
			return l, nil
		}
		if sid != "" {
			place = sid
		}
		lastErr = err
		if status.Code(err) != codes.Unavailable {
			break
		}
	}
	return nil, askedFor(req, lastErr)
}

// openAt runs open on replica i. A wait that queued on an earlier replica
// (place: its session) resumes there, keeping its place in the key's
// shared queue; when that place is gone (the session ended), it waits
// anew. It returns the session the wait last queued with.
func (c *Client) openAt(ctx context.Context, i int, req *lockbrokerv1.AcquireRequest, place string) (*Lease, string, error) {
	if place == "" || req.GetSessionId() != "" {
		return c.open(ctx, i, req)
	}
	moved := proto.CloneOf(req)
	moved.Session = &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: req.GetKey(), SessionId: place}}
	l, sid, err := c.open(ctx, i, moved)
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound:
		return c.open(ctx, i, req)
	}
	if sid == "" {
		sid = place
	}
	return l, sid, err
}

// open runs one Acquire on replica i until `acquired`. With other replicas
// to go to, a waiting stream silent for waitStallBeats of the broker's
// heartbeats (AcquireQueued.heartbeat) is cancelled and the wait fails
// UNAVAILABLE, so that acquire moves on: a stopped replica keeps its
// connection and never answers.
func (c *Client) open(ctx context.Context, i int, req *lockbrokerv1.AcquireRequest) (l *Lease, place string, err error) {
	// The stream outlives ctx, but keeps its values: the caller's trace
	// context (W3C traceparent through an OpenTelemetry stats handler on
	// the connection) and outgoing metadata reach the broker.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel) // ctx bounds only the wait
	stream, err := c.locks[i].Acquire(sctx, req)
	if err != nil {
		stop()
		cancel()
		if ctx.Err() != nil {
			return nil, place, ctx.Err()
		}
		return nil, place, asStatusError(err)
	}
	var silence *waitSilence
	if len(c.locks) > 1 {
		silence = &waitSilence{cancel: cancel}
		defer silence.stop()
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			stop()
			cancel()
			if ctx.Err() != nil {
				return nil, place, ctx.Err()
			}
			if silence.fired() {
				return nil, place, silence.err()
			}
			return nil, place, c.withHolders(ctx, req.GetKey(), asStatusError(err))
		}
		silence.heard(resp.GetQueued().GetHeartbeat().AsDuration())
		if sid := resp.GetQueued().GetSessionId(); sid != "" {
			place = sid
		}
		if lost := resp.GetLost(); lost != nil {
			// The grant came too late to be safe (see AcquireLost): no
			// lease, and the broker's reason says why.
			stop()
			cancel()
			err := lostByBroker(lost)
			err.Detail = "the stream ended with lost before the grant: " + err.Detail
			return nil, place, err
		}
		if a := resp.GetAcquired(); a != nil {
			if !silence.stop() { // cancelled as the grant came
				stop()
				return nil, place, silence.err()
			}
			if !stop() {
				cancel()
				return nil, place, ctx.Err()
			}
			l = &Lease{
				c: c, key: req.GetKey(), req: req, seq: a.GetSequencer(), seqs: grantSequencers(a), replica: i,
				lost: make(chan struct{}), stopped: make(chan struct{}), cancel: cancel,
				deadline: time.Now().Add(a.GetGuaranteedFor().AsDuration()),
			}
			go l.run(stream)
			return l, place, nil
		}
	}
}

// waitStallBeats: a waiting stream that hears nothing for this many of its
// broker's heartbeats is taken for stalled.
const waitStallBeats = 3

// waitSilence cancels a waiting stream that stays silent for
// waitStallBeats heartbeats (a nil *waitSilence does nothing: one replica,
// nowhere to go).
type waitSilence struct {
	cancel context.CancelFunc
	every  time.Duration // the last heartbeat announced
	timer  *time.Timer
	gone   atomic.Bool // the timer cancelled the stream
}

// heard restarts the count on an event; heartbeat is the one announced
// (0 with events other than queued: the last one stands).
func (s *waitSilence) heard(heartbeat time.Duration) {
	if s == nil {
		return
	}
	if heartbeat > 0 {
		s.every = heartbeat
	}
	if s.every == 0 {
		return // a broker without heartbeats: silence tells nothing
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(waitStallBeats*s.every, func() {
			s.gone.Store(true)
			s.cancel()
		})
		return
	}
	s.timer.Reset(waitStallBeats * s.every)
}

// stop ends the count; false when the stream was already cancelled.
func (s *waitSilence) stop() bool {
	if s == nil {
		return true
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	return !s.gone.Load()
}

func (s *waitSilence) fired() bool { return s != nil && s.gone.Load() }

func (s *waitSilence) err() error {
	return asStatusError(status.Errorf(codes.Unavailable, "the replica was silent for %d heartbeats of %s while the request waited", waitStallBeats, s.every))
}

// Lost is closed when the lease ends: lost, released, or past its
// guaranteed deadline with no broker reachable. Err says which.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lease is held, ErrReleased after Release, and a
// *LostError after a loss; its Cause says why (a Release from elsewhere is
// Cause RELEASED, which matches ErrReleased too).
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Replica is the index of the broker replica whose stream holds the lease
// now: 0 for New's connection, then WithReplicas's in order. It changes
// when the lease resumes on another replica.
func (l *Lease) Replica() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.replica
}

// Sequencer is the grant: pass its Token to protected resources. For a
// read-write lock (RWMutex) its Read is true for a read grant; for a
// multi-key lock it is the first key's (Sequencers has them all).
func (l *Lease) Sequencer() *lockbrokerv1.Sequencer { return proto.CloneOf(l.seq) }

// Sequencers is one grant per key, in the request's order: the key given
// to Lock first, then WithKeys's. Each key has its own fencing token: pass
// each resource the token of the key that guards it. A single-key lease
// has one, its Sequencer.
func (l *Lease) Sequencers() []*lockbrokerv1.Sequencer {
	out := make([]*lockbrokerv1.Sequencer, len(l.seqs))
	for i, s := range l.seqs {
		out[i] = proto.CloneOf(s)
	}
	return out
}

// Keys are the lease's keys in the request's order (one for a single key).
func (l *Lease) Keys() []string { return append([]string{l.key}, l.req.GetKeys()...) }

// LostKey is the key whose loss ended the lease (for a multi-key lock,
// the first one lost: the broker released the others), once Lost is
// closed; empty while the lease holds, after Release, and when the loss
// concerned the whole hold (no keepalive, a refused resume).
func (l *Lease) LostKey() string {
	var le *LostError
	if errors.As(l.Err(), &le) {
		return le.Key
	}
	return ""
}

// grantSequencers is an acquired event's grants, one per key (the
// sequencer alone for a single key).
func grantSequencers(a *lockbrokerv1.AcquireAcquired) []*lockbrokerv1.Sequencer {
	if s := a.GetSequencers(); len(s) > 0 {
		return s
	}
	return []*lockbrokerv1.Sequencer{a.GetSequencer()}
}

// sameGrant is whether a resume's grant is the lease's: the same token on
// every key.
func (l *Lease) sameGrant(a *lockbrokerv1.AcquireAcquired) bool {
	if a.GetSequencer().GetToken() != l.seq.GetToken() {
		return false
	}
	got := a.GetSequencers()
	if len(got) == 0 {
		return true // a broker that repeats only the first key's grant
	}
	if len(got) != len(l.seqs) {
		return false
	}
	for i, s := range got {
		if s.GetKey() != l.seqs[i].GetKey() || s.GetToken() != l.seqs[i].GetToken() {
			return false
		}
	}
	return true
}

// Deadline is how long the lease is guaranteed if no broker is heard from.
// Lost is closed before it (see giveUpAt) when no broker can be reached.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// clientMargin is how long before Deadline the client gives a lease up
// when it cannot hear from any broker, so that Lost is closed while the
// lease is still guaranteed.
const clientMargin = 250 * time.Millisecond

// giveUpAt is when the lease is reported lost without broker contact.
func (l *Lease) giveUpAt() time.Time { return l.Deadline().Add(-clientMargin) }

// stallShare: a stream silent for this share of the time it was last
// guaranteed for is taken to be on a stalled replica (stopped, or cut off
// from Consul and no longer renewing), and the lease resumes on another
// while it is still guaranteed. A healthy stream speaks about every third
// of it (the broker renews every TTL/3). Every lockbroker library uses this
// share.
const stallShare = 0.6

// resumeAttempt bounds one resume attempt on one replica: a stopped
// replica accepts the connection and never answers.
const resumeAttempt = 3 * time.Second

// stallAt is when a stream last heard at lastWord, guaranteed for
// guaranteed, counts as stalled; zero when there is no other replica.
func (l *Lease) stallAt(lastWord time.Time, guaranteed time.Duration) time.Time {
	if len(l.c.locks) < 2 {
		return time.Time{}
	}
	return lastWord.Add(time.Duration(stallShare * float64(guaranteed)))
}

// SetValue changes the holder's value; the sequencer stays the same.
func (l *Lease) SetValue(ctx context.Context, value []byte) error {
	_, err := l.locks().SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: l.key, SessionId: l.seq.GetSessionId(), Value: value, Token: l.seq.GetToken()})
	return asStatusError(err)
}

// Release gives the lease up and waits until the broker has released it
// in Consul. Releasing a lost lease returns its loss.
func (l *Lease) Release(ctx context.Context) error {
	select {
	case <-l.lost:
		if err := l.Err(); !errors.Is(err, ErrReleased) {
			return err
		}
		return nil
	default:
	}
	l.mu.Lock()
	l.releasing = true
	l.mu.Unlock()
	resp, err := l.locks().Release(ctx, &lockbrokerv1.ReleaseRequest{Key: l.key, SessionId: l.seq.GetSessionId(), Token: l.seq.GetToken()})
	if err != nil {
		l.end(ErrReleased) // closing the stream releases it too
	}
	var unheld <-chan time.Time
	if err == nil && !resp.GetReleased() {
		// Nothing was released: the hold had gone already, and its stream
		// says how at once. A broker that does not say (issue 41: the
		// loss came during the Release) is not waited for past the
		// promise bound: the hold is not there to keep.
		t := time.NewTimer(time.Second)
		defer t.Stop()
		unheld = t.C
	}
	select {
	case <-l.stopped:
	case <-unheld:
		l.end(ErrReleased)
	case <-ctx.Done():
		l.end(ErrReleased)
		return ctx.Err()
	}
	if err := l.Err(); !errors.Is(err, ErrReleased) {
		return err // lost before the Release could release it
	}
	return nil
}

func (l *Lease) locks() lockbrokerv1.LockServiceClient {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.locks[l.replica]
}

// end closes the lease once with err and stops its stream.
func (l *Lease) end(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
	cancel := l.cancel
	l.mu.Unlock()
	cancel()
}

type recvResult struct {
	resp *lockbrokerv1.AcquireResponse
	err  error
}

// run follows the stream: keepalives move the deadline, `lost` and
// `released` end the lease, a broken stream resumes on another replica.
func (l *Lease) run(stream lockbrokerv1.LockService_AcquireClient) {
	defer close(l.stopped)
	for {
		err := l.follow(stream)
		if err != nil {
			l.end(err)
			return
		}
		stream = l.resume()
		if stream == nil {
			return
		}
	}
}

// follow reads stream until the lease ends (returns its error) or the
// stream breaks, the broker shuts down or, with other replicas to go to,
// stays silent too long (returns nil: resume). A silent stream is left
// open: closing it would release the hold if its replica woke before the
// resume moved it.
func (l *Lease) follow(stream lockbrokerv1.LockService_AcquireClient) error {
	events := make(chan recvResult)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			resp, err := stream.Recv()
			select {
			case events <- recvResult{resp, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	now := time.Now()
	stallAt := l.stallAt(now, l.Deadline().Sub(now))
	for {
		wake := l.giveUpAt()
		if !stallAt.IsZero() && stallAt.Before(wake) {
			wake = stallAt
		}
		timer := time.NewTimer(time.Until(wake))
		select {
		case <-timer.C:
			if time.Now().Before(l.giveUpAt()) {
				return nil // stalled: resume elsewhere
			}
			return &LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED, Cause: CauseKeepaliveTimeout,
				Detail: "no keepalive from the broker before the guaranteed deadline"}
		case ev := <-events:
			timer.Stop()
			if ev.err != nil {
				if err := l.Err(); err != nil {
					return err // ended locally (Release)
				}
				return nil // broken stream: resume elsewhere
			}
			switch e := ev.resp.GetEvent().(type) {
			case *lockbrokerv1.AcquireResponse_Keepalive:
				now, g := time.Now(), e.Keepalive.GetGuaranteedFor().AsDuration()
				l.mu.Lock()
				l.deadline = now.Add(g)
				l.mu.Unlock()
				stallAt = l.stallAt(now, g)
			case *lockbrokerv1.AcquireResponse_Released:
				l.mu.Lock()
				own := l.releasing
				l.mu.Unlock()
				if own {
					return ErrReleased
				}
				return &LostError{Cause: CauseReleased, Detail: "released by a Release call from elsewhere"}
			case *lockbrokerv1.AcquireResponse_Lost:
				if r := e.Lost.GetReason(); r == lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN || r == lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF {
					// Resume elsewhere; the draining or cut-off broker
					// guarantees the hold only until guaranteed_for.
					if g := e.Lost.GetGuaranteedFor(); g != nil {
						l.mu.Lock()
						if d := time.Now().Add(g.AsDuration()); d.Before(l.deadline) {
							l.deadline = d
						}
						l.mu.Unlock()
					}
					return nil
				}
				return lostByBroker(e.Lost)
			}
		}
	}
}

// resume re-attaches the hold on the replicas, in turn, until the
// deadline. It returns the new stream, or nil after ending the lease.
func (l *Lease) resume() lockbrokerv1.LockService_AcquireClient {
	n := len(l.c.locks)
	for attempt := 1; ; attempt++ {
		if time.Until(l.giveUpAt()) <= 0 {
			l.end(&LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED, Cause: CauseKeepaliveTimeout,
				Detail: "no broker replica could resume the hold before its guaranteed deadline"})
			return nil
		}
		l.mu.Lock()
		l.replica = (l.replica + 1) % n
		i := l.replica
		l.mu.Unlock()
		req := proto.CloneOf(l.req)
		req.Session = &lockbrokerv1.AcquireRequest_Resume{Resume: l.seq}
		stream, err := l.tryResume(i, req)
		if err == nil {
			return stream
		}
		if errors.Is(err, errLeaseEnded) {
			return nil
		}
		switch status.Code(err) {
		case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument:
			l.mu.Lock()
			own := l.releasing
			l.mu.Unlock()
			if own { // released by this lease's Release while resuming
				l.end(ErrReleased)
				return nil
			}
			l.end(&LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, Cause: CauseResumeRefused,
				Detail: "resume refused: " + status.Convert(err).Message()})
			return nil
		}
		select {
		case <-l.lost: // released meanwhile
			return nil
		default:
		}
		if attempt%n == 0 {
			select {
			case <-time.After(min(200*time.Millisecond, max(time.Until(l.giveUpAt()), 0))):
			case <-l.lost:
				return nil
			}
		}
	}
}

// tryResume opens a resume stream on replica i and waits for `acquired`,
// bounded by the lease's deadline and resumeAttempt.
func (l *Lease) tryResume(i int, req *lockbrokerv1.AcquireRequest) (lockbrokerv1.LockService_AcquireClient, error) {
	sctx, cancel := context.WithCancel(context.Background())
	t := time.AfterFunc(min(time.Until(l.giveUpAt()), resumeAttempt), cancel)
	stream, err := l.c.locks[i].Acquire(sctx, req)
	var resp *lockbrokerv1.AcquireResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	if !t.Stop() || err != nil {
		timedOut := sctx.Err() != nil // before cancel, which sets it
		cancel()
		if err == nil || timedOut { // timed out: not a refusal
			err = status.Error(codes.DeadlineExceeded, "resume attempt timed out")
		}
		return nil, err
	}
	a := resp.GetAcquired()
	if a == nil || !l.sameGrant(a) {
		cancel()
		return nil, status.Error(codes.FailedPrecondition, "resume did not return the same grant")
	}
	l.mu.Lock()
	if l.err != nil {
		// The lease ended while this attempt was out (a Release whose
		// call failed, sent to the replica being tried): let the resumed
		// hold go too (a cancelled stream is released), or it would live
		// on, renewed, with its caller believing it released.
		l.mu.Unlock()
		cancel()
		return nil, errLeaseEnded
	}
	old := l.cancel
	l.cancel = cancel
	l.deadline = time.Now().Add(a.GetGuaranteedFor().AsDuration())
	l.mu.Unlock()
	old()
	return stream, nil
}

// errLeaseEnded: a resume answered after the lease had ended.
var errLeaseEnded = errors.New("the lease ended while it was resuming")
