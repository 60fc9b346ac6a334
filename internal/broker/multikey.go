package broker

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"
)

// A multi-key lock (AcquireSpec.Keys) takes every one of its keys in one
// Consul transaction, with one session, or none (docs/consul-layout.md):
//
//   - a newcomer may take them all at once only when every key is free
//     and has no live ticket in its shared queue (ticket.go): one lock op
//     and one check of the queue's guard per key (2N ops);
//   - otherwise it queues in every key's shared queue at once: one
//     transaction acquires its ticket K/.queue/<session> in each key's
//     queue and writes each guard by check-and-set (2N ops), so all its
//     tickets share one CreateIndex. That one place orders it against
//     every other request on any of its keys: a total order, so two
//     multi-key requests never wait for each other (no deadlock), and a
//     single-key waiter that comes later queues behind it on that key
//     (no starvation);
//   - while it waits with a key free (another of its keys is held, or
//     has a ticket ahead), it touches its tickets on the free keys every
//     queueTouch, in one check-and-set transaction (touch): waiters
//     behind it there see it alive and do not pass it after queueGrace
//     (ticket.go), as they would pass a head whose waiter is gone. It
//     touches them whether it heads those queues or not: when a silent
//     ticket ahead of it is skipped after the grace, it is already seen
//     alive, and the waiters behind it, whose grace ran as long, do not
//     take the key in the moment it becomes the head;
//   - it is granted when it heads every key's queue (no live ticket ahead
//     of its own) and every key is free: one transaction of N lock ops,
//     with the session's record and the removal of its tickets as far as
//     they fit in Consul's 128 operations; what does not fit follows in a
//     second transaction (tickets of a held key block nobody: the key is
//     held anyway).
//
// The hold watches every key; the loss of any ends the whole hold, and
// one transaction unlocks the others. A newcomer's watches start as a
// single hold's do (subscribeLazy): only when it must wait, or
// watchDelay after it subscribed; meanwhile it builds its grant on what
// this replica knows of each key (its own last release, else absent),
// which the granting transaction checks, and a granted key is checked
// every youngEvery until its watch starts (young.go). So an uncontended
// cycle costs Consul its two transactions and no query, and a fresh
// hold hears the loss of any key as soon as an older one. A release unlocks every key in one
// transaction, with the record. A single-key hand-off (handoff.go) never
// goes to a multi-key waiter: it does not offer a hand-off slot.

// multiHold is one multi-key Acquire. The hold h carries what a hold of
// one key carries (session, renewer, lifecycle, record); h.spec.Key is
// the first key.
type multiHold struct {
	h    *hold
	keys []string // every key, the request's order: h.spec.Key first

	subs    []*sub
	changed chan struct{} // a key's watch published (see forward)
	stop    chan struct{}
	fwd     sync.WaitGroup
	// lazy: the keys' watches were subscribed lazily and not activated
	// yet (see subscribe and activate); only the wait loop touches it.
	lazy bool

	// tickets: the CreateIndex of the request's ticket in each key's
	// queue (0 without); ahead: the live tickets ahead of it, by key, as
	// far as this replica knows (they only ever leave); freeSince: when
	// each key was first seen free with a ticket ahead (queueGrace), and
	// aheadMark the touchMark of its tickets ahead then.
	tickets     []uint64
	ahead       [][]*Entry
	freeSince   []time.Time
	aheadMark   []uint64
	ticketTried bool
	// ticketMod: each ticket's ModifyIndex as last known (what a touch
	// checks); free: the keys the last attempt saw free while the
	// request waits with a ticket there; touched: the last touch.
	ticketMod []uint64
	free      []bool
	touched   time.Time
	// resumeReads: openResumed's reads, for resume's first attempt.
	resumeReads []*State

	mu      sync.Mutex
	seqs    []Sequencer // the grants, the request's order
	values  [][]byte    // each key's value as last seen (an unlock writes it back)
	lostKey string      // the key whose loss ended the hold
}

// maxLazyKeys: a newcomer with at most this many keys subscribes lazily
// (see subscribe): its grant on unread states checks each key (up to 4
// ops a key, with the record's 2).
const maxLazyKeys = (MaxTxnOps - 2) / 4

// maxMultiValue bounds the values one multi-key grant writes, every key's
// together (the value limit of a single-key grant): the transaction must
// fit Consul's default txn_max_req_len (512 KiB, values in base64).
const maxMultiValue = 262144

