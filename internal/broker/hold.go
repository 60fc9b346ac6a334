package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// hold is one Acquire from request to end. Its outcome is decided by its
// Lifecycle; everything else here carries out that decision.
type hold struct {
	b      *Broker
	st     Store // the tenant's store (see WithTenantStore)
	tenant string
	since  time.Time // when the request came
	spec   AcquireSpec
	send   func(Event) error
	life   *Lifecycle

	session string
	owned   bool // the broker renews and destroys the session
	del     bool // the session has DELETE behavior
	ttl     time.Duration
	start   time.Time // when the session was created or last renewed
	sem     bool
	limit   uint32

	sub    *sub
	ren    *renewer
	pooled *pooled   // the pool's session this hold uses, if any
	again  bool      // the pooled session held the key before (record.Again)
	unsure bool      // a grant transaction was cut off in flight (see settle)
	ahead  *heldRead // a resume's reads, made with or before its renewal (openResumed)
	guard  *guard    // the session record's index, checked by the sweeper
	// recUnknown: a transaction that wrote the session's record (a wait's
	// ticket or contender entry) got no answer, so it may have committed:
	// abandon deletes the record, as one it wrote (dropRecord).
	recUnknown bool
	// ticket is the hold's ticket in its lock key's shared queue, once
	// taken (ticket.go); ticketTried, once a transaction that takes one
	// was sent (it may have been committed unanswered).
	ticket      *Entry
	ticketTried bool
	enqueued    bool // the hold took a ticket once (tidyAfter)
	// handedOff: the hold's release handed the key to a waiter (see
	// close and tidyAfter).
	handedOff atomic.Bool
	// resumedWait: the request resumed a wait, and this replica owns its
	// session now (resumeWait).
	resumedWait bool
	// movable: the wait ended because this replica cut off or shut down,
	// and its client may resume it elsewhere (abandon waits for that).
	movable bool
	// abandonLater: abandon runs in the background after begin returned
	// (and close ran); it tidies the key's queue then (tidyAfter).
	abandonLater bool
	// chainStart is when the key last stood free before this grant: a
	// grant handed over directly inherits its releaser's (handoffChain).
	chainStart time.Time
	// handedOver is the hand-off slot whose releaser waits until begin
	// has announced the grant it delivered (see handOff).
	handedOver *handoffSlot
	// owner is the record owner this hold writes: the replica's id, or
	// for a resumed hold the id and a suffix of its own, so that a hold
	// resumed on the same replica fences the copy it replaced.
	owner string

	mu  sync.Mutex
	rec *record   // the session's record as last written or read
	seq Sequencer // the grant, once held
	// granted is when this replica learned of the grant (see newest).
	granted time.Time
	// promised is the latest deadline sent to the client (see promise).
	promised time.Time
	// value is the holder's value as last seen in Consul (SetValue may
	// change it); an unlock writes it back unchanged.
	value []byte
	// early is a read-write grant made with the contender's entry, not
	// yet returned; rwBase the key's state after the hold's grant, which
	// its release is built on; rwQuietK: K in the state that release was
	// built on, when it showed no other contender (rwlock.go).
	early    *Sequencer
	rwBase   *State
	rwQuietK *Entry
}

// Acquire runs one hold: it waits for the key, reports the grant, keeps the
// session alive and watches for loss until ctx ends, the hold is released,
// or it is lost. Events go to send; an error from send ends the hold. It
// returns nil after `lost` or `released`, ctx's error when the caller went
// away, and a domain error when the key could not be held. Acquire keeps
// a copy of spec, not spec.
//
// A held hold's goroutine stays parked in keep for the hold's life, under
// Acquire, the server's handler and gRPC's frames. Those frames are kept
// small, so that a parked hold uses under a quarter of a 16 KiB stack
// (3,296 bytes, with the runtime's guard of 800): then a GC gives half of
// it back, which is 8 KiB per hold (80 MiB at 10,000 holds). Work that
// goes deeper (the Consul calls, sending) runs in calls that return:
// begin, and the methods keep calls.
func (b *Broker) Acquire(ctx context.Context, spec *AcquireSpec, send func(Event) error) error {
	if len(spec.Keys) > 0 {
		return b.acquireMulti(ctx, spec, send)
	}
	h, err := b.begin(ctx, spec, send)
	if err != nil {
		return err
	}
	defer h.close()
	return h.keep(ctx)
}

