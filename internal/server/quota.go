package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// The quotas of the tenants file, by the name they have there (and in
// QuotaFailure and the metrics).
const (
	quotaHolds      = "max_holds"
	quotaSessions   = "max_sessions"
	quotaRate       = "acquire_rate"
	quotaWrites     = "write_rate"
	quotaWriteBytes = "write_bytes_rate"
	quotaReads      = "read_rate"
)

var quotaNames = []string{quotaHolds, quotaSessions, quotaRate, quotaWrites, quotaWriteBytes, quotaReads}

// sessionRecount is how long a count of a tenant's sessions is trusted
// before CreateSession counts again in Consul; holdRecount the same for
// a count of its holds.
const (
	sessionRecount = time.Second
	holdRecount    = time.Second
)

// quotaRetry is the RetryInfo of a refusal whose end the broker cannot
// foresee (a hold or session must end first).
const quotaRetry = time.Second

// quotas keeps each tenant's usage on this replica, by tenant name, across
// reloads of the tenants file (limits come from the current file).
//
//   - max_holds counts the tenant's holds and waiters, however made:
//     its Acquire streams on a session of the broker's (holding or
//     waiting) on this replica, each until its handler returns (a hold
//     whose connection dropped is kept, and counted, until the broker
//     releases it), its Acquire streams with session_id while they wait,
//     and the holds of its client-owned sessions
//     (TryAcquire, Acquire with session_id, which outlive their calls)
//     in Consul, on every replica (broker.CountClientHolds). Those are
//     counted in Consul only when the tally (streams, the last count,
//     and every client-owned grant let in since, whatever became of it)
//     reaches the limit, at most once a second per tenant: a tenant
//     below its limit costs no Consul call.
//   - max_sessions counts the tenant's client-owned sessions alive in
//     Consul, on every replica: CreateSession counts them from the
//     broker's session records (a consistent read, at most once a second
//     per tenant; the sessions made here since are added).
//   - acquire_rate, write_rate (SetValue, RenewSession), write_bytes_rate
//     (the value bytes of SetValue, Acquire and TryAcquire) and read_rate
//     (GetLock, CheckSequencer, GetSession, ListSessions, Watch streams
//     opened) are token buckets per replica.
type quotas struct {
	// countSessions counts a tenant's client-owned sessions in Consul;
	// countHolds its holds.
	countSessions func(ctx context.Context, tenant string) (int, error)
	countHolds    func(ctx context.Context, tenant string) (int, error)
	// toStatus maps a domain error (of countSessions).
	toStatus func(error) error
	now      func() time.Time

	mu    sync.Mutex
	usage map[string]*usage
}

// usage is one tenant's.
type usage struct {
	holding  atomic.Int64
	waiting  atomic.Int64
	acquires atomic.Uint64
	denials  atomic.Uint64
	refused  [6]atomic.Uint64 // by quotaNames index
	// rates are the buckets of acquire_rate, write_rate,
	// write_bytes_rate and read_rate.
	acquire, writes, bytes, reads limiter

	sessMu    sync.Mutex
	sessCount int
	sessAt    time.Time

	streams   atomic.Int64 // Acquire streams on broker sessions, open here
	holdMu    sync.Mutex
	holdCount int       // holds of the tenant's client-owned sessions in Consul at holdAt
	holdAt    time.Time // zero: never counted
	holdSince int       // client-owned grants let in since holdAt
}

// limiter is a token bucket made at the rate of the tenants file in force.
type limiter struct {
	mu   sync.Mutex
	b    *tenant.Bucket
	rate float64
}

// take takes n tokens at rate (0: no limit); minBurst is the bucket's
// least burst.
func (l *limiter) take(now time.Time, rate, minBurst, n float64) (bool, time.Duration) {
	if rate <= 0 {
		return true, 0
	}
	l.mu.Lock()
	if l.b == nil {
		l.b, l.rate = tenant.NewBucketMin(rate, minBurst), rate
	} else if l.rate != rate {
		l.b.SetRate(rate)
		l.rate = rate
	}
	b := l.b
	l.mu.Unlock()
	return b.TakeN(now, n)
}

