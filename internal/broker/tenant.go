package broker

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Tenants. A shared broker serves several tenants: the gRPC layer knows
// the caller's tenant (from its identity) and puts it in the context; the
// broker records it in the records of the sessions the caller makes, and
// treats another tenant's session as one that does not exist. An empty
// tenant is the single-tenant mode: no checks.

type tenantKey struct{}

// ContextWithTenant returns ctx carrying the caller's tenant.
func ContextWithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the caller's tenant ("" in single-tenant mode).
func TenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

type foreignKey struct{}

// ContextWithForeignNotice returns ctx with a flag the broker raises when
// it refuses the call a session because the session is not the caller's
// tenant's (the NOT_FOUND of another tenant's session, or of one made
// outside the broker), and a function that reads the flag: the gRPC layer
// audits those refusals, which the caller cannot tell from a session that
// does not exist.
func ContextWithForeignNotice(ctx context.Context) (context.Context, func() bool) {
	var f atomic.Bool
	return context.WithValue(ctx, foreignKey{}, &f), f.Load
}

// allowed is rec.allows(tenant), raising ctx's foreign-session flag (see
// ContextWithForeignNotice) when it refuses.
func allowed(ctx context.Context, rec *record, tenant string) error {
	err := rec.allows(tenant)
	if err != nil {
		noteForeign(ctx)
	}
	return err
}

// noteForeign raises ctx's foreign-session flag, if it has one.
func noteForeign(ctx context.Context) {
	if f, ok := ctx.Value(foreignKey{}).(*atomic.Bool); ok {
		f.Store(true)
	}
}

// WithTenantStore gives each tenant's holds a store of their own (a
// Consul client with the tenant's ACL token): every Consul call a hold
// makes (its session, grant, release) goes through it, so Consul's ACLs
// bound what a tenant can do. A nil result means the broker's own store.
// It marks a shared broker: with WithSessionPool, each tenant gets a pool
// of its own, and the single-tenant pool is not filled at start.
func WithTenantStore(f func(tenant string) Store) Option {
	return func(o *options) { o.tenantStore = f }
}

// storeFor is the store of tenant's holds.
func (b *Broker) storeFor(tenant string) Store {
	if tenant != "" && b.tenantStore != nil {
		if s := b.tenantStore(tenant); s != nil {
			return s
		}
	}
	return b.store
}

// checkTenant fails with NOT_FOUND unless the caller may use session: in
// single-tenant mode always; otherwise only when the session's record
// names the caller's tenant (a session without a record, made outside
// the broker, belongs to no tenant).
func (b *Broker) checkTenant(ctx context.Context, session string) error {
	tenant := TenantFrom(ctx)
	if tenant == "" {
		return nil
	}
	rec, err := b.readRecord(ctx, session)
	if err != nil {
		return err
	}
	return allowed(ctx, rec, tenant)
}

// allows is checkTenant on a record already read.
func (r *record) allows(tenant string) error {
	if tenant == "" || (r.index != 0 && r.Tenant == tenant) {
		return nil
	}
	return sessionError(ErrSessionNotFound, r.session)
}

// HoldInfo is one hold or waiter, for operators.
type HoldInfo struct {
	Tenant  string
	Key     string
	Session string
	Token   uint64
	Since   time.Time // zero when unknown
	// Replica owns a broker-owned session ("" for a client-owned one).
	Replica string
	Waiting bool
	// Position is a waiter's place in the key's shared queue (1: next),
	// 0 when it has none yet.
	Position int
	// Read: a read-write lock's reader (false: its writer, or not a
	// read-write lock).
	Read bool
	// WithKeys: a multi-key lock's other keys, held or waited for
	// together with Key (nil otherwise).
	WithKeys []string
}

// withKeys is keys without key when keys (a multi-key lock's) has more
// than one, else nil.
func withKeys(keys []string, key string) []string {
	if len(keys) < 2 {
		return nil
	}
	out := make([]string, 0, len(keys)-1)
	for _, k := range keys {
		if k != key {
			out = append(out, k)
		}
	}
	return out
}