// begin runs a hold up to its grant, announced, and returns it to keep;
// or, having cleaned up, the error that ended it.
func (b *Broker) begin(ctx context.Context, spec *AcquireSpec, send func(Event) error) (*hold, error) {
	if !b.enter() {
		return nil, newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; retry on another replica")
	}
	h := b.newHold(ctx, *spec, send)
	begun := false
	defer func() {
		// After the `acquired` below: a releaser that handed h the
		// lock waits for it (see handOff).
		h.announced()
		if !begun { // also when a step panicked
			h.close()
		}
	}()
	if err := h.openSession(ctx); err != nil {
		return nil, err
	}
	b.setWaiting(h, true)
	h.sub = b.hub.subscribeLazy(spec.Key)
	h.sub.kw.mu.Lock()
	h.sub.holder, h.sub.queuer = h, !h.sem
	h.sub.kw.mu.Unlock()

	if h.owned {
		h.ren = newRenewer(h.st, h.session, h.ttl, h.start, b.renewals)
		h.ren.start()
	}

	seq, resumed, err := h.obtain(ctx)
	b.setWaiting(h, false)
	if err == nil && !h.life.Grant() {
		err = ctx.Err()
	}
	if err != nil {
		h.life.End(Outcome{Kind: OutcomeFailed})
		r, _ := ReasonOf(err)
		h.movable = r == ReasonReplicaCutOff || r == ReasonBrokerShuttingDown
		if r == ReasonConsulUnavailable || h.movable {
			// Consul does not answer here: the client learns it now and
			// may go to another replica; the cleanup follows (as after a
			// renewal failure, see keep.go), bounded by cleanupContext.
			// It tidies the key's queue itself, after the session's end
			// (close leaves that to it).
			h.abandonLater = true
			b.holds.Add(1)
			go func() { defer b.holds.Done(); h.abandon() }()
			return nil, err
		}
		h.abandon()
		return nil, err
	}
	h.setGrant(seq)
	if h.chainStart.IsZero() {
		h.chainStart = time.Now()
	}
	b.register(h)
	if h.owned {
		h.guard = b.hub.addGuard(recordKey(h.session), h.record().index)
	} else {
		h.guard = &guard{} // never fires
	}
	testHookGranted(spec.Key)
	// A grant that comes when its session's safe deadline has passed (the
	// renewals failed meanwhile, or this process was stopped between the
	// transaction and this line) is not announced: Consul may have ended
	// the session and granted the key to someone else already, and an
	// `acquired` promising nothing would still say "held" for an instant.
	if g := h.guaranteed(); h.ren != nil && g <= 0 {
		h.life.End(lost(LostRenewalFailed, "the grant came after the session's safe deadline (no renewal succeeded in time), so it was never held safely"))
	} else if err := send(Event{Kind: EventAcquired, Sequencer: *seq, GuaranteedFor: g, Resumed: resumed}); err != nil && !disconnected(ctx) {
		h.life.End(Outcome{Kind: OutcomeCanceled})
	}
	begun = true
	return h, nil
}

// close gives back what the hold took from the broker, the newest first;
// it runs once, when the hold ends or could not begin.
func (h *hold) close() {
	if h.guard != nil {
		h.b.hub.removeGuard(h.guard)
	}
	h.b.unregister(h)
	if h.ren != nil {
		h.ren.stop()
	}
	if h.sub != nil {
		if !h.abandonLater {
			h.tidyAfter()
		}
		if !h.sem && !h.handedOff.Load() && h.sub.othersWaiting() {
			// A waiter next behind this hold may sleep with no watch
			// (needsWatch): the key changed without a hand-off, and only
			// Consul can tell it how.
			h.sub.activate()
		}
		h.sub.close()
	}
	h.b.holds.Done()
}

// testHookGranted runs after a grant and before it is announced
// (grant_test.go stops Consul there until the grant is past its safe
// deadline).
var testHookGranted = func(key string) {}

func (b *Broker) newHold(ctx context.Context, spec AcquireSpec, send func(Event) error) *hold {
	sem := spec.Semaphore || spec.Limit > 1 || spec.Mode != ModeNone // a read-write lock runs the semaphore's path
	tenant := TenantFrom(ctx)
	return &hold{b: b, st: b.storeFor(tenant), tenant: tenant, since: time.Now(), spec: spec, send: send,
		life: NewLifecycle(), sem: sem, limit: max(spec.Limit, 1), value: spec.Value, owner: b.id}
}

// setWaiting adds h to (or removes it from) the waiters ListHolds shows.
func (b *Broker) setWaiting(h *hold, waiting bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if waiting {
		b.waiting[h] = struct{}{}
	} else {
		delete(b.waiting, h)
	}
}

