package broker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The session pool takes session creation off the critical path: it keeps
// ready sessions with the default options (and their records, owned by
// this replica), renews them while idle, and takes them back after a
// clean release. An Acquire with default options then costs one
// transaction to grant and one to release, Consul's floor.
//
// Reuse is safe because:
//   - a pooled session is never given a key it held before (a late
//     Release naming that key and session can only find it free, or held
//     by another session); sessions retire after poolMaxUses grants;
//   - every grant and release writes the record, whose guard fences a
//     replica that lost the session (a resume elsewhere);
//   - only sessions whose hold ended cleanly (released, or cancelled and
//     unlocked) come back; a session that was lost, resumed, invalidated
//     or shut down never does.
//
// A hot key (one key acquired over and over) therefore needs a session
// that never held it for each grant: the pool keeps poolFresh sessions
// that never held any key ready, evicting its most used idle session when
// full, so that the key's grants still cost one transaction on the
// critical path (the creation and destruction of sessions happen in the
// background).
const (
	poolFresh   = 16 // idle sessions that never held a key, kept ready
	poolMaxIdle = 64 // idle sessions kept at most
	poolMaxUses = 64 // grants per session before it retires
)

type pooled struct {
	id      string
	rec     *record
	renewed time.Time // send time of the last successful renewal
	used    map[string]bool
}

type sessionPool struct {
	b    *Broker
	kick chan struct{}

	mu   sync.Mutex
	idle []*pooled
}

func newSessionPool(b *Broker) *sessionPool {
	return &sessionPool{b: b, kick: make(chan struct{}, 1)}
}

// get takes a ready session that never held key, or nil. Sessions that
// held other keys go first, to keep the fresh ones for hot keys.
func (p *sessionPool) get(key string) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	limit := time.Now().Add(-DefaultTTL / 2) // renewed recently enough to hand over
	for _, wantUsed := range []bool{true, false} {
		for i := len(p.idle) - 1; i >= 0; i-- {
			s := p.idle[i]
			if s.used[key] || s.renewed.Before(limit) || (len(s.used) > 0) != wantUsed {
				continue
			}
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			s.used[key] = true
			p.signal()
			return s
		}
	}
	p.signal()
	return nil
}

// put takes a session back after a clean release.
func (p *sessionPool) put(s *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(s.used) >= poolMaxUses || len(p.idle) >= poolMaxIdle {
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
		case <-p.kick:
		}
	}
}

// fill creates sessions until poolFresh idle ones never held a key,
// evicting the most used idle session when the pool is full.
func (p *sessionPool) fill(ctx context.Context) {
	for ctx.Err() == nil {
		p.mu.Lock()
		fresh, most := 0, -1
		for i, s := range p.idle {
			if len(s.used) == 0 {
				fresh++
			} else if most < 0 || len(s.used) > len(p.idle[most].used) {
				most = i
			}
		}
		var evict *pooled
		if fresh < poolFresh && len(p.idle) >= poolMaxIdle && most >= 0 {
			evict = p.idle[most]
			p.idle = append(p.idle[:most], p.idle[most+1:]...)
		}
		p.mu.Unlock()
		if evict != nil {
			go p.retire(evict)
		}
		if fresh >= poolFresh {
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

// create makes a session with the default options and its record.
func (p *sessionPool) create(ctx context.Context) (*pooled, error) {
	spec := withDefaults(nil)
	sent := time.Now()
	id, err := p.b.store.CreateSession(ctx, spec)
	if err != nil {
		return nil, err
	}
	rec := newRecord(id, p.b.id)
	next := rec.next()
	res, err := p.b.store.Txn(ctx, rec.writeOps(next))
	if err != nil {
		_ = p.b.store.DestroySession(ctx, id)
		return nil, err
	}
	next.index, next.live = res[1].ModifyIndex, true
	return &pooled{id: id, rec: next, renewed: sent, used: map[string]bool{}}, nil
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

// retire deletes a session's record and destroys it.
func (p *sessionPool) retire(s *pooled) {
	ctx, cancel := cleanupContext()
	defer cancel()
	if ops := s.rec.deleteOps(); ops != nil {
		_, _ = p.b.store.Txn(ctx, ops)
	}
	_ = p.b.store.DestroySession(ctx, s.id)
}

// drainIdle destroys every idle session (the broker is stopping).
func (p *sessionPool) drainIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range idle {
		wg.Go(func() { p.retire(s) })
	}
	wg.Wait()
}
