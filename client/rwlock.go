package client

import (
	"context"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// RWMutex is a read-write lock at one key: many readers hold it at once,
// or one writer alone (etcd's recipes.RWMutex, Curator's
// InterProcessReadWriteLock). It holds nothing itself and is safe for
// concurrent use: each RLock or Lock is a request of its own, with a
// session of its own, and returns a *Lease as Client.Lock does (loss
// signal, deadline, resume on another replica, Release).
//
// Waiters are served in arrival order, readers and writers alike: a reader
// that arrives while a writer waits queues behind that writer, so neither
// a stream of readers nor a stream of writers starves the other. Every
// grant, read or write, has a fencing token that strictly increases per
// key; a writer's token is above every token granted before it, so a
// resource that refuses tokens below the highest it has seen refuses a
// reader's or an older writer's stale write. Lease.Sequencer().Read tells
// a read grant from a write one.
//
// The key is the broker's own read-write layout in Consul
// (docs/consul-layout.md): a plain lock, a semaphore or Consul's api.Lock
// on the same key is refused, and so is a read or write request on a
// plain lock or semaphore key: FAILED_PRECONDITION with reason
// LIMIT_CONFLICT, which matches ErrKindConflict (and ErrConflict). There
// is no downgrade: a writer that wants to read releases and asks again.
type RWMutex struct {
	c   *Client
	key string
}

// RWLock returns the read-write lock at key. It makes no call.
func (c *Client) RWLock(key string) *RWMutex { return &RWMutex{c: c, key: key} }

// Key is the read-write lock's key.
func (m *RWMutex) Key() string { return m.key }

// RLock waits until it holds a read (shared) hold of the key, or ctx ends,
// and returns the lease (Sequencer().Read is true). Options as for
// Client.Lock, except WithKind (overridden), WithLimit above 1 and
// WithKeys (INVALID_ARGUMENT). Errors as for Client.Lock; a key of another
// kind fails with ErrKindConflict.
func (m *RWMutex) RLock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return m.c.acquire(ctx, m.key, withMode(opts, lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ))
}

// Lock waits until it holds the write (exclusive) hold of the key, or ctx
// ends, and returns the lease (Sequencer().Read is false). Options and
// errors as for RLock.
func (m *RWMutex) Lock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return m.c.acquire(ctx, m.key, withMode(opts, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE))
}

// TryRLock takes a read hold if it can now: a key held by a writer, or
// with a writer waiting (arrival order), fails with a *StatusError that
// matches ErrBusy and names the holders.
func (m *RWMutex) TryRLock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return m.c.acquire(ctx, m.key, withMode(append(opts, tryOnce), lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ))
}

// TryLock takes the write hold if nobody holds or waits for the key now;
// else it fails with a *StatusError that matches ErrBusy and names the
// holders.
func (m *RWMutex) TryLock(ctx context.Context, opts ...LockOption) (*Lease, error) {
	return m.c.acquire(ctx, m.key, withMode(append(opts, tryOnce), lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE))
}

// withMode appends the kind after the caller's options, so that it wins.
func withMode(opts []LockOption, k lockbrokerv1.AcquireKind) []LockOption {
	return append(append([]LockOption{}, opts...), WithKind(k))
}
