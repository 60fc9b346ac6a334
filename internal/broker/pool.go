package broker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The session pool takes session creation off the critical path: it keeps
// ready sessions with the default options (owned by this replica),
// renews them while idle, and takes them back after a clean release. An
// Acquire with default options then costs one transaction to grant and
// one to release, Consul's floor, even on a hot key.
//
// Reuse is safe because:
//   - a Release or SetValue of a grant on a broker-owned session must
//     name the grant's token (INVALID_ARGUMENT otherwise, for every such
//     session: see record.tokenRequired), so a late Release from an
//     earlier holder of the same session, which names the earlier token,
//     cannot end a new grant of the same key (it answers OK, nothing
//     released). Every client library sends the token. A session that
//     never held the key is still preferred, and a grant of a key the
//     session held before is marked in its record (record.Again);
//   - every grant and release writes or checks the record, whose guard
//     fences a replica that lost the session (a resume elsewhere);
//   - a pool serves one tenant: its sessions are made with the tenant's
//     store, their records name the tenant, and they go to that tenant's
//     holds only;
//   - only sessions whose hold ended cleanly (released, or cancelled and
//     unlocked) come back; a session that was lost, resumed, invalidated
//     or shut down never does. Sessions retire after poolMaxUses grants.
const (
	poolMin     = 16 // idle sessions kept ready
	poolMaxIdle = 64 // idle sessions kept at most
	poolMaxUses = 64 // grants per session before it retires

	// A tenant's pool (a shared broker, see pools) keeps fewer sessions
	// ready, and ends when the tenant has not asked it for one in a while
	// (tenantPoolIdle).
	tenantPoolMin = 4

	poolRetry = 10 * time.Second // between fills that failed
)

var tenantPoolIdle = 2 * time.Minute // a var for tests

type pooled struct {
	id      string
	pool    *sessionPool // the pool it comes from and goes back to
	rec     *record
	renewed time.Time // send time of the last successful renewal
	used    map[string]bool
	uses    int
}

// sessionPool keeps the sessions of one tenant ("" in single-tenant mode):
// they are made, renewed and destroyed with the tenant's store, and their
// records name the tenant, as a session made for one of its requests
// would be.
type sessionPool struct {
	b      *Broker
	tenant string
	min    int           // idle sessions kept ready
	idleTO time.Duration // 0: never ends; else ends when not asked for this long
	kick   chan struct{}
	fillAt time.Time // no fill before (run's own: set after a failed creation)

	mu     sync.Mutex
	idle   []*pooled
	dead   []*pooled // retired sessions, for flushDead
	asked  time.Time // the last get
	closed bool      // ended: put retires, get gives nothing
}

func newSessionPool(b *Broker, tenant string) *sessionPool {
	p := &sessionPool{b: b, tenant: tenant, min: poolMin, kick: make(chan struct{}, 1), asked: time.Now()}
	if tenant != "" {
		p.min, p.idleTO = tenantPoolMin, tenantPoolIdle
	}
	return p
}

// store is the tenant's store, looked up at each use so that a reload of
// the tenants file (a new Consul token) takes effect.
func (p *sessionPool) store() Store { return p.b.storeFor(p.tenant) }

// pools are a broker's session pools: the single-tenant one, made and
// filled when a single-tenant broker starts (a shared broker, one with
// WithTenantStore, makes it only if a call without a tenant asks for
// it), and one per tenant of a shared broker,
// made at the tenant's first Acquire with default options (which makes
// its session itself, as the pool is still empty) and ended, its idle
// sessions destroyed, once the tenant has not used it for tenantPoolIdle.
type pools struct {
	b   *Broker
	ctx context.Context // the pools run until it ends
	wg  sync.WaitGroup  // the pools' goroutines

	mu     sync.Mutex
	m      map[string]*sessionPool
	closed bool // ctx ended: no new pool
}

func newPools(ctx context.Context, b *Broker) *pools {
	ps := &pools{b: b, ctx: ctx, m: map[string]*sessionPool{}}
	if b.tenantStore == nil {
		ps.forTenant("")
	}
	return ps
}

// forTenant is tenant's pool, made and started if there is none; nil once
// the broker stops.
func (ps *pools) forTenant(tenant string) *sessionPool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.m[tenant]; p != nil || ps.closed {
		return p
	}
	p := newSessionPool(ps.b, tenant)
	ps.m[tenant] = p
	ps.wg.Go(func() { p.run(ps.ctx, ps) })
	return p
}

// end removes p if it has not been asked for a session since idleTO ago,
// and reports whether it did; p is closed then, under both locks, so that
// no get can take from it after.
func (ps *pools) end(p *sessionPool) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idleTO == 0 || time.Since(p.asked) < p.idleTO {
		return false
	}
	if ps.m[p.tenant] == p {
		delete(ps.m, p.tenant)
	}
	p.closed = true
	return true
}

// wait closes the set once ctx ended and waits for every pool to destroy
// its idle sessions.
func (ps *pools) wait() {
	<-ps.ctx.Done()
	ps.mu.Lock()
	ps.closed = true
	ps.mu.Unlock()
	ps.wg.Wait()
}

