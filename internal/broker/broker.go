// Package broker is lockbroker's domain: holds of locks and semaphore slots
// on Consul, their sessions, loss detection, and shared watches. It talks
// to Consul only through the Store interface.
package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Limits and defaults of the API (documented in the proto).
const (
	DefaultTTL       = 15 * time.Second
	DefaultLockDelay = 15 * time.Second
	MinTTL           = 10 * time.Second
	MaxTTL           = 24 * time.Hour
	MaxLockDelay     = 60 * time.Second
	maxLimit         = 1024
	defaultName      = "lockbroker"
)

// Broker grants and tracks holds. It is safe for concurrent use.
type Broker struct {
	store Store
	log   *zap.Logger
	hub   *hub
	id    string // this replica, as recorded in session records

	// shutdown is closed when the broker starts draining (holds end with
	// LostBrokerShutdown); drained when the drain time is over (holds not
	// resumed elsewhere are then released).
	shutdown  chan struct{}
	drained   chan struct{}
	abandon   bool      // Close: leave sessions to expire, as a crash would
	drainEnd  time.Time // when the drain ends (Shutdown's deadline)
	closeOnce sync.Once
	holds     sync.WaitGroup

	tenantStore func(tenant string) Store

	mu    sync.Mutex
	local map[string]*hold // granted holds, by key + "\x00" + session
	// deadSeen: when the janitor first saw each read-write lock's dead
	// holder, by key + "\x00" + session (deadHolderDue).
	deadSeen map[string]time.Time
	waiting  map[*hold]struct{}    // holds waiting for their grant
	multi    map[string]*multiHold // granted multi-key holds, by each key + "\x00" + session (multikey.go)

	cacheMu sync.Mutex
	grants  map[string]grantInfo // see fillTokens
	recent  recentReleases       // releases this replica made, see Release

	pools        *pools // nil unless WithSessionPool
	promiseBound time.Duration
	renewals     *renewalLog // the holds' renewals that failed and are retried
	reach        *reach      // whether Consul answers (reach.go)
	janitorStop  context.CancelFunc
	janitorDone  chan struct{} // the janitor and the pool stopped
}

type options struct {
	pool          bool
	tenantStore   func(tenant string) Store
	id            string
	maxBlocking   int
	sweepInterval time.Duration
	janitor       time.Duration
	promiseBound  time.Duration
}

// Option configures a Broker.
type Option func(*options)

// WithReplicaID names this replica in session records (default: random).
// Two replicas must never share an id.
func WithReplicaID(id string) Option { return func(o *options) { o.id = id } }

// WithMaxBlocking caps the Consul blocking queries this replica runs at
// once (default DefaultMaxBlocking; at least 1). Keys beyond it are swept.
func WithMaxBlocking(n int) Option { return func(o *options) { o.maxBlocking = max(n, 1) } }

// WithSweepInterval sets how often keys without a blocking query of their
// own are checked (default DefaultSweepInterval): it bounds how late a
// change to such a key is noticed.
func WithSweepInterval(d time.Duration) Option { return func(o *options) { o.sweepInterval = d } }

// WithSessionPool keeps ready sessions with the default options so that an
// Acquire with default options costs one transaction (see pool.go).
// Default off; the broker binary turns it on.
func WithSessionPool() Option { return func(o *options) { o.pool = true } }

// WithPromiseBound caps every guaranteed_for the broker sends (default
// DefaultPromiseBound). A hold whose connection is lost is kept until the
// last deadline it promised, so a vanished client's hold is released
// within the server's keepalive detection plus this bound plus half a
// second: keep the sum within DESIGN.md's 20 s.
func WithPromiseBound(d time.Duration) Option { return func(o *options) { o.promiseBound = d } }

