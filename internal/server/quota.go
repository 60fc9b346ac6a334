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
	quotaHolds    = "max_holds"
	quotaSessions = "max_sessions"
	quotaRate     = "acquire_rate"
)

var quotaNames = []string{quotaHolds, quotaSessions, quotaRate}

// sessionRecount is how long a count of a tenant's sessions is trusted
// before CreateSession counts again in Consul.
const sessionRecount = time.Second

// quotaRetry is the RetryInfo of a refusal whose end the broker cannot
// foresee (a hold or session must end first).
const quotaRetry = time.Second

// quotas keeps each tenant's usage on this replica, by tenant name, across
// reloads of the tenants file (limits come from the current file).
//
//   - max_holds counts the tenant's Acquire streams open on this replica,
//     holding or waiting. Holds on client-owned sessions that outlive
//     their stream (TryAcquire, Acquire with session_id after the stream
//     ended) are bounded by max_sessions instead.
//   - max_sessions counts the tenant's client-owned sessions alive in
//     Consul, on every replica: CreateSession counts them from the
//     broker's session records (a consistent read, at most once a second
//     per tenant; the sessions made here since are added).
//   - acquire_rate is a token bucket per replica over Acquire and
//     TryAcquire calls.
type quotas struct {
	// countSessions counts a tenant's client-owned sessions in Consul.
	countSessions func(ctx context.Context, tenant string) (int, error)
	// toStatus maps a domain error (of countSessions).
	toStatus func(error) error
	now      func() time.Time

	mu    sync.Mutex
	usage map[string]*usage
}

// usage is one tenant's.
type usage struct {
	streams  atomic.Int64 // Acquire streams open: the max_holds count
	holding  atomic.Int64
	waiting  atomic.Int64
	acquires atomic.Uint64
	denials  atomic.Uint64
	refused  [3]atomic.Uint64 // by quotaNames index
	bucket   *tenant.Bucket
	rate     float64

	sessMu    sync.Mutex
	sessCount int
	sessAt    time.Time
}

func newQuotas(countSessions func(context.Context, string) (int, error), toStatus func(error) error) *quotas {
	return &quotas{countSessions: countSessions, toStatus: toStatus, now: time.Now, usage: map[string]*usage{}}
}

// of returns t's usage (nil for no tenant), with the bucket at t's rate.
func (q *quotas) of(t *tenant.Tenant) *usage {
	if t == nil {
		return q.lookup("")
	}
	u := q.lookup(t.Name)
	q.mu.Lock()
	if u.bucket == nil {
		u.bucket, u.rate = tenant.NewBucket(t.AcquireRate), t.AcquireRate
	} else if u.rate != t.AcquireRate {
		u.bucket.SetRate(t.AcquireRate)
		u.rate = t.AcquireRate
	}
	q.mu.Unlock()
	return u
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
	if t.AcquireRate <= 0 {
		return nil
	}
	u := q.of(t)
	ok, wait := u.bucket.Take(q.now())
	if ok {
		return nil
	}
	return q.refuse(u, t, quotaRate, fmt.Sprintf("%g Acquire calls per second on this replica", t.AcquireRate), wait)
}

// takeHold counts one more Acquire stream of t; release gives it back.
func (q *quotas) takeHold(t *tenant.Tenant) (release func(), err error) {
	u := q.of(t)
	n := u.streams.Add(1)
	if t.MaxHolds > 0 && n > int64(t.MaxHolds) {
		u.streams.Add(-1)
		return nil, q.refuse(u, t, quotaHolds, fmt.Sprintf("%d holds and waiters at once on this replica", t.MaxHolds), quotaRetry)
	}
	var once sync.Once
	return func() { once.Do(func() { u.streams.Add(-1) }) }, nil
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
	m      *holdMetrics
	start  time.Time
	mu     sync.Mutex
	u      *usage // nil: no tenant (yet)
	state  int
	queued bool // told `queued` before `acquired`: a wait, not a grant
}

// join counts the stream in the tenant usage u as well.
func (h *holdTracker) join(u *usage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch h.state {
	case trackWaiting:
		u.waiting.Add(1)
	case trackHolding:
		u.holding.Add(1)
	}
	h.u = u
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