// acquireMulti runs a multi-key hold, as Acquire runs one of one key.
func (b *Broker) acquireMulti(ctx context.Context, spec *AcquireSpec, send func(Event) error) error {
	m, err := b.beginMulti(ctx, spec, send)
	if err != nil {
		return err
	}
	defer m.close()
	return m.keep(ctx)
}

// checkMulti refuses a multi-key spec the broker cannot serve (the server
// refuses these first, naming `keys`).
func checkMulti(spec *AcquireSpec) error {
	keys := append([]string{spec.Key}, spec.Keys...)
	switch {
	case spec.Mode != ModeNone || spec.Semaphore || spec.Limit > 1:
		return invalid("keys", "a multi-key lock takes locks only (no semaphore, read or write kind)")
	case len(keys) > MaxTxnOps/2:
		return invalid("keys", "at most %d keys with `key`, got %d", MaxTxnOps/2-1, len(spec.Keys))
	case len(spec.Value)*len(keys) > maxMultiValue:
		return invalid("value", "with %d keys at most %d bytes (every key gets the value, in one transaction), got %d", len(keys), maxMultiValue/len(keys), len(spec.Value))
	case spec.SessionID != "":
		return invalid("keys", "a multi-key lock needs a session of the broker's own: session_id cannot have keys")
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			return invalid("keys", "key %q is named twice", k)
		}
		seen[k] = true
	}
	return nil
}

func (b *Broker) beginMulti(ctx context.Context, spec *AcquireSpec, send func(Event) error) (*multiHold, error) {
	if err := checkMulti(spec); err != nil {
		return nil, err
	}
	if !b.enter() {
		return nil, newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; retry on another replica")
	}
	h := b.newHold(ctx, *spec, send)
	m := &multiHold{h: h, keys: append([]string{spec.Key}, spec.Keys...), changed: make(chan struct{}, 1), stop: make(chan struct{})}
	n := len(m.keys)
	m.tickets, m.ahead, m.freeSince = make([]uint64, n), make([][]*Entry, n), make([]time.Time, n)
	m.aheadMark, m.ticketMod, m.free = make([]uint64, n), make([]uint64, n), make([]bool, n)
	m.values = make([][]byte, n)
	for i := range m.values {
		m.values[i] = spec.Value
	}
	begun := false
	defer func() {
		if !begun {
			m.close()
		}
	}()
	if err := m.openSession(ctx); err != nil {
		return nil, err
	}
	b.setWaiting(h, true)
	m.subscribe(spec.Resume == nil && len(m.keys) <= maxLazyKeys)
	if h.owned {
		h.ren = newRenewer(h.st, h.session, h.ttl, h.start, b.renewals)
		h.ren.start()
	}
	var seqs []Sequencer
	var err error
	resumed := spec.Resume != nil && spec.Resume.Token != 0
	switch {
	case resumed:
		seqs, err = m.resume(ctx)
	case spec.Resume != nil:
		// A wait moved from another replica: it goes on from its places.
		if err = m.resumeWait(ctx); err == nil {
			seqs, err = m.wait(ctx)
		}
	default:
		seqs, err = m.wait(ctx)
	}
	b.setWaiting(h, false)
	if seqs != nil {
		m.setGrants(seqs)
	}
	if err == nil && !h.life.Grant() {
		err = ctx.Err()
	}
	if err != nil {
		h.life.End(Outcome{Kind: OutcomeFailed})
		if spec.Resume != nil && !h.resumedWait {
			return nil, err // not ours: the replica that granted it keeps it
		}
		r, _ := ReasonOf(err)
		h.movable = r == ReasonReplicaCutOff || r == ReasonBrokerShuttingDown
		if r == ReasonConsulUnavailable || h.movable {
			// Consul may not answer here: the client learns it now and
			// may go to another replica (where the wait starts anew); the
			// clean-up follows, bounded by cleanupContext (and tidies
			// the queues: close leaves that to it).
			h.abandonLater = true
			b.holds.Add(1)
			go func() { defer b.holds.Done(); m.abandon(seqs != nil) }()
			return nil, err
		}
		m.abandon(seqs != nil)
		return nil, err
	}
	b.registerMulti(m)
	h.guard = b.hub.addGuard(recordKey(h.session), h.record().index)
	if g := h.guaranteed(); h.ren != nil && g <= 0 {
		h.life.End(lost(LostRenewalFailed, "the grant came after the session's safe deadline (no renewal succeeded in time), so it was never held safely"))
	} else if err := send(Event{Kind: EventAcquired, Sequencer: seqs[0], Sequencers: slices.Clone(seqs), GuaranteedFor: g, Resumed: resumed}); err != nil && !disconnected(ctx) {
		h.life.End(Outcome{Kind: OutcomeCanceled})
	}
	begun = true
	return m, nil
}

