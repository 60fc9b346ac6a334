package client

import (
	"context"
	"errors"
	"sync"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// ErrNotLeader is Proclaim's error when this Election does not lead (no
// Campaign won, or the leadership was resigned or lost).
var ErrNotLeader = errors.New("lockbroker: not the leader")

// Election is leader election on one key, in the shape of etcd's
// concurrency.Election and the other lockbroker libraries' Election
// (Python, Node, Java: election(key) with campaign, resign, proclaim,
// leader and observe):
//
//	e := c.Election("service/leader", client.WithTTL(10*time.Second))
//	lease, err := e.Campaign(ctx, []byte("10.0.0.7:8080")) // blocks until leading
//	...
//	<-lease.Lost() // leadership ended (see Lease), or:
//	err = e.Resign(ctx)
//
// Observers, candidates or not, follow the leader with Leader and Observe.
// Leadership is a Lease: pass lease.Sequencer().Token to what the leader
// writes to. An Election is safe for concurrent use; one Campaign at a time.
type Election struct {
	c    *Client
	key  string
	opts []LockOption

	mu    sync.Mutex
	lease *Lease // the last Campaign's, until Resign
}

// Election returns the election on key. opts apply to every Campaign
// (WithTTL, WithLockDelay, WithSessionName, ...; WithValue is Campaign's
// value).
func (c *Client) Election(key string, opts ...LockOption) *Election {
	return &Election{c: c, key: key, opts: opts}
}

// Key is the election's lock key.
func (e *Election) Key() string { return e.key }

// Campaign waits until this candidate leads (it holds the key, with value
// as the lock's value: its identity, e.g. an address) or ctx ends, and
// returns the leadership's Lease. Errors are Lock's.
func (e *Election) Campaign(ctx context.Context, value []byte, opts ...LockOption) (*Lease, error) {
	all := append(append(append([]LockOption(nil), e.opts...), opts...), WithValue(value))
	l, err := e.c.Lock(ctx, e.key, all...)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
	return l, nil
}

// Resign gives the leadership up (releases the last Campaign's lease) so
// that another candidate can lead at once. Without a leadership it does
// nothing; a leadership already lost returns its loss (a *LostError).
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	l := e.lease
	e.lease = nil
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Release(ctx)
}

// Proclaim changes the leader's value without giving the leadership up
// (the token stays the same). ErrNotLeader without a leadership.
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	if l == nil {
		return ErrNotLeader
	}
	select {
	case <-l.Lost():
		return ErrNotLeader
	default:
	}
	return l.SetValue(ctx, value)
}

// Leader returns the current leader (its Value is the leader's identity),
// read consistently, or nil when nobody leads.
func (e *Election) Leader(ctx context.Context) (*lockbrokerv1.Holder, error) {
	st, err := e.c.GetLock(ctx, e.key)
	if err != nil {
		return nil, err
	}
	if len(st.GetHolders()) == 0 {
		return nil, nil
	}
	return st.GetHolders()[0], nil
}

// Observer follows an election's leader. Read the leaders from C.
type Observer struct {
	// C receives the leader now, then after every change of leadership (a
	// new leader, a new value proclaimed), nil when nobody leads (a
	// resignation, a failure), until the observation ends; it is then
	// closed and Err says why.
	C <-chan *lockbrokerv1.Holder

	w *Watcher
}

// Err is nil while the observation runs, then the reason it ended: ctx's
// error when the caller ended it, else the broker's status.
func (o *Observer) Err() error { return o.w.Err() }

// Done is closed when the observation has ended.
func (o *Observer) Done() <-chan struct{} { return o.w.Done() }

// Observe follows the leader until ctx ends (see Observer). It returns once
// the broker has sent the state now; a replica that goes away is replaced
// by the next one (WithReplicas), as for Watch.
func (e *Election) Observe(ctx context.Context) (*Observer, error) {
	w, err := e.c.Watch(ctx, e.key)
	if err != nil {
		return nil, err
	}
	ch := make(chan *lockbrokerv1.Holder)
	go func() {
		defer close(ch)
		var last *lockbrokerv1.Holder
		first := true
		for resp := range w.C {
			var h *lockbrokerv1.Holder
			if hs := resp.GetState().GetHolders(); len(hs) > 0 {
				h = hs[0]
			}
			if !first && sameLeader(last, h) {
				continue
			}
			first, last = false, h
			select {
			case ch <- h:
			case <-ctx.Done():
				for range w.C { // the watch ends with ctx
				}
				return
			}
		}
	}()
	return &Observer{C: ch, w: w}, nil
}

// sameLeader says whether a and b are the same leadership with the same
// value (nil: nobody leads).
func sameLeader(a, b *lockbrokerv1.Holder) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.GetSessionId() == b.GetSessionId() && a.GetToken() == b.GetToken() && string(a.GetValue()) == string(b.GetValue())
}
