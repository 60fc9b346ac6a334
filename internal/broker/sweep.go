package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// run is a dedicated watch's loop: one blocking query after another.
func (kw *keyWatch) run(ctx context.Context, r *dedicatedRun) {
	h := kw.h
	defer func() {
		h.mu.Lock()
		r.cancel()
		if h.running[kw] == r { // neither preempted nor parked: count it out
			delete(h.running, kw)
			h.dedicated--
		}
		h.mu.Unlock()
	}()
	var index uint64
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if index > 0 && kw.retire() {
			return
		}
		if index > 0 && kw.park(r) {
			testHookParked(kw.key)
			return
		}
		began := time.Now()
		entries, next, err := h.store.Watch(ctx, kw.key, index)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			h.log.Debug("watch failed; retrying", zap.String("key", kw.key), zap.Error(err))
			if !sleep(ctx, backoff) {
				return
			}
			// A key whose queries keep failing (Consul refuses it: 400
			// for a key it cannot take in a path, 403 for a prefix the
			// broker's ACL policy lacks) never reaches the check below:
			// once nobody wants it, it stops here.
			if kw.retire() {
				return
			}
			// Capped low: the 1 s loss bound counts from the moment
			// Consul answers again (after an election, say), not from
			// the end of a long backoff.
			backoff = min(backoff*2, maxWatchBackoff)
			continue
		}
		backoff = 50 * time.Millisecond
		if next < index {
			index = 0 // Consul's index went back (restore, new cluster): start over
			continue
		}
		if next == index {
			continue // the wait time ran out without a change
		}
		index = max(next, 1)
		mine := under(kw.key, entries)
		kw.publish(mine, next, began)
		if len(mine) == 0 && !sleep(ctx, emptyPause) {
			// Consul answers a blocking query on a prefix with no entries
			// with the whole KV store's index, so it returns on every
			// write anywhere: pace such a watch.
			return
		}
	}
}

// testHookParked runs in a parked loop after it was counted out and
// before it returns (hub_test.go restarts the key's watch there).
var testHookParked = func(key string) {}

// maxWatchBackoff caps the pause between failed blocking queries of a
// dedicated watch (at most DefaultMaxBlocking of them per replica).
const maxWatchBackoff = 250 * time.Millisecond

// emptyPause is the pause between blocking queries of a key with no
// entries (see run).
const emptyPause = 50 * time.Millisecond

// retire removes an idle watch from the hub; it reports whether it did.
func (kw *keyWatch) retire() bool {
	h := kw.h
	h.mu.Lock()
	defer h.mu.Unlock()
	kw.mu.Lock()
	idle := len(kw.subs) == 0
	kw.mu.Unlock()
	if idle && h.watches[kw.key] == kw {
		delete(h.watches, kw.key)
	}
	return idle
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sweep checks every swept key every sweepInterval (sooner when kicked).
func (h *hub) sweep(ctx context.Context) {
	t := time.NewTimer(h.sweepInterval)
	defer t.Stop()
	round := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
		began := time.Now()
		h.sweepOnce(ctx)
		if round++; round%guardEvery == 0 {
			h.checkGuards(ctx)
		}
		// The interval counts from the start of a sweep, but a sweep of
		// many keys that takes longer than it still leaves Consul a pause
		// (a third of the interval) before the next: renewals and writes
		// come first.
		t.Reset(max(h.sweepInterval-time.Since(began), h.sweepInterval/3))
	}
}

// sweepOnce reads the swept keys that are new or stale, and checks the
// others with read-only transactions; keys whose checks fail are read.
// Only the sweep loop calls it: its batches are kept from one sweep to the
// next (h.sweepChecks), so that a sweep of many keys allocates little.
func (h *hub) sweepOnce(ctx context.Context) {
	var reread, blind []*keyWatch
	checks := &h.sweepChecks
	checks.reset()
	var scratch []Op
	h.mu.Lock()
	for key, kw := range h.watches {
		if !h.closed && h.modeLocked(kw) == modeBlind { // (closing: the loops are ending)
			blind = append(blind, kw)
		}
		if kw.dedicated || kw.pending {
			continue
		}
		kw.mu.Lock()
		idle, stale := len(kw.subs) == 0, kw.stale || !kw.ready || len(kw.entries) > maxSweptEntries
		if !idle && !stale {
			scratch = kw.appendCheckOpsLocked(scratch[:0])
		}
		kw.mu.Unlock()
		switch {
		case idle:
			delete(h.watches, key)
		case stale:
			reread = append(reread, kw)
		default:
			checks.add(kw, scratch...)
		}
	}
	for _, kw := range blind {
		// A dedicated key with no query learns of no change: a broken
		// invariant (see dedicatedRun), reported and mended.
		h.log.Error("a watched key had no query; starting one", zap.String("key", kw.key))
		kw.dedicated, kw.pending = false, true
		h.startLocked(kw)
	}
	h.mu.Unlock()
	h.reread(ctx, append(reread, failedOwners(ctx, h, checks)...))
}

