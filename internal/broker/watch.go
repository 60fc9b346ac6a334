package broker

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Watch sharing. Every hold, waiter and observer of a key subscribes to
// the key; subscribers of one key share one Consul blocking query (a
// listing of the key and everything under it). Consul serves at most
// http_max_conns_per_client (default 200) connections to one client, so a
// replica keeps at most dedicatedBudget such per-key queries; keys beyond
// that are watched through one shared query per parent prefix (for
// "jobs/123", a listing of "jobs/"), which wakes only the subscribers whose
// key changed. Shared queries pause sharedInterval between rounds to bound
// the cost of re-listing a busy prefix.
const (
	dedicatedBudget = 64
	sharedInterval  = 100 * time.Millisecond
)

// hub shares Consul blocking queries among the subscribers of each key.
type hub struct {
	store Store
	log   *zap.Logger

	mu        sync.Mutex
	dedicated map[string]*keyWatch // by key
	shared    map[string]*keyWatch // by parent prefix
	wg        sync.WaitGroup
}

func newHub(store Store, log *zap.Logger) *hub {
	return &hub{store: store, log: log, dedicated: make(map[string]*keyWatch), shared: make(map[string]*keyWatch)}
}

// keyWatch runs one blocking query (a listing of prefix) and publishes
// each new listing to the subscribers whose keys it changed.
type keyWatch struct {
	h      *hub
	prefix string
	shared bool
	cancel context.CancelFunc

	mu      sync.Mutex
	entries []*Entry // sorted by key
	index   uint64
	ready   bool
	subs    map[*sub]struct{}
	// terms remembers the fencing token of each grant this watch saw or
	// this replica made, by key, session and lock index. Consul forgets
	// the index of a granting write once the holder rewrites its value.
	terms map[string]uint64
	// delays caches the lock-delay of holder sessions, for waiters.
	delays map[string]time.Duration
}

// sub is one subscriber of a key. It keeps only a wake-up signal and a
// counter of the states it did not read, so a slow reader costs nothing.
type sub struct {
	kw      *keyWatch
	key     string
	wake    chan struct{}
	fp      fingerprint // of the key's entries at the last publication
	need    uint64      // wake once the listing reaches this index (see want)
	woke    uint64      // listing index of the last wake-up
	seen    uint64      // publications of this key so far
	read    uint64      // publications up to the last read
	closeMu sync.Once
}

// fingerprint summarises a key's entries to tell whether they changed.
type fingerprint struct{ n, max, sum uint64 }

func termKey(key, session string, lockIndex uint64) string {
	return key + "\x00" + session + "/" + strconv.FormatUint(lockIndex, 10)
}

// parentPrefix is the prefix a key beyond the budget is watched through.
func parentPrefix(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i+1]
	}
	return ""
}

// subscribe returns a subscription to key, starting a watch if needed.
func (h *hub) subscribe(key string) *sub {
	h.mu.Lock()
	defer h.mu.Unlock()
	kw := h.dedicated[key]
	if kw == nil && len(h.dedicated) >= dedicatedBudget {
		p := parentPrefix(key)
		if kw = h.shared[p]; kw == nil {
			kw = h.start(p, true)
			h.shared[p] = kw
		}
	}
	if kw == nil {
		kw = h.start(key, false)
		h.dedicated[key] = kw
	}
	s := &sub{kw: kw, key: key, wake: make(chan struct{}, 1)}
	kw.mu.Lock()
	kw.subs[s] = struct{}{}
	if kw.ready {
		s.fp = fingerprintOf(kw.entriesOf(key))
		s.seen = 1
		s.wake <- struct{}{}
	}
	kw.mu.Unlock()
	return s
}

func (h *hub) start(prefix string, shared bool) *keyWatch {
	ctx, cancel := context.WithCancel(context.Background())
	kw := &keyWatch{
		h: h, prefix: prefix, shared: shared, cancel: cancel,
		subs: make(map[*sub]struct{}), terms: make(map[string]uint64), delays: make(map[string]time.Duration),
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		kw.run(ctx)
	}()
	return kw
}

// term returns the known token of key's grant to session at lockIndex.
func (h *hub) term(key, session string, lockIndex uint64) (uint64, bool) {
	h.mu.Lock()
	kw := h.dedicated[key]
	if kw == nil {
		kw = h.shared[parentPrefix(key)]
	}
	h.mu.Unlock()
	if kw == nil {
		return 0, false
	}
	kw.mu.Lock()
	defer kw.mu.Unlock()
	t, ok := kw.terms[termKey(key, session, lockIndex)]
	return t, ok
}

// close ends the subscription.
func (s *sub) close() {
	s.closeMu.Do(func() {
		h := s.kw.h
		h.mu.Lock()
		defer h.mu.Unlock()
		s.kw.mu.Lock()
		delete(s.kw.subs, s) // an idle watch ends itself (see retire)
		s.kw.mu.Unlock()
	})
}

// want asks for a wake-up once the listing reaches index, even if the
// key's entries then look the same as before: a key created and deleted
// between two listings (a grant and its loss) leaves no trace in them.
func (s *sub) want(index uint64) {
	s.kw.mu.Lock()
	s.need = index
	s.kw.mu.Unlock()
}

// setTerm records the token of a grant made by this replica.
func (s *sub) setTerm(seq *Sequencer) {
	s.kw.mu.Lock()
	s.kw.terms[termKey(seq.Key, seq.Session, seq.LockIndex)] = seq.Token
	s.kw.mu.Unlock()
}

// holderDelay returns the lock-delay of a holder's session, read once per
// watch and shared by its waiters. ok is false when it cannot be read (the
// session is already gone).
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

