package broker

import (
	"context"

	"go.uber.org/zap"
)

// Restores and going back in time (DESIGN.md).
//
// A Consul snapshot restore takes the KV store back to the snapshot: keys
// and sessions made since vanish, and the indexes go back. Blocking
// queries do not notice: Consul answers one only once the index passes the
// one it waits on, so every dedicated watch of the replica stayed blind
// until its key was written again (issue 41: holders whose keys had
// vanished heard keepalives for 13-20 s, and waiters queued behind them).
// The broker treats a lower index as a new history: once it sees one, every
// watch of the replica reads its key again from scratch (newHistory), and
// the listings, at their lower indexes, are taken as newer (see publish).
// A hold whose key vanished is then told lost; a waiter sees the key as
// it now is. Fencing tokens need nothing: Consul's Raft index, which they
// come from, goes on past a restore.
//
// It sees one in two places: the history probe, which reads the KV store's
// index with every reach probe (each second; the listing of historyKey,
// which nobody writes, carries the whole store's index), and a hold's
// consistent read of its key below its grant's token (keep.go). A single
// key's listing that goes back is taken as it is (see publish) but starts
// nothing more: the listing of a prefix also goes back when Consul reaps
// the tombstones under it. A write after the restore and before the probe
// puts the store's index above the old one again, and hides the restore
// from the probe; a hold's read still sees it, when a listing or a check
// (the sweep's, a young hold's, a guard's) wakes it.
const historyKey = BrokerPrefix + "history"

// checkHistory reads the KV store's index and starts a new history when
// it went back.
func (b *Broker) checkHistory(ctx context.Context) {
	_, index, err := b.store.List(ctx, historyKey, true)
	if err != nil || index == 0 {
		return
	}
	h := b.hub
	h.mu.Lock()
	last := h.kvIndex
	h.kvIndex = index
	h.mu.Unlock()
	if index < last {
		b.log.Warn("consul: the KV store's index went back (a snapshot restore?); every watch reads its key again", zap.Uint64("index", index), zap.Uint64("was", last))
		h.newHistory()
	}
}

// newHistory has every watch of the replica read its key again: each
// dedicated query starts over from index 0, each swept key is read at the
// next sweep, which starts now.
func (h *hub) newHistory() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for kw, r := range h.running {
		r.cancel()
		delete(h.running, kw)
		h.dedicated--
		kw.dedicated, kw.pending = false, true
		if h.watches[kw.key] == kw {
			h.startLocked(kw)
		}
	}
	for _, kw := range h.watches {
		if kw.dedicated || kw.pending {
			continue
		}
		kw.mu.Lock()
		kw.stale = true
		kw.mu.Unlock()
	}
	h.kickLocked()
}