// CountClientHolds counts the holds of tenant's client-owned sessions (made
// with TryAcquire, or Acquire with a session id, on any replica; they
// outlive the calls that made them): the keys of the tenant's live
// session records without an owner (all replicas, read consistently).
func (b *Broker) CountClientHolds(ctx context.Context, tenant string) (int, error) {
	entries, _, err := b.store.List(ctx, recordPrefix, true)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		rec := decodeRecord(strings.TrimPrefix(e.Key, recordPrefix), e)
		if rec.live && rec.Tenant == tenant && rec.Owner == "" {
			n += len(rec.Holds)
		}
	}
	return n, nil
}

// maxListedQueues bounds the keys whose queues one ListHolds reads.
const maxListedQueues = 256

// ListHolds lists every hold the broker granted on keys under prefix (""
// for all), from the session records (all replicas, read consistently),
// and this replica's waiters.
func (b *Broker) ListHolds(ctx context.Context, prefix string) ([]HoldInfo, error) {
	entries, _, err := b.store.List(ctx, recordPrefix, true)
	if err != nil {
		return nil, err
	}
	var out []HoldInfo
	queues := map[string]bool{} // keys whose queues to list
	tenants := map[string]string{}
	owners := map[string]string{}  // the replica that owns each session's hold or wait
	multi := map[string][]string{} // a multi-key request's keys, by session
	for _, e := range entries {
		rec := decodeRecord(strings.TrimPrefix(e.Key, recordPrefix), e)
		if !rec.live {
			continue
		}
		tenants[rec.session] = rec.Tenant
		owners[rec.session] = replicaOf(rec.Owner)
		if rec.Waiting != "" && strings.HasPrefix(rec.Waiting, prefix) {
			queues[rec.Waiting] = true
		}
		if len(rec.Keys) > 1 {
			multi[rec.session] = rec.Keys
			for _, k := range rec.Keys {
				if rec.Waiting != "" && strings.HasPrefix(k, prefix) {
					queues[k] = true // a multi-key waiter waits for each
				}
			}
		}
		for key := range rec.Holds {
			if strings.HasPrefix(key, prefix) {
				queues[key] = true
				hi := HoldInfo{Tenant: rec.Tenant, Key: key, Session: rec.session, Token: rec.token(key), Replica: replicaOf(rec.Owner), WithKeys: withKeys(rec.Keys, key)}
				if ms := rec.Since[key]; ms > 0 {
					hi.Since = time.UnixMilli(ms)
				}
				out = append(out, hi)
			}
		}
	}
	b.mu.Lock()
	var local []HoldInfo
	for h := range b.waiting {
		keys := append([]string{h.spec.Key}, h.spec.Keys...) // a multi-key waiter waits for each
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				local = append(local, HoldInfo{Tenant: h.tenant, Key: k, Session: h.session, Since: h.since, Replica: b.id, Waiting: true, WithKeys: withKeys(keys, k)})
				queues[k] = true
			}
		}
	}
	b.mu.Unlock()
	reads := map[string]bool{}
	waiters, err := b.listQueues(ctx, queues, tenants, reads)
	if err != nil {
		return nil, err
	}
	for i, w := range waiters {
		waiters[i].WithKeys = withKeys(multi[w.Session], w.Key)
		if w.Replica == "" {
			// A semaphore's or read-write lock's contender entry does not
			// name the replica; the waiter's record does (broker-owned).
			waiters[i].Replica = owners[w.Session]
		}
	}
	// This replica's waiters: when each request came, and those with no
	// place in the queue yet.
	mine := make(map[string]*HoldInfo, len(local))
	for i := range local {
		mine[local[i].Key+"\x00"+local[i].Session] = &local[i]
	}
	for i, w := range waiters {
		if l := mine[w.Key+"\x00"+w.Session]; l != nil {
			waiters[i].Since = l.Since
			if waiters[i].WithKeys == nil {
				waiters[i].WithKeys = l.WithKeys
			}
			delete(mine, w.Key+"\x00"+w.Session)
		}
	}
	for _, l := range local {
		if mine[l.Key+"\x00"+l.Session] != nil {
			waiters = append(waiters, l)
		}
	}
	out = append(out, waiters...)
	for i := range out {
		out[i].Read = reads[out[i].Key+"\x00"+out[i].Session]
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.Key != b.Key:
			return a.Key < b.Key
		case a.Waiting != b.Waiting:
			return !a.Waiting
		case a.Waiting && a.Position != b.Position:
			return a.Position != 0 && (b.Position == 0 || a.Position < b.Position)
		}
		return a.Session < b.Session
	})
	return out, nil
}