// setGrant records the grant and asks to be woken by the first listing
// that includes it.
func (h *hold) setGrant(seq *Sequencer) {
	h.mu.Lock()
	h.seq, h.granted = *seq, time.Now()
	h.mu.Unlock()
	h.sub.want(seq.Token)
	h.sub.refresh()
	if h.sem {
		h.sub.checkYoung(contenderKey(seq.Key, seq.Session), seq.Session)
	} else {
		h.sub.checkYoung(seq.Key, seq.Session)
	}
}

// grantSeen is when this replica learned of the grant.
func (h *hold) grantSeen() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.granted
}

func (h *hold) grant() Sequencer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// openSession creates, checks or (for a resume) renews the hold's session.
// A new session is created on a context of its own: a stream cancelled
// while Consul creates it must not leave it behind.
func (h *hold) openSession(ctx context.Context) error {
	s := h.spec
	switch {
	case s.Resume != nil:
		return h.openResumed(ctx)
	case s.SessionID != "":
		return h.openClientSession(ctx)
	}
	if s.NewSession == nil && h.b.pools != nil {
		if p := h.b.pools.forTenant(h.tenant); p != nil {
			return h.openPooled(ctx, p)
		}
	}
	return h.createSession(ctx)
}

// createSession creates a new broker-owned session with the request's
// options (the defaults where unset), on a context of its own, and starts
// its record; a stream cancelled meanwhile destroys it again.
func (h *hold) createSession(ctx context.Context) error {
	spec := withDefaults(h.spec.NewSession)
	if err := validateSpec(spec); err != nil {
		return err
	}
	cctx, cancel := cleanupContext()
	defer cancel()
	h.start = time.Now()
	id, err := h.st.CreateSession(cctx, spec)
	if err != nil {
		return err
	}
	h.session, h.owned, h.ttl, h.del = id, true, spec.TTL, spec.Delete
	h.rec = newRecord(id, h.b.id)
	h.rec.Delete, h.rec.Tenant = spec.Delete, h.tenant
	if ctx.Err() != nil {
		h.destroy(cctx)
		return ctx.Err()
	}
	return nil
}

// openClientSession checks a client-owned session and reads its record,
// both at once.
func (h *hold) openClientSession(ctx context.Context) error {
	id := h.spec.SessionID
	readRec := async(func() (*record, error) { return h.b.readRecord(ctx, id) })
	info, err := h.st.Session(ctx, id)
	rec, recErr := readRec()
	if err != nil {
		return sessionError(err, id)
	}
	if recErr != nil {
		return recErr
	}
	if err := allowed(ctx, rec, h.tenant); err != nil {
		return err
	}
	h.session, h.ttl, h.del = info.ID, info.TTL, info.Delete
	h.rec = rec
	return nil
}

// openPooled takes a ready session from the pool, or (the pool empty: more
// holds at once than it keeps ready) makes one that joins the pool when
// the hold ends cleanly.
func (h *hold) openPooled(ctx context.Context, pool *sessionPool) error {
	p, again := pool.get(h.spec.Key)
	if p == nil {
		cctx, cancel := cleanupContext()
		defer cancel()
		var err error
		if p, err = pool.create(cctx); err != nil {
			return err
		}
		p.used[h.spec.Key], p.uses = true, 1
		if ctx.Err() != nil {
			_ = h.st.DestroySession(cctx, p.id)
			return ctx.Err()
		}
	}
	h.session, h.owned, h.ttl, h.start = p.id, true, DefaultTTL, p.renewed
	h.rec, h.pooled, h.again = p.rec, p, again
	return nil
}

// guaranteed is how long the hold is promised safe from now (0 when
// unknown); see promise.
func (h *hold) guaranteed() time.Duration {
	if h.ren == nil {
		return 0
	}
	return h.promise(h.ren.safeUntil())
}

// obtain waits for the grant (or re-attaches a resumed one).
func (h *hold) obtain(ctx context.Context) (*Sequencer, bool, error) {
	if h.resumingWait() {
		if err := h.resumeWait(ctx); err != nil {
			return nil, false, err
		}
	} else if h.spec.Resume != nil {
		seq, err := h.resume(ctx)
		return seq, true, err
	}
	seq, err := h.wait(ctx)
	return seq, false, err
}

func (h *hold) tryOnce() bool { return !h.spec.WaitForever && h.spec.Wait == 0 }

// record returns the hold's record as last known.
func (h *hold) record() *record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
}

func (h *hold) setRecord(r *record) {
	h.mu.Lock()
	h.rec = r
	h.mu.Unlock()
	if h.guard != nil {
		h.guard.index.Store(r.index)
	}
}

// cleanupContext is for work that must finish after the caller's context
// ended (releasing a hold whose stream was cancelled).
func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}
