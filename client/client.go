// Package client is the Go client of lockbroker: distributed locks,
// semaphore slots and leader election held through a broker's gRPC stream.
//
// A lock from this package is a lease, not a mutex. It can be lost at any
// moment: a network partition, a paused process (GC, swap, a stopped VM),
// an operator destroying the session. Lease.Lost is closed as soon as the
// client knows, and before the guaranteed deadline when it cannot reach any
// broker, but a process paused past that deadline learns it only when it
// runs again. Work that must never run twice at once must therefore pass
// Lease.Sequencer().Token to the resource it changes, and the resource must
// refuse tokens lower than the highest it has seen (fencing).
//
// Besides locks (Client.Lock) and semaphore slots (WithLimit), it takes
// read-write locks (Client.RWLock: many readers or one writer, served in
// arrival order) and multi-key locks (Client.Lock with WithKeys: up to 64
// keys, all or nothing, one token per key in Lease.Sequencers). Each
// returns the same *Lease.
package client

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Client talks to one or more broker replicas.
type Client struct {
	locks    []lockbrokerv1.LockServiceClient
	sessions []lockbrokerv1.SessionServiceClient // same replicas, same order
}

// Option configures a Client.
type Option func(*Client)

// WithReplicas adds other broker replicas. When the broker holding a
// lease's stream goes away, the lease resumes on the next replica with the
// same session and sequencer, before its guaranteed deadline.
func WithReplicas(conns ...grpc.ClientConnInterface) Option {
	return func(c *Client) {
		for _, cc := range conns {
			c.add(cc)
		}
	}
}

// New returns a Client on conn (a *grpc.ClientConn to a broker).
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	c := &Client{}
	c.add(conn)
	for _, o := range opts {
		o(c)
	}
	return c
}

func (c *Client) add(cc grpc.ClientConnInterface) {
	c.locks = append(c.locks, lockbrokerv1.NewLockServiceClient(cc))
	c.sessions = append(c.sessions, lockbrokerv1.NewSessionServiceClient(cc))
}

// LockOption configures one Lock, TryLock or TryAcquire.
type LockOption func(*lockbrokerv1.AcquireRequest)

func session(r *lockbrokerv1.AcquireRequest) *lockbrokerv1.SessionOptions {
	if r.GetNewSession() == nil {
		r.Session = &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{}}
	}
	return r.GetNewSession()
}

// WithValue sets the holder's value (its identity; default empty; at most
// 256 KiB, else INVALID_ARGUMENT naming value).
func WithValue(v []byte) LockOption { return func(r *lockbrokerv1.AcquireRequest) { r.Value = v } }

// WithTTL sets the session TTL (default 15s; 10s to 24h, else
// INVALID_ARGUMENT). A longer TTL survives longer broker outages and keeps
// a crashed holder's lock longer.
func WithTTL(d time.Duration) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { session(r).Ttl = durationpb.New(d) }
}

// WithLockDelay sets Consul's lock-delay (default 15s; 0 to 60s, else
// INVALID_ARGUMENT): after the session is invalidated nobody can take the
// key for this long.
func WithLockDelay(d time.Duration) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { session(r).LockDelay = durationpb.New(d) }
}

// WithDeleteBehavior makes Consul delete the key, not just release it,
// when the session is invalidated (for work keys that should vanish).
func WithDeleteBehavior() LockOption {
	return func(r *lockbrokerv1.AcquireRequest) {
		session(r).Behavior = lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE
	}
}

// WithSessionName names the session the broker creates (default: the
// broker's own name; at most 128 bytes, else INVALID_ARGUMENT). Holders
// show it (Holder.SessionName), and so does ListSessions.
func WithSessionName(name string) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { session(r).Name = name }
}

// WithLimit takes a semaphore slot of n (default 1: an exclusive lock;
// every holder of a key must use the same limit, else ErrConflict).
func WithLimit(n uint32) LockOption { return func(r *lockbrokerv1.AcquireRequest) { r.Limit = n } }

// WithKind says what to take (default ACQUIRE_KIND_UNSPECIFIED: WithLimit
// decides, 0 or 1 a lock, more a semaphore). ACQUIRE_KIND_LOCK with a
// limit above 1 is INVALID_ARGUMENT.
func WithKind(k lockbrokerv1.AcquireKind) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { r.Kind = k }
}

// WithSemaphore takes a semaphore slot even when the limit is 1 (a
// one-slot semaphore in Consul's semaphore layout under the prefix key,
// which a lock of the same key is not): the same as
// WithKind(ACQUIRE_KIND_SEMAPHORE). The limit is WithLimit's, 1 when unset.
func WithSemaphore() LockOption {
	return WithKind(lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE)
}

// WithFair admits semaphore waiters oldest first (default off).
func WithFair() LockOption { return func(r *lockbrokerv1.AcquireRequest) { r.Fair = true } }

// WithKeys takes keys together with Lock's key, all or nothing: a
// multi-key lock (up to 64 keys in all; each an ordinary lock key, all
// different; INVALID_ARGUMENT naming keys otherwise). The broker takes
// every key in one Consul transaction with one session, or none: no other
// client ever sees a subset held by this request, and while it waits it
// holds none. It waits in every key's queue with one place, so two
// multi-key requests with overlapping keys never deadlock and single-key
// traffic cannot starve it. The lease has one grant per key
// (Lease.Sequencers, in request order: Lock's key first); losing any key
// ends the whole lease (Lease.LostKey names it, and the broker releases
// the others); Release releases them all. Only for plain locks: with
// WithLimit above 1, WithSemaphore or an RWMutex it is INVALID_ARGUMENT.
// Consul's api.Lock on any of the keys excludes correctly. Repeated
// WithKeys add up.
func WithKeys(keys ...string) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { r.Keys = append(r.Keys, keys...) }
}

// WithWaitTimeout bounds Lock's wait (default: until ctx ends). A wait that
// runs out fails with ErrWaitTimeout (gRPC DEADLINE_EXCEEDED), a
// *StatusError naming the holders. Zero tries once, as TryLock does.
func WithWaitTimeout(d time.Duration) LockOption {
	return func(r *lockbrokerv1.AcquireRequest) { r.WaitTimeout = durationpb.New(d) }
}
