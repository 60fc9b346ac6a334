package broker

import (
	"sync"
	"time"
)

// What this replica's own writes tell it about a key, without a read.
//
// A release transaction returns the entry it left (unlocked, with its new
// ModifyIndex). The hub uses it twice:
//   - the key's watch, if it has one, publishes it at once, so that a
//     waiter on this replica wakes when the release commits rather than
//     when the blocking query comes back: one release wakes the next
//     waiter (FIFO) and its first Consul call is its granting transaction;
//   - the entry is remembered (knownFree) for a key nobody watches any
//     more, so that the next grant of a hot key checks that index instead
//     of guessing "absent" and paying a failed transaction and a read.
//
// Neither is trusted for safety: every grant's transaction checks the
// state it was built on, so a stale entry costs one failed attempt.

// maxKnown bounds the remembered entries (the map is cleared when full).
const maxKnown = 4096

type knownFree struct {
	mu      sync.Mutex
	entries map[string]*Entry
}

func (k *knownFree) put(e *Entry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.entries == nil || len(k.entries) >= maxKnown {
		k.entries = make(map[string]*Entry)
	}
	k.entries[e.Key] = e
}

func (k *knownFree) get(key string) *Entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.entries[key]
}

func (k *knownFree) forget(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.entries, key)
}

// released notes a lock key this replica just released: e is the entry
// the release transaction returned.
func (h *hub) released(e *Entry) {
	if e == nil || e.Session != "" {
		return
	}
	h.known.put(e)
	h.mu.Lock()
	kw := h.watches[e.Key]
	h.mu.Unlock()
	if kw != nil {
		kw.publishOwn(e)
	}
}

// publishOwn publishes e, this replica's own write, when the watch's
// listing is the key's entry alone (a plain lock key) and e is newer.
func (kw *keyWatch) publishOwn(e *Entry) {
	kw.mu.Lock()
	ok := kw.ready && len(kw.entries) == 1 && kw.entries[0].Key == e.Key && e.ModifyIndex > kw.index
	kw.mu.Unlock()
	if ok {
		kw.publish([]*Entry{e}, e.ModifyIndex, time.Now())
		kw.mu.Lock()
		if kw.index == e.ModifyIndex {
			kw.own = true
		}
		kw.mu.Unlock()
	}
}

// noteRelease passes on what a successful release transaction left of a
// lock key (its last op the unlock; res one entry per op).
func (b *Broker) noteRelease(ops []Op, res []*Entry) {
	if n := len(ops); n > 0 && len(res) == n && ops[n-1].Verb == OpUnlock {
		b.hub.released(res[n-1])
	}
}

// knownState is the state of a lock key as this replica's last release of
// it left it, or nil.
func (h *hub) knownState(key string) *State {
	e := h.known.get(key)
	if e == nil {
		return nil
	}
	st := deriveState(key, []*Entry{e}, e.ModifyIndex)
	st.partial = true
	return st
}