// state returns the key's newest state (nil before the first read) and
// how many publications were skipped since the previous call.
func (s *sub) state() (*State, uint64) {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if !kw.ready {
		return nil, 0
	}
	skipped := s.takeSkippedLocked()
	st := deriveState(s.key, kw.entriesOf(s.key), kw.index)
	kw.fillTerms(st)
	return st, skipped
}

// takeSkippedLocked returns how many publications were skipped since the
// previous read, and marks them read. kw.mu must be held.
func (s *sub) takeSkippedLocked() uint64 {
	skipped := uint64(0)
	if s.seen > s.read+1 {
		skipped = s.seen - s.read - 1
	}
	s.read = s.seen
	return skipped
}

// listing returns the newest entries at and under the key, their index,
// and how many publications were skipped since the previous read (as
// state does).
func (s *sub) listing() (entries []*Entry, index, skipped uint64, ready bool) {
	s.kw.mu.Lock()
	defer s.kw.mu.Unlock()
	if !s.kw.ready {
		return nil, 0, 0, false
	}
	return s.kw.entriesOf(s.key), s.kw.index, s.takeSkippedLocked(), true
}

// fill sets the tokens of st's holders from this watch's terms.
func (s *sub) fill(st *State) {
	s.kw.mu.Lock()
	s.kw.fillTerms(st)
	s.kw.mu.Unlock()
}

// entriesOf returns the entries at key and under key/ (kw.entries is
// sorted, so this is one binary search).
func (kw *keyWatch) entriesOf(key string) []*Entry {
	i := sort.Search(len(kw.entries), func(i int) bool { return kw.entries[i].Key >= key })
	var out []*Entry
	for ; i < len(kw.entries); i++ {
		e := kw.entries[i]
		if e.Key == key {
			out = append(out, e)
			continue
		}
		if !strings.HasPrefix(e.Key, key) {
			break
		}
		if e.Key[len(key)] == '/' {
			out = append(out, e)
		}
		// siblings such as key2 or key-x sort among key/...: skip them
	}
	return out
}

func fingerprintOf(entries []*Entry) fingerprint {
	var fp fingerprint
	for _, e := range entries {
		fp.n++
		fp.max = max(fp.max, e.ModifyIndex)
		fp.sum += e.ModifyIndex
	}
	return fp
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

// pruneTerms forgets terms (and lock-delays) of sessions that no longer
// appear in the listing.
func (kw *keyWatch) pruneTerms() {
	if len(kw.terms) <= 4*len(kw.subs)+64 {
		return
	}
	live := make(map[string]bool)
	for _, e := range kw.entries {
		if e.Session != "" {
			live[e.Session] = true
		}
	}
	for k := range kw.terms {
		if i := strings.IndexByte(k, 0); i >= 0 {
			if sid, _, ok := strings.Cut(k[i+1:], "/"); ok && !live[sid] {
				delete(kw.terms, k)
			}
		}
	}
}

// retire removes the watch from the hub if it has no subscribers. A watch
// is never cancelled while its query is open: Consul keeps serving a
// blocking query whose client went away until the query's wait time runs
// out, and the connection counts against http_max_conns_per_client all
// that time. An idle watch instead lingers until its query returns (at
// most the store's wait time), still counted in the budget and reused if
// its key is wanted again.
func (kw *keyWatch) retire() bool {
	h := kw.h
	h.mu.Lock()
	defer h.mu.Unlock()
	kw.mu.Lock()
	idle := len(kw.subs) == 0
	kw.mu.Unlock()
	if !idle {
		return false
	}
	m := h.dedicated
	if kw.shared {
		m = h.shared
	}
	if m[kw.prefix] == kw {
		delete(m, kw.prefix)
	}
	return true
}

func (kw *keyWatch) run(ctx context.Context) {
	defer kw.cancel()
	var index uint64
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if index > 0 && kw.retire() {
			return
		}
		entries, next, err := kw.h.store.Watch(ctx, kw.prefix, index)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			kw.h.log.Debug("watch failed; retrying", zap.String("prefix", kw.prefix), zap.Error(err), zap.Duration("backoff", backoff))
			if !sleep(ctx, backoff) {
				return
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
		index = max(next, 1)
		kw.publish(entries, next)
		if kw.shared && !sleep(ctx, sharedInterval) {
			return
		}
	}
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

func (kw *keyWatch) isReady() bool {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return kw.ready
}

// publish stores a new listing and wakes the subscribers whose key's
// entries changed (all of them on the first listing).
func (kw *keyWatch) publish(entries []*Entry, index uint64) {
	if !sort.SliceIsSorted(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key }) {
		sort.Slice(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key })
	}
	kw.mu.Lock()
	defer kw.mu.Unlock()
	first := !kw.ready
	kw.entries, kw.index, kw.ready = entries, index, true
	kw.pruneTerms()
	fps := make(map[string]fingerprint)
	for s := range kw.subs {
		fp, ok := fps[s.key]
		if !ok {
			fp = fingerprintOf(kw.entriesOf(s.key))
			fps[s.key] = fp
		}
		due := s.need > 0 && s.woke < s.need && index >= s.need
		if !first && fp == s.fp && !due {
			continue
		}
		s.fp, s.woke = fp, index
		s.seen++
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// close stops every watch and waits for them.
func (h *hub) close() {
	h.mu.Lock()
	for _, m := range []map[string]*keyWatch{h.dedicated, h.shared} {
		for k, kw := range m {
			kw.cancel()
			delete(m, k)
		}
	}
	h.mu.Unlock()
	h.wg.Wait()
}
