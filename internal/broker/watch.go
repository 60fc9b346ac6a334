package broker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// hub shares Consul blocking queries: one per watched key per replica,
// fanned out to every hold, waiter and observer of that key.
type hub struct {
	store Store
	log   *zap.Logger

	mu      sync.Mutex
	watches map[string]*keyWatch
	wg      sync.WaitGroup
}

func newHub(store Store, log *zap.Logger) *hub {
	return &hub{store: store, log: log, watches: make(map[string]*keyWatch)}
}

// keyWatch runs the blocking query of one key (a listing of the key and
// everything under it) and publishes each new state.
type keyWatch struct {
	h      *hub
	key    string
	cancel context.CancelFunc

	mu      sync.Mutex
	entries []*Entry
	index   uint64
	ready   bool
	subs    map[*sub]struct{}
	// terms remembers the fencing token of each grant this watch saw or
	// this replica made, by session and lock index. Consul forgets the
	// index of a granting write once the holder rewrites its value.
	terms map[string]uint64
	// delays caches the lock-delay of holder sessions, for waiters.
	delays map[string]time.Duration
}

// sub is one subscriber of a keyWatch. It keeps only a wake-up signal and
// a counter of the states it did not read, so a slow reader costs nothing.
type sub struct {
	kw      *keyWatch
	wake    chan struct{}
	mu      sync.Mutex
	seen    uint64 // publications so far
	read    uint64 // publications up to the last read
	closeMu sync.Once
}

func termKey(key, session string, lockIndex uint64) string {
	return key + "\x00" + session + "/" + strconv.FormatUint(lockIndex, 10)
}

// subscribe returns a subscription to key, starting its watch if needed.
func (h *hub) subscribe(key string) *sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	kw, ok := h.watches[key]
	if !ok {
		ctx, cancel := context.WithCancel(context.Background())
		kw = &keyWatch{h: h, key: key, cancel: cancel, subs: make(map[*sub]struct{}), terms: make(map[string]uint64), delays: make(map[string]time.Duration)}
		h.watches[key] = kw
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			kw.run(ctx)
		}()
	}
	s := &sub{kw: kw, wake: make(chan struct{}, 1)}
	kw.mu.Lock()
	kw.subs[s] = struct{}{}
	if kw.ready {
		s.seen = 1
		s.wake <- struct{}{}
	}
	kw.mu.Unlock()
	return s
}

// terms returns the known token of key's grant to session at lockIndex.
func (h *hub) term(key, session string, lockIndex uint64) (uint64, bool) {
	h.mu.Lock()
	kw := h.watches[key]
	h.mu.Unlock()
	if kw == nil {
		return 0, false
	}
	kw.mu.Lock()
	defer kw.mu.Unlock()
	t, ok := kw.terms[termKey(key, session, lockIndex)]
	return t, ok
}

// close ends the subscription; the last one stops the key's watch.
func (s *sub) close() {
	s.closeMu.Do(func() {
		h := s.kw.h
		h.mu.Lock()
		defer h.mu.Unlock()
		s.kw.mu.Lock()
		delete(s.kw.subs, s)
		empty := len(s.kw.subs) == 0
		s.kw.mu.Unlock()
		if empty && h.watches[s.kw.key] == s.kw {
			delete(h.watches, s.kw.key)
			s.kw.cancel()
		}
	})
}

// setTerm records the token of a grant made by this replica.
func (s *sub) setTerm(seq *Sequencer) {
	s.kw.mu.Lock()
	s.kw.terms[termKey(seq.Key, seq.Session, seq.LockIndex)] = seq.Token
	s.kw.mu.Unlock()
}

