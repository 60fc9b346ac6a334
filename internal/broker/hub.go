package broker

import (
	"context"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Watch sharing and the Consul connection budget.
//
// Every hold, waiter and observer of a key subscribes to the key, and all
// subscribers of one key on a replica share one keyWatch. A keyWatch
// learns of changes in one of two ways:
//
//   - dedicated: its own Consul blocking query (a listing of the key and
//     everything under it). At most maxDedicated run at once per replica:
//     a hard cap, so that blocking queries plus renewals and writes stay
//     under Consul's http_max_conns_per_client (200) with room for a
//     second replica, and consulstore gives renewals and writes their own
//     connections besides.
//   - swept: every other watched key is checked by the sweeper, every
//     sweepInterval, with read-only transactions of check-index and
//     check-not-exists ops on the entries it last saw (up to MaxTxnOps per
//     transaction, no Raft write). Consul lists every failing check, so
//     one transaction covers ~60-120 keys and only changed keys are read
//     again. 10,000 keys cost ~100 read-only transactions per sweep,
//     however they are spread over prefixes: no query ever lists more
//     than one key's own entries, and none lists the whole KV store.
//
// Keys are dedicated first come, first served; a dedicated watch nobody
// needs any more lingers until its query returns (Consul keeps serving an
// abandoned blocking query, and its connection, until its wait time ends)
// and is reused if its key is wanted again.
const (
	DefaultMaxBlocking   = 32
	DefaultSweepInterval = 300 * time.Millisecond
	// sweepParallel bounds the sweeper's transactions in flight.
	sweepParallel = 4
	// maxSweptEntries: a key with more entries under it is re-listed every
	// sweep instead of checked entry by entry.
	maxSweptEntries = 32
)

// hub shares change notification among the subscribers of each key.
type hub struct {
	store         Store
	log           *zap.Logger
	maxDedicated  int
	sweepInterval time.Duration

	mu        sync.Mutex
	watches   map[string]*keyWatch
	dedicated int                         // running dedicated queries, lingering ones included
	running   map[*keyWatch]*dedicatedRun // each dedicated key's current query loop
	guards    map[*guard]struct{}
	// sweepChecks and guardChecks are the sweep loop's batches, kept
	// between rounds.
	sweepChecks checkBatches[*keyWatch]
	guardChecks checkBatches[*guard]
	known       knownFree // see known.go
	// young are the young holds checked every youngEvery while their
	// watch is pending, youngRunning whether that loop runs (young.go).
	young        map[*sub]youngCheck
	youngRunning bool
	// kvIndex is the KV store's index as the history probe last read it,
	// historyBusy whether that read is out (see history.go).
	kvIndex     uint64
	historyBusy atomic.Bool
	closed      bool // close was called
	kick        chan struct{}
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
}

func newHub(store Store, log *zap.Logger, maxDedicated int, sweepInterval time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hub{
		store: store, log: log, maxDedicated: maxDedicated, sweepInterval: sweepInterval,
		watches: make(map[string]*keyWatch), running: make(map[*keyWatch]*dedicatedRun), guards: make(map[*guard]struct{}), kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
	}
	h.wg.Go(func() { h.sweep(ctx) })
	return h
}

// keyWatch holds the newest listing of one key and its subscribers.
type keyWatch struct {
	h         *hub
	key       string
	dedicated bool
	pending   bool // not started yet (see subscribeLazy); under h.mu
	// startTimer starts a pending watch when its first subscriber stops
	// being young (startAfterLocked), startGen numbers it; under h.mu.
	startTimer *time.Timer
	startGen   uint64

	mu      sync.Mutex
	entries []*Entry // at key and under key/, sorted by key
	index   uint64
	ready   bool
	stale   bool // swept: re-list at the next sweep
	subs    map[*sub]struct{}
	delays  map[string]time.Duration // lock-delay of holder sessions
	arrived uint64                   // waiters so far (their order)
	// courtesy: this replica's waiters leave the key free until then
	// (handoffChain).
	courtesy time.Time
	// own: the listing is this replica's own write alone (publishOwn).
	own bool
	// queued: a lock hold of this replica that ended while others of the
	// key's holds were still here used the key's shared queue; the last
	// one out tidies it (see lastOut).
	queued bool
	// published is when the newest listing came (see describe), began
	// when its read began (see publish).
	published, began time.Time
	// rwGate and rwLast line up this replica's read-write arrivals on
	// the key (see rwlock.go, rwEnter).
	rwGate   chan struct{}
	rwLast   *State
	rwLastAt time.Time
}

// sub is one subscriber of a key. It keeps only a wake-up signal and a
// counter of the states it did not read, so a slow reader costs nothing.
type sub struct {
	kw        *keyWatch
	wake      chan struct{}
	fp        fingerprint // of the key's entries at the last publication
	need      uint64      // wake once the listing reaches this index (see want)
	woke      uint64      // listing index of the last wake-up
	seen      uint64      // publications so far
	read      uint64      // publications up to the last read
	closeOnce sync.Once
	// waiting and order place the subscriber in the key's local queue of
	// waiters (see rank).
	waiting bool
	order   uint64
	// young: a lazy subscriber (a hold) needs no watch before this time
	// (see subscribeLazy); zero once it needs one.
	young time.Time
	// holder is the hold subscribed (nil for a watcher); slot its offer of
	// a direct hand-off while it sleeps (see handoff.go). Under kw.mu.
	holder *hold
	slot   *handoffSlot
	// offered is open while a waiting holder is between two sleeps (it
	// has no slot now, and will decide on one): made when it starts
	// waiting and when it withdraws a slot, closed when it offers the
	// next (or decides not to) and when it stops waiting. A releaser
	// that finds the head between sleeps waits on it (claimNext). Under
	// kw.mu.
	offered chan struct{}
	// ticket is the CreateIndex of the holder's ticket in the key's shared
	// queue, 0 without one, and ahead the live tickets ahead of it as far
	// as this replica knows (ticket.go). Under kw.mu.
	ticket uint64
	ahead  []*Entry
	// queuer: the subscriber is a lock hold (or a multi-key hold's key),
	// which may use the key's shared queue; out, once it has counted
	// itself out of it (lastOut). Under kw.mu.
	queuer, out bool
}

// fingerprint summarises a key's entries to tell whether they changed.
type fingerprint struct{ n, max, sum uint64 }

func (h *hub) subscribeAt(key string, lazy bool) *sub {
	h.mu.Lock()
	kw := h.watches[key]
	if kw == nil {
		kw = &keyWatch{h: h, key: key, stale: true, subs: make(map[*sub]struct{}), delays: make(map[string]time.Duration), pending: true}
		h.watches[key] = kw
		if lazy {
			h.startAfterLocked(kw, time.Now().Add(watchDelay))
		} else {
			h.startLocked(kw)
		}
	} else if !lazy {
		h.startLocked(kw)
	}
	s := &sub{kw: kw, wake: make(chan struct{}, 1)}
	if lazy {
		s.young = time.Now().Add(watchDelay)
	}
	kw.mu.Lock()
	kw.subs[s] = struct{}{}
	if kw.ready {
		s.fp = fingerprintOf(kw.entries)
		s.seen = 1
		s.wake <- struct{}{}
	}
	kw.mu.Unlock()
	h.mu.Unlock()
	return s
}

func (h *hub) kickLocked() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// close ends the subscription. An idle swept watch is dropped by the
// sweeper; an idle dedicated one when its query returns.
func (s *sub) close() {
	s.closeOnce.Do(func() {
		s.setWaiting(false, true)
		s.kw.mu.Lock()
		delete(s.kw.subs, s)
		s.kw.mu.Unlock()
	})
}

// refresh asks for the key to be read again at the next sweep (a swept
// key whose holder changed it through this replica).
func (s *sub) refresh() {
	kw := s.kw
	kw.h.mu.Lock()
	skip := kw.dedicated || kw.pending
	kw.h.mu.Unlock()
	if skip {
		return
	}
	kw.mu.Lock()
	kw.stale = true
	kw.mu.Unlock()
	kw.h.mu.Lock()
	kw.h.kickLocked()
	kw.h.mu.Unlock()
}

// holderDelay returns the lock-delay of a holder's session, read once per
// watch and shared by its waiters; ok is false when it cannot be read.
func (s *sub) holderDelay(ctx context.Context, session string) (time.Duration, bool) {
	kw := s.kw
	kw.mu.Lock()
	d, ok := kw.delays[session]
	kw.mu.Unlock()
	if ok {
		return d, true
	}
	info, err := kw.h.store.Session(ctx, session)
	if err != nil {
		return 0, false
	}
	kw.mu.Lock()
	if len(kw.delays) > 1024 {
		clear(kw.delays)
	}
	kw.delays[session] = info.LockDelay
	kw.mu.Unlock()
	return info.LockDelay, true
}

// under keeps the entries at key or under key/ (a listing of prefix key
// also returns siblings such as key2), sorted by key.
func under(key string, entries []*Entry) []*Entry {
	out := entries[:0:0]
	for _, e := range entries {
		if e.Key == key || (len(e.Key) > len(key) && strings.HasPrefix(e.Key, key) && e.Key[len(key)] == '/') {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
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

// publish stores a new listing, whose read began at began, and wakes the
// subscribers (all of them on the first listing, else those whose wake
// condition holds).
//
// A listing at a lower index than the one it replaces is older when its
// read began before that one came (a slow read raced a newer one), and
// is dropped. One whose read began after is newer all the same: Consul's
// index went back (a snapshot restore, see DESIGN.md "Restores and going
// back in time"), and the key's history starts again from it. (Dropping
// those too left every watch blind after a restore until the index caught
// up again: issue 41.)
func (kw *keyWatch) publish(entries []*Entry, index uint64, began time.Time) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.ready && index < kw.index && index != 0 && !began.After(kw.published) {
		return // older than what we have
	}
	first := !kw.ready
	kw.entries, kw.index, kw.ready, kw.stale, kw.own = entries, index, true, false, false
	kw.published, kw.began = time.Now(), began
	fp := fingerprintOf(entries)
	for s := range kw.subs {
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

// newest returns the key's newest state (nil before the first read) and
// when the read of its listing began: a state whose index is below a
// grant's token but whose read began after the grant is of a new history
// (see publish), not older than the grant.
func (s *sub) newest() (*State, time.Time) {
	st, _ := s.state()
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if st == nil || st.Index != kw.index {
		return st, time.Time{} // a newer listing came meanwhile: it wakes again
	}
	return st, kw.began
}

// close stops every watch and waits for them.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true // no watch starts after this (a lazy start's timer may still fire)
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}
