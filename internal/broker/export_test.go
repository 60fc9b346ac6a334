package broker

import "time"

// Probes for hub_test.go (package broker_test, which runs the hub on the
// real consulstore and a real Consul agent).

// SetParkedHook sets the hook a parked watch loop runs before it returns;
// the returned func restores the previous one.
func SetParkedHook(f func(key string)) (restore func()) {
	old := testHookParked
	testHookParked = f
	return func() { testHookParked = old }
}

// SetGrantedHook sets the hook a hold runs between its grant and the
// `acquired` it sends; the returned func restores the previous one.
func SetGrantedHook(f func(key string)) (restore func()) {
	old := testHookGranted
	testHookGranted = f
	return func() { testHookGranted = old }
}

// SetLeavingHook sets the hook a waiter runs as it leaves the key's queue
// of waiters (granted or not), before the others are woken; the returned
// func restores the previous one.
func SetLeavingHook(f func(key string, granted bool)) (restore func()) {
	old := testHookLeaving
	testHookLeaving = f
	return func() { testHookLeaving = old }
}

// SetAnnounceWait sets how long a releaser that handed a lock over waits
// for the new holder's `acquired`; the returned func restores it.
func SetAnnounceWait(d time.Duration) (restore func()) {
	old := announceWait
	announceWait = d
	return func() { announceWait = old }
}

// WatchMode says how key is watched: "" when it has no watch, else
// swept, pending, dedicated, or "dedicated, no query" (a broken watch).
func (b *Broker) WatchMode(key string) string {
	h := b.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	kw := h.watches[key]
	if kw == nil {
		return ""
	}
	return h.modeLocked(kw)
}

// SubscribeLazy subscribes to key as a hold does. wake signals each
// change; index returns the newest listing's index.
func (b *Broker) SubscribeLazy(key string) (wake <-chan struct{}, index func() uint64, close func()) {
	s := b.hub.subscribeLazy(key)
	return s.wake, func() uint64 { _, i, _, _ := s.listing(); return i }, s.close
}

// StartWatch starts key's watch if it is pending, as a waiter's
// activation or a parked watch's timer does.
func (b *Broker) StartWatch(key string) {
	h := b.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if kw := h.watches[key]; kw != nil {
		h.startLocked(kw)
	}
}

// Renewer is a session's renewer, for session_test.go.
type Renewer struct{ r *renewer }

// NewRenewer returns a renewer of session id (created at start).
func NewRenewer(st Store, id string, ttl time.Duration, start time.Time) Renewer {
	return Renewer{newRenewer(st, id, ttl, start, nil)}
}

func (r Renewer) Start()                    { r.r.start() }
func (r Renewer) Stop()                     { r.r.stop() }
func (r Renewer) Renewed() <-chan time.Time { return r.r.renewed }
func (r Renewer) Failed() <-chan error      { return r.r.failed }

// Probes for record_test.go.

// RecordKey is the key of session's record.
func RecordKey(session string) string { return recordKey(session) }

// RecordWriteOps are the ops a grant or release writes session's record
// with, on the record as e shows it (nil: none yet).
func RecordWriteOps(session string, e *Entry) []Op {
	r := decodeRecord(session, e)
	return r.writeOps(r.next())
}

// RecordWritten is recordWritten.
func RecordWritten(ops []Op, res []*Entry, session string) uint64 {
	return recordWritten(ops, res, session)
}

// FindEntry is key's entry among entries, or nil.
func FindEntry(entries []*Entry, key string) *Entry {
	e, _ := findEntry(entries, key)
	return e
}

// UnlockOps are the ops that unlock key held by session.
func UnlockOps(key, session string) []Op { return unlockOps(key, session, nil, false) }

// SetTenantPoolIdle sets how long a tenant's session pool lives unused,
// for pool_test.go; the returned func restores it.
func SetTenantPoolIdle(d time.Duration) (restore func()) {
	old := tenantPoolIdle
	tenantPoolIdle = d
	return func() { tenantPoolIdle = old }
}

// HasTenantPool reports whether tenant has a session pool now.
func (b *Broker) HasTenantPool(tenant string) bool {
	if b.pools == nil {
		return false
	}
	b.pools.mu.Lock()
	defer b.pools.mu.Unlock()
	return b.pools.m[tenant] != nil
}

// SetHandoffChain sets how long a key passes by direct hand-off before a
// release frees it, and how long this replica's waiters then leave it
// free; the returned func restores both.
func SetHandoffChain(chain, courtesy time.Duration) (restore func()) {
	oldChain, oldCourtesy := handoffChain, handoffCourtesy
	handoffChain, handoffCourtesy = chain, courtesy
	return func() { handoffChain, handoffCourtesy = oldChain, oldCourtesy }
}

// CleanSemaphore is cleanSemaphore (the janitor's cleanup of an ended
// session at key).
func (b *Broker) CleanSemaphore(key, session string) bool {
	ctx, cancel := cleanupContext()
	defer cancel()
	return b.cleanSemaphore(ctx, key, session)
}

// SetDeadHolderFor sets deadHolderFor; the returned func restores it.
func SetDeadHolderFor(d time.Duration) (restore func()) {
	old := deadHolderFor
	deadHolderFor = d
	return func() { deadHolderFor = old }
}

// SetCourtesyHook sets the hook a waiter runs when the courtesy to
// Consul's own clients keeps it from a free key (turn).
func SetCourtesyHook(f func(key string)) (restore func()) {
	old := testHookCourtesy
	testHookCourtesy = f
	return func() { testHookCourtesy = old }
}