// holderDelay returns the lock-delay of a holder's session, read once per
// watched key and shared by its waiters. ok is false when it cannot be
// read (the session is already gone).
func (s *sub) holderDelay(ctx context.Context, session string) (time.Duration, bool) {
	s.kw.mu.Lock()
	d, ok := s.kw.delays[session]
	s.kw.mu.Unlock()
	if ok {
		return d, true
	}
	info, err := s.kw.h.store.Session(ctx, session)
	if err != nil {
		return 0, false
	}
	s.kw.mu.Lock()
	if len(s.kw.delays) > 1024 {
		clear(s.kw.delays)
	}
	s.kw.delays[session] = info.LockDelay
	s.kw.mu.Unlock()
	return info.LockDelay, true
}

// state returns the newest state (nil before the first read) and how many
// publications were skipped since the previous call.
func (s *sub) state() (*State, uint64) {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if !kw.ready {
		return nil, 0
	}
	s.mu.Lock()
	skipped := uint64(0)
	if s.seen > s.read+1 {
		skipped = s.seen - s.read - 1
	}
	s.read = s.seen
	s.mu.Unlock()
	return kw.stateLocked(), skipped
}

// entries returns the newest raw listing and its index.
func (s *sub) listing() ([]*Entry, uint64, bool) {
	s.kw.mu.Lock()
	defer s.kw.mu.Unlock()
	return s.kw.entries, s.kw.index, s.kw.ready
}

func (kw *keyWatch) stateLocked() *State {
	st := deriveState(kw.key, kw.entries, kw.index)
	kw.fillTerms(st)
	return st
}

// fillTerms sets each holder's token from the remembered terms, learning
// the terms of holders seen for the first time.
func (kw *keyWatch) fillTerms(st *State) {
	for i := range st.Holders {
		h := &st.Holders[i]
		tk := termKey(st.Key, h.Session, h.LockIndex)
		if t, ok := kw.terms[tk]; ok {
			h.Token = t
			continue
		}
		switch st.Kind {
		case KindLock:
			h.Token = st.lock.ModifyIndex
		case KindSemaphore:
			h.Token = st.semLock.ModifyIndex
		}
		kw.terms[tk] = h.Token
	}
}

// pruneTerms forgets the terms of grants that are no longer held.
func (kw *keyWatch) pruneTerms(st *State) {
	if len(kw.terms) <= 64 {
		return
	}
	live := make(map[string]bool, len(st.Holders))
	for _, h := range st.Holders {
		live[termKey(st.Key, h.Session, h.LockIndex)] = true
	}
	for k := range kw.terms {
		if !live[k] {
			delete(kw.terms, k)
		}
	}
}

func (kw *keyWatch) run(ctx context.Context) {
	var index uint64
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		entries, next, err := kw.h.store.List(ctx, kw.key, index, false)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			kw.h.log.Debug("watch failed; retrying", zap.String("key", kw.key), zap.Error(err), zap.Duration("backoff", backoff))
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if next < index {
			index = 0 // Consul's index went back (restore, new cluster): start over
			continue
		}
		if next == index && kw.isReady() {
			continue // wait time ran out without a change
		}
		index = next
		if next == 0 {
			index = 1
		}
		kw.publish(entries, next)
	}
}

func (kw *keyWatch) isReady() bool {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return kw.ready
}

func (kw *keyWatch) publish(entries []*Entry, index uint64) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	kw.entries, kw.index, kw.ready = filterUnder(kw.key, entries), index, true
	st := deriveState(kw.key, kw.entries, index)
	kw.fillTerms(st)
	kw.pruneTerms(st)
	for s := range kw.subs {
		s.mu.Lock()
		s.seen++
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// filterUnder keeps the entries at key or under key/ (a listing of prefix
// key also returns siblings such as key2).
func filterUnder(key string, entries []*Entry) []*Entry {
	out := entries[:0:0]
	for _, e := range entries {
		if e.Key == key || (len(e.Key) > len(key) && e.Key[:len(key)] == key && e.Key[len(key)] == '/') {
			out = append(out, e)
		}
	}
	return out
}

// close stops every watch and waits for them.
func (h *hub) close() {
	h.mu.Lock()
	for k, kw := range h.watches {
		kw.cancel()
		delete(h.watches, k)
	}
	h.mu.Unlock()
	h.wg.Wait()
}