// listQueues lists the waiters of every replica in the shared queues of
// keys (at most maxListedQueues of them, read consistently), in queue
// order: a lock's live tickets, a semaphore's live contenders that hold
// no slot.
func (b *Broker) listQueues(ctx context.Context, keys map[string]bool, tenants map[string]string, reads map[string]bool) ([]HoldInfo, error) {
	var out []HoldInfo
	n := 0
	for key := range keys {
		if n == maxListedQueues {
			break
		}
		n++
		st, err := b.readState(ctx, key)
		if err != nil {
			return nil, err
		}
		rwReads(st, reads)
		if st.Kind == KindSemaphore || st.Kind == KindRWLock {
			var ws []*Entry
			for sid, c := range st.contenders {
				if _, holds := st.holder(sid); !holds {
					ws = append(ws, c)
				}
			}
			sort.Slice(ws, func(i, j int) bool { return ws[i].CreateIndex < ws[j].CreateIndex })
			for i, c := range ws {
				out = append(out, HoldInfo{Tenant: tenants[c.Session], Key: key, Session: c.Session, Waiting: true, Position: i + 1})
			}
			continue
		}
		pos := 0
		for _, t := range st.tickets {
			if ticketLive(key, t) {
				pos++
				out = append(out, HoldInfo{Tenant: tenants[t.Session], Key: key, Session: t.Session, Replica: ticketReplica(t.Value), Waiting: true, Position: pos})
			}
		}
	}
	return out, nil
}

// ForceRelease ends every current hold of key, whoever holds it: the
// holders' streams report `lost` (released by other). It returns how many
// holds it ended.
func (b *Broker) ForceRelease(ctx context.Context, key string) (int, error) {
	for attempt := range maxWriteAttempts {
		if attempt > 0 {
			backoff(ctx, attempt)
		}
		st, err := b.readState(ctx, key)
		if err != nil {
			return 0, err
		}
		if len(st.Holders) == 0 {
			return 0, nil
		}
		ops, err := forceOps(st)
		if err != nil {
			return 0, err
		}
		if _, err := b.store.Txn(ctx, ops); asTxnError(err) != nil {
			continue
		} else if err != nil {
			return 0, err
		}
		return len(st.Holders), nil
	}
	return 0, newError(ErrUnavailable, ReasonConsulUnavailable, "key %q kept changing; retry", key)
}

// forceOps end every hold in st: a lock's holder is unlocked; a
// semaphore's `.lock` loses every holder (one check-and-set) and their
// contender entries are deleted.
func forceOps(st *State) ([]Op, error) {
	if st.Kind == KindRWLock {
		return rwForceOps(st)
	}
	if st.Kind != KindSemaphore {
		var ops []Op
		for _, hd := range st.Holders {
			ops = append(ops, unlockOps(st.Key, hd.Session, hd.Value, false)...)
		}
		return ops, nil
	}
	body := semBody{Limit: st.sem.Limit, Holders: map[string]bool{}}
	for sid := range st.sem.Holders {
		if _, held := st.holder(sid); !held {
			body.Holders[sid] = true // not a live holder: leave it to its owner
		}
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ops := []Op{{Verb: OpCAS, Key: st.Key + semLockSuffix, Value: raw, Flags: SemaphoreFlagValue, Index: st.semLock.ModifyIndex}}
	for _, hd := range st.Holders {
		if c := st.child(hd.Session); c != nil {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
		}
	}
	return ops, nil
}

// replicaOf is the replica part of a record's owner (a resumed hold's
// owner adds a suffix of its own: see resume).
func replicaOf(owner string) string {
	replica, _, _ := strings.Cut(owner, "/")
	return replica
}
