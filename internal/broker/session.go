package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
)

// errRenewalFailed: renewals failed until the safe deadline.
var errRenewalFailed = errors.New("session renewals failed until the safe deadline")

// isNotFound reports whether err says a session does not exist.
func isNotFound(err error) bool { return errors.Is(err, ErrSessionNotFound) }

// withDefaults fills the defaults of a session spec.
func withDefaults(spec *SessionSpec) SessionSpec {
	out := SessionSpec{TTL: DefaultTTL, LockDelay: DefaultLockDelay, Name: defaultName}
	if spec != nil {
		out = *spec
		if out.TTL == 0 {
			out.TTL = DefaultTTL
		}
		if out.LockDelay < 0 {
			out.LockDelay = DefaultLockDelay
		}
		if out.Name == "" {
			out.Name = defaultName
		}
	}
	out.TTL = out.TTL.Round(time.Second)
	return out
}

// validateSpec checks what the proto rules also check, for callers that do
// not come through the gRPC layer.
func validateSpec(s SessionSpec) error {
	if s.TTL < MinTTL || s.TTL > MaxTTL {
		return invalid("new_session.ttl", "must be between %s and %s, got %s", MinTTL, MaxTTL, s.TTL)
	}
	if s.LockDelay > MaxLockDelay {
		return invalid("new_session.lock_delay", "must be between 0s and %s, got %s", MaxLockDelay, s.LockDelay)
	}
	return nil
}

// CreateSession creates a client-owned session. A nil spec means the
// defaults; a negative LockDelay means the default lock-delay.
func (b *Broker) CreateSession(ctx context.Context, spec *SessionSpec) (*SessionInfo, error) {
	s := withDefaults(spec)
	if err := validateSpec(s); err != nil {
		return nil, err
	}
	st := b.storeFor(TenantFrom(ctx))
	id, err := st.CreateSession(ctx, s)
	if err != nil {
		return nil, err
	}
	// The session's record says whose it is, so every replica agrees.
	rec := newRecord(id, "")
	rec.Tenant, rec.Delete = TenantFrom(ctx), s.Delete
	if _, err := st.Txn(ctx, rec.writeOps(rec.next())); err != nil {
		cctx, cancel := cleanupContext()
		defer cancel()
		_ = st.DestroySession(cctx, id)
		return nil, err
	}
	return b.store.Session(ctx, id)
}

// RenewSession renews a client-owned session.
func (b *Broker) RenewSession(ctx context.Context, id string) (*SessionInfo, error) {
	if err := b.checkTenant(ctx, id); err != nil {
		return nil, err
	}
	return b.storeFor(TenantFrom(ctx)).RenewSession(ctx, id)
}

// DestroySession destroys a session (idempotent), then its record.
//
// A tenant may destroy its own sessions only: one whose record names it,
// or one that no longer exists (a retry). A session with no record was
// made outside the broker and is no tenant's: NOT_FOUND, as GetSession
// answers for it.
//
// The session goes first. Its record is acquired by it, so Consul releases
// (or deletes) the record in the same write that ends the session: no
// failure leaves a live session without its record, and a retry finds the
// record, dead, and the session gone. Holds of the session see either
// record as their session's end (SESSION_INVALIDATED). The dead record is
// then removed at once (the janitor would, later).
func (b *Broker) DestroySession(ctx context.Context, id string) error {
	tenant := TenantFrom(ctx)
	rec, err := b.readRecord(ctx, id)
	if err != nil {
		return err
	}
	if tenant != "" && rec.index == 0 {
		return b.destroyedAlready(ctx, id)
	}
	if err := allowed(ctx, rec, tenant); err != nil {
		return err
	}
	st := b.storeFor(tenant)
	if err := st.DestroySession(ctx, id); err != nil {
		return err
	}
	if rec.index != 0 {
		b.dropDead(ctx, st, id)
	}
	return nil
}

// destroyedAlready answers a tenant's DestroySession of a session without
// a record: success when the session does not exist (any more),
// NOT_FOUND when it does (made outside the broker).
func (b *Broker) destroyedAlready(ctx context.Context, id string) error {
	_, err := b.store.Session(ctx, id)
	switch {
	case isNotFound(err):
		return nil
	case err != nil:
		return err
	}
	noteForeign(ctx) // a session made outside the broker: no tenant's
	return sessionError(ErrSessionNotFound, id)
}

// GetSession describes a session.
func (b *Broker) GetSession(ctx context.Context, id string) (*SessionInfo, error) {
	if err := b.checkTenant(ctx, id); err != nil {
		return nil, err
	}
	return b.store.Session(ctx, id)
}

// safetyMargin is how long before a renewal's TTL runs out the broker
// gives the hold up: a tenth of the TTL, at least one second.
func safetyMargin(ttl time.Duration) time.Duration {
	return max(ttl/10, time.Second)
}

// renewer keeps a broker-owned session alive and knows until when the hold
// is safe: the send time of the last successful renewal plus the TTL, less
// the safety margin. No goroutine waits between renewals: a timer fires
// each one, which runs in a goroutine of its own only while it lasts (at
// 10,000 holds, a parked goroutine per session was a fifth of the
// broker's memory).
type renewer struct {
	store Store
	id    string
	ttl   time.Duration

	ctx    context.Context // ends when stop is called
	cancel context.CancelFunc
	timer  *time.Timer
	ticks  sync.WaitGroup // a renewal in flight

	log *renewalLog // retried failures (nil: not logged)

	mu       sync.Mutex
	deadline time.Time
	stopped  bool
	// renewed receives each new deadline; failed receives the final error
	// (ErrSessionNotFound or errRenewalFailed) once.
	renewed chan time.Time
	failed  chan error
}