func newQuotas(countSessions, countHolds func(context.Context, string) (int, error), toStatus func(error) error) *quotas {
	return &quotas{countSessions: countSessions, countHolds: countHolds, toStatus: toStatus, now: time.Now, usage: map[string]*usage{}}
}

// of returns t's usage (the usage of no tenant for nil).
func (q *quotas) of(t *tenant.Tenant) *usage {
	if t == nil {
		return q.lookup("")
	}
	return q.lookup(t.Name)
}

func (q *quotas) lookup(name string) *usage {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.usage[name]
	if u == nil {
		u = &usage{}
		q.usage[name] = u
	}
	return u
}

// takeRate takes one Acquire or TryAcquire call from t's bucket.
func (q *quotas) takeRate(t *tenant.Tenant) error {
	return q.take(t, &q.of(t).acquire, quotaRate, t.AcquireRate, "Acquire calls per second", 1, 1)
}

// takeWrite takes one SetValue or RenewSession call from t's bucket.
func (q *quotas) takeWrite(t *tenant.Tenant) error {
	return q.take(t, &q.of(t).writes, quotaWrites, t.WriteRate, "SetValue and RenewSession calls per second", 1, 1)
}

// takeBytes takes a value of n bytes from t's bucket of bytes.
func (q *quotas) takeBytes(t *tenant.Tenant, n int) error {
	if n == 0 {
		return nil
	}
	return q.take(t, &q.of(t).bytes, quotaWriteBytes, t.WriteBytesRate, "value bytes per second", maxValueBytes, float64(n))
}

// takeRead takes one read call (or Watch stream) from t's bucket.
func (q *quotas) takeRead(t *tenant.Tenant) error {
	return q.take(t, &q.of(t).reads, quotaReads, t.ReadRate, "reads per second", 1, 1)
}

// take takes n from l at rate (what: the unit of the rate) or refuses.
func (q *quotas) take(t *tenant.Tenant, l *limiter, quota string, rate float64, what string, minBurst, n float64) error {
	ok, wait := l.take(q.now(), rate, minBurst, n)
	if ok {
		return nil
	}
	return q.refuse(q.of(t), t, quota, fmt.Sprintf("%g %s on this replica", rate, what), wait)
}

// The ways a call may make a hold, for takeHold.
const (
	holdStream       = iota // an Acquire stream on a session of the broker's
	holdResume              // an Acquire resuming a hold (counted already: never refused)
	holdClient              // TryAcquire: on a client-owned session
	holdClientStream        // Acquire with session_id: a stream while it waits, then a client-owned hold
)

// takeHold admits one more hold or waiter of t made the given way (see
// max_holds in quotas); release, for a stream, gives it back (for an
// Acquire with session_id, once it is granted: its hold is the client's).
func (q *quotas) takeHold(ctx context.Context, t *tenant.Tenant, kind int) (release func(), err error) {
	u := q.of(t)
	if t.MaxHolds > 0 && kind != holdResume {
		if err := q.checkHolds(ctx, u, t, kind == holdClient || kind == holdClientStream); err != nil {
			return nil, err
		}
	}
	if kind == holdClient {
		return nil, nil
	}
	u.streams.Add(1)
	var once sync.Once
	return func() { once.Do(func() { u.streams.Add(-1) }) }, nil
}

// checkHolds refuses one more hold of t at its max_holds, counting its
// client-owned holds in Consul when the tally reaches the limit and the
// last count is older than holdRecount; client: the hold would be one.
func (q *quotas) checkHolds(ctx context.Context, u *usage, t *tenant.Tenant, client bool) error {
	u.holdMu.Lock()
	defer u.holdMu.Unlock()
	used := int(u.streams.Load()) + u.holdCount + u.holdSince
	if now := q.now(); used >= t.MaxHolds && (u.holdAt.IsZero() || now.Sub(u.holdAt) >= holdRecount) {
		n, err := q.countHolds(ctx, t.Name)
		if err != nil {
			return q.toStatus(err)
		}
		u.holdCount, u.holdAt, u.holdSince = n, now, 0
		used = int(u.streams.Load()) + n
	}
	if used >= t.MaxHolds {
		return q.refuse(u, t, quotaHolds, fmt.Sprintf("%d holds and waiters at once (client-owned sessions' on every replica)", t.MaxHolds), quotaRetry)
	}
	if client {
		u.holdSince++
	}
	return nil
}