// close gives back what the hold took from the broker; it runs once.
func (m *multiHold) close() {
	h := m.h
	if h.guard != nil {
		h.b.hub.removeGuard(h.guard)
	}
	h.b.unregisterMulti(m)
	if h.ren != nil {
		h.ren.stop()
	}
	close(m.stop)
	m.fwd.Wait()
	if !h.abandonLater {
		m.tidy() // unless an ending above tidied already (lastOut counts once)
	}
	for _, s := range m.subs {
		s.close()
	}
	h.b.holds.Done()
}

// subscribe watches every key and forwards their wake-ups to m.changed:
// lazily for a newcomer (as a single hold, see subscribeLazy: the
// watches start when it must wait, see activate, or watchDelay after
// now), else at once (a resumed hold or wait needs every key's changes).
func (m *multiHold) subscribe(lazy bool) {
	m.lazy = lazy
	for _, k := range m.keys {
		s := m.h.b.hub.subscribeAt(k, lazy)
		s.kw.mu.Lock()
		s.queuer = true
		s.kw.mu.Unlock()
		m.subs = append(m.subs, s)
		m.fwd.Add(1)
		go func() {
			defer m.fwd.Done()
			for {
				select {
				case <-m.stop:
					return
				case <-s.wake:
					select {
					case m.changed <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
}

// openSession takes a ready session from the pool (a request with the
// default options, as for one key), creates one, or renews a resumed one.
func (m *multiHold) openSession(ctx context.Context) error {
	h := m.h
	if h.spec.Resume != nil {
		return m.openResumed(ctx)
	}
	if h.spec.NewSession == nil && h.b.pools != nil {
		if p := h.b.pools.forTenant(h.tenant); p != nil {
			if s := p.getMulti(m.keys); s != nil {
				h.session, h.owned, h.ttl, h.start = s.id, true, DefaultTTL, s.renewed
				h.rec, h.pooled = s.rec, s
				return nil
			}
		}
	}
	return h.createSession(ctx)
}

// activate starts every key's watch that is still pending: the request
// must wait, and wakes on the keys' changes.
func (m *multiHold) activate() {
	if !m.lazy {
		return
	}
	m.lazy = false
	for _, s := range m.subs {
		s.activate()
	}
}

func (m *multiHold) setGrants(seqs []Sequencer) {
	h := m.h
	h.mu.Lock()
	h.seq, h.granted = seqs[0], time.Now()
	h.mu.Unlock()
	m.mu.Lock()
	m.seqs = slices.Clone(seqs)
	m.mu.Unlock()
	for i, s := range m.subs {
		s.want(seqs[i].Token)
		s.refresh()
		h.b.hub.known.forget(seqs[i].Key)
		// Until its watch starts, the key is checked every youngEvery
		// (nothing for a watch that runs already).
		s.checkYoung(seqs[i].Key, seqs[i].Session)
	}
}

func (m *multiHold) grants() []Sequencer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.seqs)
}

// states fills sts with every key's state: the watch's, or a consistent
// read where the watch knows nothing yet or fresh asks for one (after a
// race). The reads go out together, a few at a time. A lazy newcomer
// reads nothing: a key its watch knows nothing of yet is assumed absent
// (a partial state, which the grant checks, as a single hold's first
// attempt does).
func (m *multiHold) states(ctx context.Context, sts []*State, fresh bool) error {
	var missing []int
	for i, s := range m.subs {
		if !fresh {
			st, _ := s.state()
			if known := m.h.b.hub.knownState(m.keys[i]); known != nil && (st == nil || known.Index > st.Index) {
				st = known // this replica's own release, newer than the watch (known.go)
			}
			if st == nil && m.lazy {
				st = &State{Key: m.keys[i], Kind: KindNone, partial: true}
			}
			if st != nil {
				sts[i] = st
				continue
			}
		}
		missing = append(missing, i)
	}
	keys := make([]string, len(missing))
	for j, i := range missing {
		keys[j] = m.keys[i]
	}
	read, err := m.h.b.readStates(ctx, keys)
	if err != nil {
		return err
	}
	for j, i := range missing {
		sts[i] = read[j]
	}
	return nil
}

// readStates reads every key's state consistently, a few at a time.
func (b *Broker) readStates(ctx context.Context, keys []string) ([]*State, error) {
	sts := make([]*State, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, k := range keys {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sts[i], errs[i] = b.readState(ctx, k)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sts, nil
}

// wait is the waiting loop of a multi-key lock: attempt on every key's
// state; queue in every key's queue when it cannot take them all now;
// report and sleep until a key changes.
func (m *multiHold) wait(ctx context.Context) ([]Sequencer, error) {
	h := m.h
	var timeout <-chan time.Time
	if !h.spec.WaitForever && h.spec.Wait > 0 {
		t := time.NewTimer(h.spec.Wait)
		defer t.Stop()
		timeout = t.C
	}
	var failed <-chan error
	if h.ren != nil {
		failed = h.ren.failed
	}
	beat := time.NewTicker(QueuedHeartbeat)
	defer beat.Stop()
	sts := make([]*State, len(m.keys))
	fresh, races := false, 0
	var reported *State
	reportedPos := -1
	for {
		if err := m.states(ctx, sts, fresh); err != nil {
			return nil, err
		}
		wasFresh := fresh
		fresh = false
		for _, st := range sts {
			if err := lockConflict(st); err != nil {
				return nil, err
			}
		}
		seqs, blocked, err := m.attempt(ctx, sts)
		var delay <-chan time.Time
		switch {
		case seqs != nil:
			return seqs, nil
		case errors.Is(err, errRace):
			races++
			if races > maxRaces {
				e := newError(ErrUnavailable, ReasonConsulUnavailable, "keys %q changed under %d attempts in a row; retry later", m.keys, maxRaces)
				e.RetryAfter = time.Second
				return nil, e
			}
			if races > 1 {
				backoff(ctx, races)
			}
			fresh = true
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		case errors.Is(err, errLockDelay):
			if h.tryOnce() {
				return nil, newError(ErrBusy, ReasonLockDelay, "a key of %q is in Consul's lock-delay (its end is unknown to this broker)", m.keys)
			}
			delay = time.After(200 * time.Millisecond)
		case err != nil:
			return nil, err
		}
		if blocked == nil {
			blocked = sts[0]
		}
		if delay == nil && m.tickets[0] == 0 && !wasFresh {
			// Busy as the watch tells it, which may lag (this replica's
			// own release a moment ago, say): read before giving up or
			// queueing.
			fresh = true
			continue
		}
		if h.tryOnce() {
			h.b.fillTokens(ctx, blocked)
			return nil, holdersError(ErrBusy, ReasonLockHeld, blocked)
		}
		m.activate() // it waits: its keys' changes wake it
		if delay == nil && m.tickets[0] == 0 {
			if err := m.enqueue(ctx, sts); errors.Is(err, errRace) {
				fresh = true
				races++
				if races > maxRaces {
					return nil, newError(ErrUnavailable, ReasonConsulUnavailable, "the queues of %q changed under %d attempts in a row; retry later", m.keys, maxRaces)
				}
				continue
			} else if err != nil {
				return nil, err
			}
			continue // queued: look again, with the place
		}
		races = 0
		if m.touch(ctx, sts) {
			fresh = true // a ticket moved under the touch: read again
		}
		pos := m.position(blocked)
		if reported == nil || !sameHolders(reported, blocked) || reported.Key != blocked.Key || pos != reportedPos || reported.Waiting != blocked.Waiting {
			reported, reportedPos = blocked, pos
			h.b.fillTokensCached(blocked)
			if err := m.sendQueued(blocked, pos); err != nil {
				return nil, err
			}
		}
		if err := m.sleep(ctx, reported, reportedPos, beat, delay, timeout, failed); err != nil {
			return nil, err
		}
	}
}

// sleep waits until a key changes, the lock-delay or the grace of a
// silent head ends (see aheadOf), or the wait must end (the error);
// `queued` goes out again every heartbeat meanwhile.
func (m *multiHold) sleep(ctx context.Context, reported *State, pos int, beat *time.Ticker, delay, timeout <-chan time.Time, failed <-chan error) error {
	h := m.h
	var grace <-chan time.Time
	if d, ok := m.graceLeft(); ok {
		t := time.NewTimer(d)
		defer t.Stop()
		grace = t.C
	}
	var touch <-chan time.Time
	if d, ok := m.touchLeft(); ok {
		t := time.NewTimer(d)
		defer t.Stop()
		touch = t.C
	}
	cutOff := h.b.reach.lost()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.b.shutdown:
			return newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; retry on another replica")
		case <-timeout:
			h.b.fillTokens(ctx, reported)
			return holdersError(ErrTimeout, ReasonWaitTimeout, reported)
		case err := <-failed:
			return newError(ErrAborted, ReasonSessionLost, "the request's session was lost while it waited: %v", err)
		case <-cutOff:
			return newError(ErrUnavailable, ReasonReplicaCutOff, "this replica's Consul agent has not answered for %s; wait on another replica", reachGrace)
		case <-beat.C:
			if err := m.sendQueued(reported, pos); err != nil {
				return err
			}
		case <-delay:
			return nil
		case <-grace:
			return nil
		case <-touch:
			return nil
		case <-m.changed:
			return nil
		}
	}
}

func (m *multiHold) sendQueued(st *State, pos int) error {
	return m.h.send(Event{Kind: EventQueued, State: st, Session: m.h.session, Heartbeat: QueuedHeartbeat, Position: pos})
}

// position is the request's place in st's key's queue (1: next), 0
// without a ticket.
func (m *multiHold) position(st *State) int {
	i := slices.Index(m.keys, st.Key)
	if i < 0 || m.tickets[i] == 0 {
		return 0
	}
	return len(m.ahead[i]) + 1
}

// attempt takes every key when the request may: every key free, and
// nobody queued on any (a newcomer) or the request heads every key's
// queue. It returns the grants; or the state of a key in the way; or
// errRace, errLockDelay or a final error.
func (m *multiHold) attempt(ctx context.Context, sts []*State) ([]Sequencer, *State, error) {
	var blocked *State
	for i, st := range sts {
		if _, mine := st.holder(m.h.session); mine {
			continue // a grant whose answer was lost: the transaction tells
		}
		if len(st.Holders) > 0 {
			m.freeSince[i] = time.Time{}
			if blocked == nil {
				blocked = st
			}
		}
	}
	for i, st := range sts {
		m.free[i] = false
		if m.tickets[i] == 0 {
			if st.othersQueued(m.h.session) && blocked == nil {
				blocked = st
			}
			continue
		}
		m.free[i] = len(st.Holders) == 0
		if m.aheadOf(i, st) > 0 && blocked == nil {
			blocked = st
		}
	}
	if blocked != nil {
		return nil, blocked, nil
	}
	seqs, err := m.grant(ctx, sts)
	return seqs, nil, err
}

// aheadOf drops from key i's tickets ahead those st shows gone or dead
// (st is trusted only for tickets no newer than itself) and returns how
// many are left; a key that has stood free for queueGrace with tickets
// ahead, none of them touched meanwhile, counts none (their waiters are
// gone, see ticket.go).
func (m *multiHold) aheadOf(i int, st *State) int {
	if !st.partial {
		m.ahead[i] = slices.DeleteFunc(m.ahead[i], func(t *Entry) bool {
			if st.Index < t.CreateIndex {
				return false
			}
			e := st.entry(t.Key)
			return e == nil || e.CreateIndex != t.CreateIndex || !ticketLive(st.Key, e)
		})
	}
	if len(m.ahead[i]) == 0 || len(st.Holders) > 0 {
		m.freeSince[i] = time.Time{}
		return len(m.ahead[i])
	}
	if mark := touchMark(st, m.ahead[i]); m.freeSince[i].IsZero() || mark > m.aheadMark[i] {
		// Newly free, or a ticket ahead was touched since: its waiter
		// lives (see touch), and the grace starts again.
		m.freeSince[i], m.aheadMark[i] = time.Now(), mark
	}
	if time.Since(m.freeSince[i]) >= queueGrace {
		return 0
	}
	return len(m.ahead[i])
}

// graceLeft is how long until a key free with tickets ahead may be taken
// all the same (see aheadOf).
func (m *multiHold) graceLeft() (time.Duration, bool) {
	var left time.Duration
	ok := false
	for _, since := range m.freeSince {
		if since.IsZero() {
			continue
		}
		d := max(queueGrace-time.Since(since), time.Millisecond)
		if !ok || d < left {
			left, ok = d, true
		}
	}
	return left, ok
}

// touchLeft is how long until the request must touch its tickets again
// (see touch), when it waits with a key free.
func (m *multiHold) touchLeft() (time.Duration, bool) {
	if !slices.Contains(m.free, true) {
		return 0, false
	}
	return max(time.Until(m.touched.Add(queueTouch())), time.Millisecond), true
}

// touch shows waiters behind the request that it is alive, when it waits
// with keys free (the last attempt's free, where it has tickets) and
// queueTouch has passed since the last touch: one transaction rewrites
// its tickets on those keys by check-and-set on their
// ModifyIndex (their CreateIndex, the request's place, stays), so that
// their ModifyIndex moves and each waiter behind restarts its grace
// (aheadOf, waiter.turn). A broker-owned session's record conditions it,
// as every write for the session. Best effort: a failure reports whether
// a ticket or the record moved (the caller reads again); the next
// touch, or the grace of the waiters behind, follows as before.
func (m *multiHold) touch(ctx context.Context, sts []*State) bool {
	h := m.h
	if time.Since(m.touched) < queueTouch() || !slices.Contains(m.free, true) {
		return false
	}
	var ops []Op
	if rec := h.record(); h.owned && rec.index != 0 {
		ops = append(ops, rec.guard())
	}
	first := len(ops)
	var touched []int
	for i, key := range m.keys {
		if !m.free[i] {
			continue
		}
		tk := ticketKey(key, h.session)
		mod := m.ticketMod[i]
		if e := sts[i].entry(tk); e != nil && e.CreateIndex == m.tickets[i] && e.ModifyIndex > mod {
			mod = e.ModifyIndex
		}
		if mod == 0 {
			continue
		}
		touched = append(touched, i)
		ops = append(ops, Op{Verb: OpCAS, Key: tk, Index: mod, Flags: QueueFlagValue, Value: ticketValue(h.b.id, mod)})
	}
	if len(touched) == 0 {
		return false
	}
	m.touched = time.Now()
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		return asTxnError(err) != nil
	}
	for j, i := range touched {
		if e := res[first+j]; e != nil {
			m.ticketMod[i] = e.ModifyIndex
		}
	}
	return false
}

// grant takes every key in one transaction: a lock op per key, and per
// key the queue's check (a newcomer: no guard, or the removal of a guard
// that no live ticket needs; both prove that nobody queued since st).
// The session's record goes with it when it fits, else in a transaction
// of its own right after; so do the request's tickets.
func (m *multiHold) grant(ctx context.Context, sts []*State) ([]Sequencer, error) {
	h := m.h
	var must, later []Op
	lockOp := make([]int, len(m.keys)) // each key's lock op in must
	for i, key := range m.keys {
		st := sts[i]
		if st.partial && len(m.keys) <= maxLazyKeys {
			// Not a listing (this replica's own release, or nothing
			// known: absent): the transaction checks it, as a single
			// hold's grant does (tryLock), and that no semaphore took
			// the key as its prefix meanwhile.
			if st.lock == nil {
				must = append(must, Op{Verb: OpCheckNotExists, Key: key})
			} else {
				must = append(must, Op{Verb: OpCheckIndex, Key: key, Index: st.lock.ModifyIndex})
			}
			must = append(must, Op{Verb: OpCheckNotExists, Key: key + semLockSuffix})
		}
		lockOp[i] = len(must)
		must = append(must, Op{Verb: OpLock, Key: key, Value: h.spec.Value, Flags: LockFlagValue, Session: h.session})
		if m.tickets[i] == 0 {
			if st.guard == nil {
				must = append(must, Op{Verb: OpCheckNotExists, Key: key + queueSuffix})
			} else {
				must = append(must, Op{Verb: OpDeleteCAS, Key: st.guard.Key, Index: st.guard.ModifyIndex})
			}
			continue
		}
		later = append(later, Op{Verb: OpDelete, Key: ticketKey(key, h.session)})
		if st.guard != nil && !st.partial && st.Index >= m.tickets[i] && !st.othersQueued(h.session) {
			later = append(later, Op{Verb: OpDeleteCAS, Key: st.guard.Key, Index: st.guard.ModifyIndex})
		}
	}
	for _, st := range sts {
		// Tickets of waiters whose session ended (their replica died):
		// after the grant, best effort, as a single key's grant does.
		later = append(later, deadTicketOps(st, h.session)...)
	}
	rec := h.record()
	next := rec.next()
	for _, k := range m.keys {
		next.Holds[k] = 0
		next.Since[k] = time.Now().UnixMilli()
	}
	next.Keys, next.Waiting = m.keys, ""
	recOps := rec.writeOps(next)
	ops := must
	recInline := len(recOps)+len(must) <= MaxTxnOps
	recAt := -1
	if recInline {
		recAt = 0
		ops = append(slices.Clone(recOps), must...)
		for len(later) > 0 && len(ops) < MaxTxnOps {
			ops = append(ops, later[0])
			later = later[1:]
		}
	}
	lockAt := 0 // where must begins in ops
	if recInline {
		lockAt = len(recOps)
	}
	if mutantMultiPartial {
		mutantOneByOne(ctx, h.st, must)
	}
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		h.unsure = h.unsure || ctx.Err() != nil
		return nil, h.txnFailure(ctx, err, recAt)
	}
	seqs := make([]Sequencer, len(m.keys))
	for i, key := range m.keys {
		e := res[lockAt+lockOp[i]]
		seqs[i] = Sequencer{Key: key, Session: h.session, LockIndex: e.LockIndex, Token: e.ModifyIndex, Kind: KindLock}
	}
	for i := range m.tickets {
		m.tickets[i], m.ticketMod[i] = 0, 0
	}
	if recInline {
		next.index, next.live = recordWritten(ops, res, h.session), true
		h.setRecord(next)
	} else {
		// 64 keys: 128 ops, and no room for the record. Its tokens are
		// the grant's, written out (a pending 0 would be this write's).
		for i, k := range m.keys {
			next.Holds[k] = seqs[i].Token
		}
		res, err := h.st.Txn(ctx, recOps)
		if err != nil {
			return seqs, err // the caller unlocks them (abandon)
		}
		next.index, next.live = recordWritten(recOps, res, h.session), true
		h.setRecord(next)
	}
	if len(later) > 0 {
		_, _ = h.st.Txn(ctx, later) // best effort: the tickets die with the session anyway
	}
	return seqs, nil
}

// enqueue takes the request's ticket in every key's queue in one
// transaction (see the top of this file). It returns errRace when a
// guard moved under it.
func (m *multiHold) enqueue(ctx context.Context, sts []*State) error {
	h := m.h
	var ops []Op
	for i, key := range m.keys {
		st := sts[i]
		guard := Op{Verb: OpCAS, Key: key + queueSuffix, Flags: QueueFlagValue, Value: []byte("0")}
		if st.guard != nil {
			guard.Index = st.guard.ModifyIndex
			guard.Value = strconv.AppendUint(nil, st.guard.ModifyIndex, 10)
		}
		ops = append(ops, Op{Verb: OpLock, Key: ticketKey(key, h.session), Value: []byte(h.b.id), Flags: QueueFlagValue, Session: h.session}, guard)
	}
	// The session's record goes with it when it fits (up to 63 keys),
	// naming the keys the request waits for: what ListHolds on any
	// replica lists it with.
	recAt := -1
	var next *record
	rec := h.record()
	next = rec.next()
	next.Waiting, next.Keys = m.keys[0], m.keys
	if recOps := rec.writeOps(next); len(ops)+len(recOps) <= MaxTxnOps {
		recAt = len(ops)
		ops = append(ops, recOps...)
	} else {
		next = nil
	}
	m.ticketTried = true
	h.enqueued = true
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		h.noteUnanswered(err, recAt)
		return h.txnFailure(ctx, err, recAt)
	}
	if next != nil {
		next.index, next.live = recordWritten(ops, res, h.session), true
		h.setRecord(next)
	}
	for i, key := range m.keys {
		t := res[2*i]
		m.tickets[i], m.ticketMod[i] = t.CreateIndex, t.ModifyIndex
		m.ahead[i] = nil
		for _, o := range sts[i].tickets {
			if o.CreateIndex < t.CreateIndex && o.Session != h.session && ticketLive(key, o) {
				m.ahead[i] = append(m.ahead[i], o)
			}
		}
	}
	return nil
}