func newRenewer(store Store, id string, ttl time.Duration, start time.Time, log *renewalLog) *renewer {
	return &renewer{
		store:    store,
		id:       id,
		ttl:      ttl,
		log:      log,
		deadline: start.Add(ttl - safetyMargin(ttl)),
		renewed:  make(chan time.Time, 1),
		failed:   make(chan error, 1),
	}
}

// lastRenewal is the send time of the last successful renewal (or of the
// creation).
func (r *renewer) lastRenewal() time.Time {
	return r.safeUntil().Add(-(r.ttl - safetyMargin(r.ttl)))
}

// safeUntil is when the hold stops being safe without another renewal.
func (r *renewer) safeUntil() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deadline
}

// start renews every TTL/3 until stop is called or the session is lost.
// The first renewal comes TTL/3 after the last one (or the creation), not
// after start: a pooled session is handed out up to TTL/2 after its last
// renewal, and a first renewal TTL/3 after that left it 1 s before its
// safe deadline (issue 41).
func (r *renewer) start() {
	r.ctx, r.cancel = context.WithCancel(context.Background())
	first := max(r.ttl/3-time.Since(r.lastRenewal()), 0)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = time.AfterFunc(first, r.tick)
}

// stop ends the renewals and waits for one in flight to return.
func (r *renewer) stop() {
	r.mu.Lock()
	r.stopped = true
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
	r.ticks.Wait()
}

// tick makes one renewal and arms the timer for the next, unless the
// session is finished or stop was called. Ticks never overlap: the timer
// is armed again only at the end of one.
func (r *renewer) tick() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.ticks.Add(1)
	r.mu.Unlock()
	defer r.ticks.Done()
	next, again := r.renew()
	r.mu.Lock()
	defer r.mu.Unlock()
	if again && !r.stopped {
		r.timer.Reset(next)
	}
}

// renew makes one renewal and says when to make the next (again false:
// the session is lost, its error sent on failed, or stop was called).
func (r *renewer) renew() (next time.Duration, again bool) {
	sent := time.Now()
	rctx, cancel := context.WithDeadline(r.ctx, r.safeUntil())
	_, err := r.store.RenewSession(rctx, r.id)
	cancel()
	switch {
	case err == nil:
		d := sent.Add(r.ttl - safetyMargin(r.ttl))
		r.mu.Lock()
		r.deadline = d
		r.mu.Unlock()
		select {
		case <-r.renewed: // keep only the newest deadline
		default:
		}
		r.renewed <- d
		return r.ttl / 3, true
	case errors.Is(err, ErrSessionNotFound):
		r.failed <- err
		return 0, false
	case r.ctx.Err() != nil:
		return 0, false
	}
	left := time.Until(r.safeUntil())
	if left <= 0 {
		r.failed <- fmt.Errorf("%w: last error: %v", errRenewalFailed, err)
		return 0, false
	}
	r.log.failed(r.id, err, left)
	return min(500*time.Millisecond, left), true
}

// renewalLog writes a warning for renewals that failed and are retried,
// at most one a second for the whole broker, each with how many it left
// out since the last: when Consul cannot be reached every session's
// renewals fail at once (every 500 ms each), and a line per failure would
// bury the log. A hold whose renewals keep failing until its safe
// deadline is logged as lost, with the last error.
type renewalLog struct {
	log *zap.Logger

	mu      sync.Mutex
	next    time.Time // no line before
	skipped int       // failures since the last line
}

func newRenewalLog(log *zap.Logger) *renewalLog { return &renewalLog{log: log} }

func (l *renewalLog) failed(session string, err error, left time.Duration) {
	if l == nil {
		return
	}
	now := time.Now()
	l.mu.Lock()
	if now.Before(l.next) {
		l.skipped++
		l.mu.Unlock()
		return
	}
	l.next = now.Add(time.Second)
	skipped := l.skipped
	l.skipped = 0
	l.mu.Unlock()
	l.log.Warn("session renewal failed; retrying until the session's safe deadline",
		zap.String("session", session), zap.Error(err), zap.Duration("safe_for", left), zap.Int("failures_not_logged", skipped))
}

// SessionSummary is one session the broker made grants for.
type SessionSummary struct {
	Info        *SessionInfo
	Tenant      string
	BrokerOwned bool
	Holds       []Sequencer
}

// ListSessions lists the sessions that have a broker record, with what
// each holds, read consistently; sessions that ended are left out. With a
// tenant, only that tenant's.
func (b *Broker) ListSessions(ctx context.Context, tenant string) ([]SessionSummary, error) {
	entries, _, err := b.store.List(ctx, recordPrefix, true)
	if err != nil {
		return nil, err
	}
	infos, err := b.store.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*SessionInfo, len(infos))
	for _, in := range infos {
		byID[in.ID] = in
	}
	var out []SessionSummary
	for _, e := range entries {
		sid := e.Key[len(recordPrefix):]
		info, ok := byID[sid]
		rec := decodeRecord(sid, e)
		if !ok || !rec.live || (tenant != "" && rec.Tenant != tenant) {
			continue
		}
		s := SessionSummary{Info: info, Tenant: rec.Tenant, BrokerOwned: rec.Owner != ""}
		for key := range rec.Holds {
			s.Holds = append(s.Holds, Sequencer{Key: key, Session: sid, Token: rec.token(key)})
		}
		sort.Slice(s.Holds, func(i, j int) bool { return s.Holds[i].Key < s.Holds[j].Key })
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.CreateIndex < out[j].Info.CreateIndex })
	return out, nil
}
