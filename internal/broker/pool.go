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
//   - a session given a key it held before marks that grant in its record
//     (record.Again): a Release or SetValue of it must name the grant's
//     token (INVALID_ARGUMENT otherwise), so a late Release from the
//     earlier holder, which names the earlier token or none, cannot end
//     the new grant. Every client library sends the token. A session that
//     never held the key is preferred, so a token-less Release still
//     works for most grants;
//   - every grant and release writes or checks the record, whose guard
//     fences a replica that lost the session (a resume elsewhere);
//   - only sessions whose hold ended cleanly (released, or cancelled and
//     unlocked) come back; a session that was lost, resumed, invalidated
//     or shut down never does. Sessions retire after poolMaxUses grants.
const (
	poolMin     = 16 // idle sessions kept ready
	poolMaxIdle = 64 // idle sessions kept at most
	poolMaxUses = 64 // grants per session before it retires
)

type pooled struct {
	id      string
	rec     *record
	renewed time.Time // send time of the last successful renewal
	used    map[string]bool
	uses    int
}

type sessionPool struct {
	b    *Broker
	kick chan struct{}

	mu   sync.Mutex
	idle []*pooled
	dead []Op // deletions of retired sessions' records (see flushDead)
}

func newSessionPool(b *Broker) *sessionPool {
	return &sessionPool{b: b, kick: make(chan struct{}, 1)}
}

// get takes a ready session for key, or nil: the most recently returned
// one that never held key, else one that did (again: the grant must be
// marked, see record.Again).
func (p *sessionPool) get(key string) (s *pooled, again bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
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
	if s.uses >= poolMaxUses || len(p.idle) >= poolMaxIdle {
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

// run keeps the pool filled and its sessions renewed until ctx ends, then
// destroys the idle ones.
func (p *sessionPool) run(ctx context.Context) {
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
		case <-p.kick:
		}
	}
}

// fill creates sessions until poolMin are idle.
func (p *sessionPool) fill(ctx context.Context) {
	for ctx.Err() == nil {
		p.mu.Lock()
		n := len(p.idle)
		p.mu.Unlock()
		if n >= poolMin {
			return
		}
		s, err := p.create(ctx)
		if err != nil {
			p.b.log.Debug("session pool: cannot create a session", zap.Error(err))
			return
		}
		p.mu.Lock()
		p.idle = append(p.idle, s)
		p.mu.Unlock()
	}
}

// create makes a session with the default options. Its record is written
// by its first grant, as for any new session (conditioned on there being
// none yet).
func (p *sessionPool) create(ctx context.Context) (*pooled, error) {
	spec := withDefaults(nil)
	sent := time.Now()
	id, err := p.b.store.CreateSession(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &pooled{id: id, rec: newRecord(id, p.b.id), renewed: sent, used: map[string]bool{}}, nil
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
		_, err := p.b.store.RenewSession(ctx, s.id)
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

// retire destroys a session. Its record is deleted later with others,
// many per transaction (flushDead): one write per retired session, not
// two.
func (p *sessionPool) retire(s *pooled) {
	ctx, cancel := cleanupContext()
	defer cancel()
	_ = p.b.store.DestroySession(ctx, s.id)
	if ops := s.rec.deleteOps(); ops != nil {
		p.mu.Lock()
		p.dead = append(p.dead, ops...)
		p.mu.Unlock()
	}
}

// flushDead deletes the records of retired sessions.
func (p *sessionPool) flushDead() {
	p.mu.Lock()
	ops := p.dead
	p.dead = nil
	p.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	p.b.deleteRecords(ctx, ops)
}

// drainIdle deletes the idle sessions' records (many per transaction) and
// destroys the sessions (the broker is stopping: no janitor after it).
func (p *sessionPool) drainIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	ctx, cancel := cleanupContext()
	defer cancel()
	var ops []Op
	for _, s := range idle {
		ops = append(ops, s.rec.deleteOps()...)
	}
	p.b.deleteRecords(ctx, ops)
	var wg sync.WaitGroup
	for _, s := range idle {
		wg.Go(func() { _ = p.b.store.DestroySession(ctx, s.id) })
	}
	wg.Wait()
	p.flushDead()
}