// New returns a Broker on store. log must not be nil.
func New(store Store, log *zap.Logger, opts ...Option) *Broker {
	o := options{maxBlocking: DefaultMaxBlocking, sweepInterval: DefaultSweepInterval, janitor: 15 * time.Second, promiseBound: DefaultPromiseBound}
	for _, opt := range opts {
		opt(&o)
	}
	if o.id == "" {
		o.id = newNonce()
	}
	b := &Broker{
		store:        store,
		log:          log,
		id:           o.id,
		hub:          newHub(store, log, o.maxBlocking, o.sweepInterval),
		shutdown:     make(chan struct{}),
		drained:      make(chan struct{}),
		local:        make(map[string]*hold),
		waiting:      make(map[*hold]struct{}),
		tenantStore:  o.tenantStore,
		grants:       make(map[string]grantInfo),
		recent:       newRecentReleases(),
		promiseBound: max(o.promiseBound, time.Second),
		renewals:     newRenewalLog(log),
		reach:        newReach(),
	}
	jctx, cancel := context.WithCancel(context.Background())
	b.janitorStop, b.janitorDone = cancel, make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { b.janitor(jctx, o.janitor) })
	bg.Go(func() { b.watchReach(jctx) })
	if o.pool {
		b.pools = newPools(jctx, b)
		bg.Go(b.pools.wait)
	}
	go func() { bg.Wait(); close(b.janitorDone) }()
	return b
}

// newNonce is 16 random hex digits.
func newNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ID is this replica's id.
func (b *Broker) ID() string { return b.id }

// enter counts a new request in, unless the broker is shutting down.
func (b *Broker) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.shutdown:
		return false
	default:
	}
	b.holds.Add(1)
	return true
}

// Shutdown drains the broker: every hold is told lost BROKER_SHUTDOWN and
// kept (its session renewed) until ctx ends so its client can resume it on
// another replica; then the holds nobody resumed are released and their
// sessions destroyed (resumed ones are fenced off by their records).
// Waiters end with UNAVAILABLE. It returns when every hold ended, or
// shortly (at most 3 s) after ctx ends if some cleanup is still stuck.
func (b *Broker) Shutdown(ctx context.Context) {
	b.mu.Lock()
	b.drainEnd = time.Now()
	if d, ok := ctx.Deadline(); ok {
		b.drainEnd = d
	}
	select {
	case <-b.shutdown:
	default:
		close(b.shutdown)
	}
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.holds.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	b.closeOnce.Do(func() { close(b.drained) })
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		b.log.Warn("shutdown: some holds did not finish their cleanup in time")
	}
	b.janitorStop()
	<-b.janitorDone
	b.hub.close()
}

// Close stops the broker at once, as a crash would but telling its
// clients: every hold is told lost BROKER_SHUTDOWN and its session left to
// expire, so clients can resume their holds on another replica within the
// TTL; nothing is released. Use Shutdown for a drain.
func (b *Broker) Close() {
	b.mu.Lock()
	b.abandon = true
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.Shutdown(ctx)
}

// drainDeadline is when the drain ends.
func (b *Broker) drainDeadline() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drainEnd
}

func (b *Broker) abandoning() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.abandon
}

func localKey(key, session string) string { return key + "\x00" + session }

func (b *Broker) register(h *hold) {
	b.mu.Lock()
	b.local[localKey(h.spec.Key, h.session)] = h
	b.mu.Unlock()
}

func (b *Broker) unregister(h *hold) {
	b.mu.Lock()
	if b.local[localKey(h.spec.Key, h.session)] == h {
		delete(b.local, localKey(h.spec.Key, h.session))
	}
	b.mu.Unlock()
}

func (b *Broker) lookup(key, session string) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.local[localKey(key, session)]
}

// janitor removes what sessions that ended without the broker cleaning up
// left behind (a replica crashed, a client destroyed its session in Consul
// directly): their records (Consul released them, so they have no session)
// and, for the semaphores a record lists, the session's contender entry;
// for the lock keys a record waits for, what their queues left (tidyQueue).
func (b *Broker) janitor(ctx context.Context, every time.Duration) {
	for sleep(ctx, every) {
		entries, _, err := b.store.List(ctx, recordPrefix, false)
		if err != nil {
			continue
		}
		var dead []Op
		var waited []string
		for _, e := range entries {
			if e.Session != "" {
				continue
			}
			rec := decodeRecord(e.Key[len(recordPrefix):], e)
			if !b.cleanSemaphores(ctx, rec) {
				continue // a dead holder's entry in its lock-delay: later
			}
			dead = append(dead, rec.deleteOps()...)
			waited = append(waited, rec.waited()...)
		}
		b.deleteRecords(ctx, b.store, dead)
		// A waiter whose replica died with it leaves its ticket, dead
		// now: nobody else may come to the key to remove it.
		for _, k := range waited {
			b.tidyQueue(b.store, k)
		}
	}
}