// takeSession admits one more client-owned session of t.
func (q *quotas) takeSession(ctx context.Context, t *tenant.Tenant) (release func(), err error) {
	if t.MaxSessions <= 0 {
		return nil, nil
	}
	u := q.of(t)
	u.sessMu.Lock()
	defer u.sessMu.Unlock()
	if now := q.now(); u.sessAt.IsZero() || now.Sub(u.sessAt) >= sessionRecount {
		n, err := q.countSessions(ctx, t.Name)
		if err != nil {
			return nil, q.toStatus(err)
		}
		u.sessCount, u.sessAt = n, now
	}
	if u.sessCount >= t.MaxSessions {
		return nil, q.refuse(u, t, quotaSessions, fmt.Sprintf("%d client-owned sessions alive at once", t.MaxSessions), quotaRetry)
	}
	u.sessCount++ // until the next count, this session counts whatever becomes of it
	return nil, nil
}

// refuse counts and builds a RESOURCE_EXHAUSTED answer.
func (q *quotas) refuse(u *usage, t *tenant.Tenant, quota, limit string, retry time.Duration) error {
	for i, n := range quotaNames {
		if n == quota {
			u.refused[i].Add(1)
		}
	}
	return quotaExceeded(t.Name, quota, limit, retry)
}

// granted counts a grant (TryAcquire; Acquire streams count through
// their tracker).
func (q *quotas) granted(t *tenant.Tenant) {
	if t != nil {
		q.of(t).acquires.Add(1)
	}
}

// denied counts a PERMISSION_DENIED answer.
func (q *quotas) denied(t *tenant.Tenant) {
	q.of(t).denials.Add(1)
}

// newHoldTracker follows one Acquire stream: a waiter until `acquired`, a
// hold until `lost`, `released` or the end of the stream, in the replica's
// metrics m and, once join has been called, in a tenant's usage too.
func newHoldTracker(m *holdMetrics) *holdTracker {
	m.waiting.Add(1)
	return &holdTracker{m: m, start: time.Now(), state: trackWaiting}
}

const (
	trackWaiting = iota
	trackHolding
	trackDone
)

type holdTracker struct {
	m       *holdMetrics
	start   time.Time
	mu      sync.Mutex
	u       *usage // nil: no tenant (yet)
	granted func() // set by join: runs at `acquired`
	state   int
	queued  bool // told `queued` before `acquired`: a wait, not a grant
}

// join counts the stream in the tenant usage u as well; granted, if set,
// runs at `acquired`.
func (h *holdTracker) join(u *usage, granted func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch h.state {
	case trackWaiting:
		u.waiting.Add(1)
	case trackHolding:
		u.holding.Add(1)
	}
	h.u, h.granted = u, granted
}

func (h *holdTracker) event(r *lockbrokerv1.AcquireResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case r.GetQueued() != nil:
		h.queued = true
	case r.GetAcquired() != nil && h.state == trackWaiting:
		h.m.waiting.Add(-1)
		h.m.holding.Add(1)
		latency := h.m.grant
		if h.queued {
			latency = h.m.wait
		}
		latency.Observe(time.Since(h.start).Seconds())
		if h.u != nil {
			h.u.waiting.Add(-1)
			h.u.holding.Add(1)
			h.u.acquires.Add(1)
		}
		h.state = trackHolding
		if h.granted != nil {
			h.granted()
		}
	case r.GetLost() != nil && h.state != trackDone:
		h.m.lost(r.GetLost().GetReason())
		h.leave()
	case r.GetReleased() != nil && h.state != trackDone:
		h.leave()
	}
}

func (h *holdTracker) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leave()
}

func (h *holdTracker) leave() {
	switch h.state {
	case trackWaiting:
		h.m.waiting.Add(-1)
		if h.u != nil {
			h.u.waiting.Add(-1)
		}
	case trackHolding:
		h.m.holding.Add(-1)
		if h.u != nil {
			h.u.holding.Add(-1)
		}
	}
	h.state = trackDone
}