// get takes a ready session for key, or nil: the most recently returned
// one that never held key, else one that did (again: the grant must be
// marked, see record.Again).
func (p *sessionPool) get(key string) (s *pooled, again bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	p.asked = time.Now()
	defer p.signal()
	limit := time.Now().Add(-DefaultTTL / 2) // renewed recently enough to hand over
	for _, wantAgain := range []bool{false, true} {
		for i := len(p.idle) - 1; i >= 0; i-- {
			s := p.idle[i]
			if s.used[key] != wantAgain || s.renewed.Before(limit) {
				continue
			}
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			s.used[key] = true
			s.uses++
			return s, wantAgain
		}
	}
	return nil, false
}

// put takes a session back after a clean release.
func (p *sessionPool) put(s *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || s.uses >= poolMaxUses || len(p.idle) >= poolMaxIdle {
		go p.retire(s)
		return
	}
	p.idle = append(p.idle, s)
}

func (p *sessionPool) signal() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run keeps the pool filled and its sessions renewed until ctx ends (or,
// for a tenant's pool, until ps ends it unused), then destroys the idle
// ones. A tenant's pool fills once it was asked for a session: its first
// one is made by the request that asked.
func (p *sessionPool) run(ctx context.Context, ps *pools) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		p.fill(ctx)
		p.renew(ctx)
		select {
		case <-ctx.Done():
			p.drainIdle()
			return
		case <-t.C:
			p.flushDead()
			if ps.end(p) {
				p.drainIdle()
				return
			}
		case <-p.kick:
		}
	}
}

// fill creates sessions until p.min are idle. After a creation failed it
// tries again only poolRetry later (a tenant whose token may not make
// sessions, Consul down), not at every tick and request.
func (p *sessionPool) fill(ctx context.Context) {
	if time.Now().Before(p.fillAt) {
		return
	}
	for ctx.Err() == nil {
		p.mu.Lock()
		n, closed := len(p.idle), p.closed
		p.mu.Unlock()
		if n >= p.min || closed {
			return
		}
		s, err := p.create(ctx)
		if err != nil {
			p.b.log.Debug("session pool: cannot create a session", zap.String("tenant", p.tenant), zap.Error(err))
			p.fillAt = time.Now().Add(poolRetry)
			return
		}
		p.mu.Lock()
		p.idle = append(p.idle, s)
		p.mu.Unlock()
	}
}

// create makes a session with the default options. Its record is written
// by its first grant, as for any new session (conditioned on there being
// none yet), and names the pool's tenant.
//
// The pool's end does not cancel a creation on its way (its Consul call
// has its own timeout): Consul may have made the session already, and
// only an answer lets the pool destroy it with its idle ones (run);
// cancelled, it was left to expire (TestTenantSessionPools under -race
// once found it after Close).
func (p *sessionPool) create(ctx context.Context) (*pooled, error) {
	spec := withDefaults(nil)
	sent := time.Now()
	id, err := p.store().CreateSession(context.WithoutCancel(ctx), spec)
	if err != nil {
		return nil, err
	}
	rec := newRecord(id, p.b.id)
	rec.Tenant = p.tenant
	return &pooled{id: id, pool: p, rec: rec, renewed: sent, used: map[string]bool{}}, nil
}

// renew renews the idle sessions due (every TTL/3); a session Consul no
// longer has is dropped.
func (p *sessionPool) renew(ctx context.Context) {
	p.mu.Lock()
	var due []*pooled
	for _, s := range p.idle {
		if time.Since(s.renewed) >= DefaultTTL/3 {
			due = append(due, s)
		}
	}
	p.mu.Unlock()
	for _, s := range due {
		sent := time.Now()
		_, err := p.store().RenewSession(ctx, s.id)
		p.mu.Lock()
		switch {
		case err == nil:
			s.renewed = sent
		case isNotFound(err):
			p.removeLocked(s)
		}
		p.mu.Unlock()
	}
}

func (p *sessionPool) removeLocked(s *pooled) {
	for i, x := range p.idle {
		if x == s {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return
		}
	}
}

// retire takes a session out of service: flushDead deletes its record,
// with those of others (many per transaction), and then destroys it, on
// the pool's next tick, or at once when the pool is closed. One write per
// retired session, not two.
func (p *sessionPool) retire(s *pooled) {
	p.mu.Lock()
	p.dead = append(p.dead, s)
	closed := p.closed
	p.mu.Unlock()
	if closed { // no tick to come
		p.flushDead()
	}
}

// flushDead removes the retired sessions: their records first, each
// conditioned on the record as this pool last wrote it (the session is
// still live, so nothing else moved it: destroying the session first
// would release the record, moving its index, and the deletion would
// fail), then the sessions.
func (p *sessionPool) flushDead() {
	p.mu.Lock()
	dead := p.dead
	p.dead = nil
	p.mu.Unlock()
	if len(dead) == 0 {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	st := p.store()
	var ops []Op
	for _, s := range dead {
		ops = append(ops, s.rec.deleteOps()...)
	}
	p.b.deleteRecords(ctx, st, ops)
	var wg sync.WaitGroup
	for _, s := range dead {
		wg.Go(func() { _ = st.DestroySession(ctx, s.id) })
	}
	wg.Wait()
}

// drainIdle closes the pool (a session given back later retires at once)
// and retires the idle sessions: the broker is stopping (no janitor after
// it), or the tenant's pool ended.
func (p *sessionPool) drainIdle() {
	p.mu.Lock()
	p.dead = append(p.dead, p.idle...)
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	p.flushDead()
}