// abandon cleans up after a request that never got its grant (or whose
// grant could not be announced: held unlocks those keys): its tickets and
// its session, which the broker made for it.
func (m *multiHold) abandon(held bool) {
	h := m.h
	if !h.owned {
		return
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	if held {
		m.finish(false)
		return
	}
	if h.pooled != nil && !m.ticketTried && !h.unsure && !h.b.abandoning() {
		// Nothing was written with it (a try-once that found a key busy,
		// say): back to the pool.
		if h.ren != nil {
			h.pooled.renewed = h.ren.lastRenewal()
		}
		h.pooled.pool.put(h.pooled)
		return
	}
	if m.ticketTried && h.movable && h.movedAway(ctx) {
		return // the wait goes on elsewhere, in its places
	}
	if !h.dropRecord(ctx) {
		return // resumed elsewhere (or Consul would not say): not ours to end
	}
	if m.ticketTried {
		var ops []Op
		for _, k := range m.keys {
			ops = append(ops, Op{Verb: OpDelete, Key: ticketKey(k, h.session)})
		}
		_, _ = h.st.Txn(ctx, ops)
	}
	h.destroy(ctx)
	h.dropLateRecord(ctx)
	m.tidy()
}

// tidy tidies the queues of keys that the request queued in, in the
// background (see tidyAfter).
func (m *multiHold) tidy() {
	keys := m.untidy()
	if len(keys) == 0 {
		return
	}
	b, store := m.h.b, m.h.st
	b.holds.Add(1)
	go func() {
		defer b.holds.Done()
		for _, k := range keys {
			b.tidyQueue(store, k)
		}
	}()
}

// untidy are the keys whose queue the request tidies as it ends: those
// of which it is this replica's last lock hold, when one of them used the
// key's queue or the key's view shows what a tidy removes (see lastOut
// and tidyAfter); every key when it queued and did not subscribe to all.
func (m *multiHold) untidy() []string {
	if len(m.subs) != len(m.keys) {
		if m.h.enqueued {
			return m.keys
		}
		return nil
	}
	var keys []string
	for i, s := range m.subs {
		if s.lastOut(m.h.enqueued || m.h.resumedWait) {
			keys = append(keys, m.keys[i])
		}
	}
	return keys
}

// getMulti takes a ready session for keys from the pool, or nil: one
// renewed recently enough to hand over (see get), marked as having held
// every key.
func (p *sessionPool) getMulti(keys []string) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.asked = time.Now()
	defer p.signal()
	limit := time.Now().Add(-DefaultTTL / 2)
	for i := len(p.idle) - 1; i >= 0; i-- {
		s := p.idle[i]
		if s.renewed.Before(limit) {
			continue
		}
		p.idle = append(p.idle[:i], p.idle[i+1:]...)
		for _, k := range keys {
			s.used[k] = true
		}
		s.uses++
		return s
	}
	return nil
}

