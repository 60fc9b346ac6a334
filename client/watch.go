package client

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// WatchOption configures one Watch.
type WatchOption func(*lockbrokerv1.WatchRequest)

// WithPrefix watches every lock and semaphore under key/ (and key itself)
// instead of key alone (default off). Each state on the channel is then the
// state of one of those keys; a key that disappears is reported once with
// kind NONE. After the state of every key there now, one response has
// SnapshotComplete set and no State: from then on the reader has the whole
// state, and every later response is a change. (After a move to another
// replica the burst and the marker come again.)
func WithPrefix() WatchOption { return func(r *lockbrokerv1.WatchRequest) { r.Prefix = true } }

// Watcher follows the state of a key. Read its states from C.
type Watcher struct {
	// C receives the key's state now, then after every change, until the
	// watch ends; it is then closed and Err says why. A reader that falls
	// behind gets the newest state, with Skipped counting the states the
	// broker dropped for it (gRPC first buffers up to ~128 KiB of states
	// per stream, which such a reader still reads).
	C <-chan *lockbrokerv1.WatchResponse

	done chan struct{}
	mu   sync.Mutex
	err  error
}

// Err is nil while the watch runs, and after C is closed the reason: ctx's
// error when the caller ended it (context.DeadlineExceeded once its
// deadline has passed, even if the broker's end of the stream came first),
// else the broker's status.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Done is closed when the watch has ended and its goroutine has exited.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Watch follows key's state ("no holder" included: a free lock is a state
// with no holders, so an observer of a leader key sees resignations and
// failures as well as new leaders). It returns once the broker has sent
// the first state, which is then the first on C; a request the broker
// refuses (a bad key: INVALID_ARGUMENT) fails here. The watch runs until
// ctx ends or the stream fails; when the broker is unavailable it moves to
// the next replica (see WithReplicas), starting again with the state now.
func (c *Client) Watch(ctx context.Context, key string, opts ...WatchOption) (*Watcher, error) {
	req := &lockbrokerv1.WatchRequest{Key: key}
	for _, o := range opts {
		o(req)
	}
	wctx, cancel := context.WithCancel(ctx)
	replica := 0
	stream, first, err := c.openWatch(wctx, replica, req)
	for err != nil && status.Code(err) == codes.Unavailable && replica+1 < len(c.locks) {
		replica++
		stream, first, err = c.openWatch(wctx, replica, req)
	}
	if err != nil {
		cancel()
		if callerEnded(ctx, err) {
			return nil, endOf(ctx)
		}
		return nil, asStatusError(err)
	}
	ch := make(chan *lockbrokerv1.WatchResponse)
	w := &Watcher{C: ch, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(ch)
		defer cancel()
		err := c.followWatch(wctx, req, replica, stream, first, ch)
		if callerEnded(ctx, err) {
			err = endOf(ctx)
		} else {
			err = asStatusError(err)
		}
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}()
	return w, nil
}

// callerEnded says whether err ended a call because ctx did: ctx is done,
// or err is DEADLINE_EXCEEDED and ctx's deadline has passed. The broker
// ends a stream at the same deadline (gRPC sends it along), and its
// DEADLINE_EXCEEDED can be read before ctx's own timer has fired.
func callerEnded(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && status.Code(err) == codes.DeadlineExceeded && !time.Now().Before(d)
}

// endOf is ctx's error, or context.DeadlineExceeded when its deadline has
// passed and its timer has not fired yet.
func endOf(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// openWatch opens a Watch on replica i and reads its first state.
func (c *Client) openWatch(ctx context.Context, i int, req *lockbrokerv1.WatchRequest) (lockbrokerv1.LockService_WatchClient, *lockbrokerv1.WatchResponse, error) {
	stream, err := c.locks[i].Watch(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	return stream, first, nil
}

// followWatch delivers states to ch, reconnecting on UNAVAILABLE, until
// ctx ends or the stream fails otherwise.
func (c *Client) followWatch(ctx context.Context, req *lockbrokerv1.WatchRequest, replica int, stream lockbrokerv1.LockService_WatchClient, next *lockbrokerv1.WatchResponse, ch chan<- *lockbrokerv1.WatchResponse) error {
	backoff := 50 * time.Millisecond
	for {
		for next != nil {
			select {
			case ch <- next:
			case <-ctx.Done():
				return ctx.Err()
			}
			resp, err := stream.Recv()
			if err != nil {
				next = nil
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if status.Code(err) != codes.Unavailable {
					return err
				}
				break
			}
			backoff = 50 * time.Millisecond
			next = resp
		}
		// The broker went away: start again on the next replica.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		replica = (replica + 1) % len(c.locks)
		s, first, err := c.openWatch(ctx, replica, req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if status.Code(err) != codes.Unavailable {
				return err
			}
			continue
		}
		stream, next = s, first
	}
}

// GetLock returns key's state, read consistently by the broker.
func (c *Client) GetLock(ctx context.Context, key string) (*lockbrokerv1.LockState, error) {
	var out *lockbrokerv1.LockState
	err := c.unary(func(l lockbrokerv1.LockServiceClient) error {
		resp, err := l.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
		out = resp.GetState()
		return err
	})
	return out, err
}

// Leader returns the current holder of the lock at key (leader discovery:
// its Value is the leader's identity), or nil when nobody holds it.
//
// Deprecated: use c.Election(key).Leader(ctx), the election API every
// lockbroker library shares.
func (c *Client) Leader(ctx context.Context, key string) (*lockbrokerv1.Holder, error) {
	return c.Election(key).Leader(ctx)
}

// CheckSequencer reports whether seq is still the current grant of its key
// (Chubby's CheckSequencer), and the key's state now: who holds it.
func (c *Client) CheckSequencer(ctx context.Context, seq *lockbrokerv1.Sequencer) (bool, *lockbrokerv1.LockState, error) {
	var resp *lockbrokerv1.CheckSequencerResponse
	err := c.unary(func(l lockbrokerv1.LockServiceClient) error {
		var err error
		resp, err = l.CheckSequencer(ctx, &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
		return err
	})
	return resp.GetCurrent(), resp.GetState(), err
}

// unary runs call on each replica in turn while the broker is UNAVAILABLE.
// Broker errors come back as *StatusError.
func (c *Client) unary(call func(lockbrokerv1.LockServiceClient) error) error {
	return c.each(func(i int) error { return call(c.locks[i]) })
}

// each runs call with each replica's index in turn while the broker is
// UNAVAILABLE. Broker errors come back as *StatusError.
func (c *Client) each(call func(i int) error) error {
	var err error
	for i := range c.locks {
		err = call(i)
		if err == nil || status.Code(err) != codes.Unavailable {
			break
		}
	}
	return asStatusError(err)
}