// appendCheckOpsLocked appends to ops the ops that pass while the key's
// entries are as last seen: each entry unchanged, the key and its
// semaphore `.lock` absent if they were.
func (kw *keyWatch) appendCheckOpsLocked(ops []Op) []Op {
	var haveKey, haveSem bool
	for _, e := range kw.entries {
		ops = append(ops, Op{Verb: OpCheckIndex, Key: e.Key, Index: e.ModifyIndex})
		haveKey = haveKey || e.Key == kw.key
		haveSem = haveSem || e.Key == kw.key+semLockSuffix
	}
	if !haveKey {
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: kw.key})
	}
	if !haveSem && !haveKey {
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: kw.key + semLockSuffix})
	}
	return ops
}

// checkBatches gathers check ops, each with the owner it speaks for (a
// swept key, a guard), into read-only transactions of at most MaxTxnOps;
// one owner's ops stay in one transaction. reset empties it for another
// round and keeps its memory.
type checkBatches[T comparable] struct {
	ops    [][]Op
	owners [][]T // owners[i][j] is the owner of ops[i][j]
}

func (c *checkBatches[T]) reset() {
	for i := range c.ops {
		clear(c.ops[i]) // no keys or owners kept alive until the next round
		clear(c.owners[i])
		c.ops[i], c.owners[i] = c.ops[i][:0], c.owners[i][:0]
	}
	c.ops, c.owners = c.ops[:0], c.owners[:0]
}

func (c *checkBatches[T]) add(owner T, ops ...Op) {
	n := len(c.ops)
	if n == 0 || len(c.ops[n-1])+len(ops) > MaxTxnOps {
		if n < cap(c.ops) && n < cap(c.owners) { // a batch of an earlier round: reuse its arrays
			c.ops, c.owners = c.ops[:n+1], c.owners[:n+1]
		} else {
			c.ops, c.owners = append(c.ops, make([]Op, 0, MaxTxnOps)), append(c.owners, make([]T, 0, MaxTxnOps))
		}
		n++
	}
	c.ops[n-1] = append(c.ops[n-1], ops...)
	for range ops {
		c.owners[n-1] = append(c.owners[n-1], owner)
	}
}

// failedOwners runs the checks and returns the owners with a failing
// check, once each.
func failedOwners[T comparable](ctx context.Context, h *hub, c *checkBatches[T]) []T {
	seen := map[T]bool{}
	var out []T
	for i, ops := range h.failing(ctx, c.ops) {
		for _, op := range ops {
			if o := c.owners[i][op]; !seen[o] {
				seen[o] = true
				out = append(out, o)
			}
		}
	}
	return out
}

// failing runs read-only check transactions, sweepParallel at a time, and
// returns the failing ops of each batch by batch number. A batch that
// cannot run (Consul unreachable) is tried again at the next sweep.
func (h *hub) failing(ctx context.Context, batches [][]Op) map[int][]int {
	var (
		mu  sync.Mutex
		out map[int][]int
	)
	inParallel(len(batches), func(i int) {
		err := h.store.Check(ctx, batches[i])
		if err == nil {
			return
		}
		te := asTxnError(err)
		if te == nil {
			h.log.Debug("sweep check failed", zap.Error(err))
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if out == nil {
			out = map[int][]int{}
		}
		for _, f := range te.Failures {
			if f.Op >= 0 && f.Op < len(batches[i]) {
				out[i] = append(out[i], f.Op)
			}
		}
	})
	return out
}

// inParallel calls f(0) … f(n-1) on at most sweepParallel goroutines and
// returns when every call has: a few goroutines take the items in turn,
// rather than one goroutine per item growing a new stack for its Consul
// call.
func inParallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, sweepParallel) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		})
	}
	wg.Wait()
}

// reread lists each key again and publishes it, sweepParallel at a time.
func (h *hub) reread(ctx context.Context, kws []*keyWatch) {
	inParallel(len(kws), func(i int) {
		kw := kws[i]
		began := time.Now()
		entries, index, err := h.store.List(ctx, kw.key, false)
		if err != nil {
			h.log.Debug("sweep read failed", zap.String("key", kw.key), zap.Error(err))
			return
		}
		kw.publish(under(kw.key, entries), index, began)
	})
}