// recycle gives a pooled session back after a clean end, as a hold of
// one key does (finish.go): every key unlocked (unless a Release did it)
// and dropped from the record in one transaction conditioned on it. Only
// a session that never queued: a ticket the grant could not delete would
// stay live with it.
func (m *multiHold) recycle(released bool) bool {
	h := m.h
	if h.pooled == nil || h.b.abandoning() || m.ticketTried {
		return false
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	rec := h.record()
	if rec.Owner != h.owner || rec.index == 0 {
		return false
	}
	next := rec.next()
	for _, k := range m.keys {
		delete(next.Holds, k)
		delete(next.Since, k)
		delete(next.Again, k)
	}
	next.Keys, next.Waiting = nil, ""
	if _, listed := rec.Holds[m.keys[0]]; released && !listed && len(rec.Keys) == 0 {
		next = rec // the releasing transaction dropped the keys
	} else {
		var held []int
		if !released {
			held = m.watchHeld()
			if len(held) < len(m.keys) {
				return false // a key is lost: finish
			}
		}
		ops, _ := m.unlockAll(rec, next, held, false)
		if h.del {
			return false
		}
		res, err := h.st.Txn(ctx, ops)
		if err != nil {
			return false
		}
		h.b.noteUnlocks(ops, res)
		next.index, next.live = recordWritten(ops, res, h.session), true
	}
	h.pooled.rec = next
	if h.ren != nil {
		h.pooled.renewed = h.ren.lastRenewal()
	}
	h.pooled.pool.put(h.pooled)
	return true
}

// noteUnlocks tells the hub of every key a committed transaction (ops,
// res) unlocked, as noteRelease does for one key: the keys' watches
// publish it at once, and the next grant on this replica starts from it.
func (b *Broker) noteUnlocks(ops []Op, res []*Entry) {
	for i, op := range ops {
		if op.Verb == OpUnlock && i < len(res) {
			b.hub.released(res[i])
		}
	}
}

// registerMulti makes the hold releasable through any of its keys.
func (b *Broker) registerMulti(m *multiHold) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.multi == nil {
		b.multi = make(map[string]*multiHold)
	}
	for _, k := range m.keys {
		b.multi[localKey(k, m.h.session)] = m
	}
}

func (b *Broker) unregisterMulti(m *multiHold) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range m.keys {
		if b.multi[localKey(k, m.h.session)] == m {
			delete(b.multi, localKey(k, m.h.session))
		}
	}
}

func (b *Broker) lookupMulti(key, session string) *multiHold {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.multi[localKey(key, session)]
}