// dropDead removes the record of session if its end left it behind (it
// has no session), and the semaphore slots the record lists: the
// janitor's work, done at once.
func (b *Broker) dropDead(ctx context.Context, st Store, session string) {
	rec, err := b.readRecord(ctx, session)
	if err != nil || rec.index == 0 || rec.live {
		return
	}
	if !b.cleanSemaphores(ctx, rec) {
		return // the janitor's, later
	}
	_, _ = st.Txn(ctx, rec.deleteOps())
}

// cleanSemaphores removes an ended session from every semaphore its
// record lists. It reports false when a read-write lock keeps it as a
// dead holder for now (see cleanSemaphore): the record stays, for the
// janitor's next round.
func (b *Broker) cleanSemaphores(ctx context.Context, rec *record) bool {
	done := true
	for key := range rec.Holds {
		done = b.cleanSemaphore(ctx, key, rec.session) && done
	}
	return done
}

// deadHolderFor is how long a dead holder's entry of a read-write lock
// stays after the janitor first sees it when no grant deletes it: longer
// than any lock-delay (Consul's and the broker's bound), so that deleting
// it then, without a lock of it, lifts no protection.
var deadHolderFor = MaxLockDelay + time.Second

// deadHolderDue says whether the dead holder session of the read-write
// lock at key may be deleted plainly now (see deadHolderFor); forget
// drops what is known of it.
func (b *Broker) deadHolderDue(key, session string, forget bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := localKey(key, session)
	if forget {
		delete(b.deadSeen, k)
		return false
	}
	if b.deadSeen == nil {
		b.deadSeen = map[string]time.Time{}
	}
	at, ok := b.deadSeen[k]
	if !ok {
		b.deadSeen[k] = time.Now()
		return false
	}
	return time.Since(at) >= deadHolderFor
}

// deleteRecords runs the deletions of dead records, many per transaction
// (a retired pool session leaves its record to this); a batch that fails
// (a record moved) is retried one by one.
func (b *Broker) deleteRecords(ctx context.Context, st Store, ops []Op) {
	const batch = 64
	for len(ops) > 0 && ctx.Err() == nil {
		n := min(len(ops), batch)
		if _, err := st.Txn(ctx, ops[:n]); err != nil && n > 1 {
			for _, op := range ops[:n] {
				_, _ = st.Txn(ctx, []Op{op})
			}
		}
		ops = ops[n:]
	}
}

// cleanSemaphore removes an ended session from the semaphore at key (its
// slot and contender entry), if key is a semaphore. A read-write lock's
// dead holder (rwDeadHolder) is left to the next grant, which deletes its
// entry under its lock-delay; only when none has come for deadHolderFor
// is its entry deleted here. It reports false while it is left.
func (b *Broker) cleanSemaphore(ctx context.Context, key, session string) bool {
	for attempt := range 5 {
		st, err := b.readState(ctx, key)
		if err != nil || (st.Kind != KindSemaphore && st.Kind != KindRWLock) {
			b.deadHolderDue(key, session, true)
			return true
		}
		var ops []Op
		if st.Kind == KindRWLock && st.rwDeadListed(session) {
			if !b.deadHolderDue(key, session, false) {
				return false
			}
			c := st.child(session)
			ops = []Op{{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex}}
		} else if ops, _, err = leaveOps(st, session); err != nil || len(ops) == 0 {
			b.deadHolderDue(key, session, true)
			return true
		}
		if _, err := b.store.Txn(ctx, ops); asTxnError(err) == nil {
			b.deadHolderDue(key, session, true)
			return true
		}
		backoff(ctx, attempt)
	}
	return true
}
