package broker

import (
	"context"
	"sync/atomic"
)

// guardEvery: guards are checked every guardEvery sweeps (every few
// seconds): they only tell a stream that its hold was resumed elsewhere,
// which its client already knows; safety never waits for them.
const guardEvery = 10

// guard watches one key's ModifyIndex (a session record) for a hold: when
// the sweeper finds the key moved, it signals moved and the hold reads the
// record. Guards cost one check op per broker-owned hold every guardEvery
// sweeps, batched like the sweep's.
type guard struct {
	key   string
	index atomic.Uint64
	moved chan struct{}
}

func (h *hub) addGuard(key string, index uint64) *guard {
	g := &guard{key: key, moved: make(chan struct{}, 1)}
	g.index.Store(index)
	h.mu.Lock()
	h.guards[g] = struct{}{}
	h.mu.Unlock()
	return g
}

func (h *hub) removeGuard(g *guard) {
	h.mu.Lock()
	delete(h.guards, g)
	h.mu.Unlock()
}

// checkGuards checks every guard with read-only transactions and signals
// those whose key moved.
func (h *hub) checkGuards(ctx context.Context) {
	checks := &h.guardChecks // only the sweep loop checks guards
	checks.reset()
	h.mu.Lock()
	for g := range h.guards {
		checks.add(g, Op{Verb: OpCheckIndex, Key: g.key, Index: g.index.Load()})
	}
	h.mu.Unlock()
	for _, g := range failedOwners(ctx, h, checks) {
		select {
		case g.moved <- struct{}{}:
		default:
		}
	}
}
