package broker

import (
	"context"
	"time"
)

// A hold's stream can end in two ways that look alike to the broker (its
// context is cancelled) but promise different things:
//
//   - the client cancelled it (its connection is still up): the client
//     gave the hold up, so the broker releases it at once;
//   - the connection was lost (reset, closed, or keepalive gave it up):
//     the client may still believe it holds the lock until the last
//     guaranteed_for it received, and its library is trying to resume the
//     hold, here or on another replica. Releasing now would let another
//     client in while this one still believes: the broker keeps the hold
//     (renewed) until the last deadline it promised, plus lingerGrace,
//     unless a resume takes it over first (the record's owner moves and
//     the guard ends this copy with RESUMED), then releases it.
//
// The server tells the two apart with WithConnGone: a channel closed when
// the stream's connection is lost while the stream is live, before the
// stream's context ends (a stream its client cancelled before the
// connection closed never sees it closed). Without one (an in-process
// caller) every end is a cancel.
//
// Every promise is also capped at the broker's promise bound (see
// WithPromiseBound), so that a client that vanished is released within
// keepalive detection + the bound + lingerGrace (20 s with the defaults).
const (
	// lingerGrace covers the time between the broker sending a deadline
	// and the client receiving it (a client counts guaranteed_for from
	// when it receives the event).
	lingerGrace = 500 * time.Millisecond
	// goneWait is how long the broker waits, after a send on a stream
	// failed, for the stream's context to end.
	goneWait = 250 * time.Millisecond
	// DefaultPromiseBound: with the server's default keepalive (3 s + 2 s)
	// and lingerGrace, a vanished client's hold is released within 20 s.
	DefaultPromiseBound = 14500 * time.Millisecond
)

type connGoneKey struct{}

// WithConnGone returns ctx carrying gone, a channel closed when the
// connection of the stream ctx belongs to is lost while the stream is live,
// before ctx ends.
func WithConnGone(ctx context.Context, gone <-chan struct{}) context.Context {
	if gone == nil {
		return ctx
	}
	return context.WithValue(ctx, connGoneKey{}, gone)
}

func connGone(ctx context.Context) <-chan struct{} {
	g, _ := ctx.Value(connGoneKey{}).(<-chan struct{})
	return g
}

// disconnected reports whether ctx ended because its connection was lost
// (rather than cancelled by the client). The channel is closed before ctx
// ends, and only if the connection went first, so once ctx has ended the
// answer does not depend on when it is asked: a client that cancels and
// then closes its connection (a process that exits) cancelled.
func disconnected(ctx context.Context) bool {
	gone := connGone(ctx)
	if gone == nil {
		return false
	}
	t := time.NewTimer(goneWait)
	defer t.Stop()
	select { // a failed send may come just before the context ends
	case <-ctx.Done():
	case <-t.C:
	}
	select {
	case <-gone:
		return true
	default:
		return false
	}
}

// promise is the guaranteed_for to send now for a hold safe until
// safeUntil: capped at the broker's promise bound. The deadline is
// remembered: a hold whose connection is lost is kept until then.
func (h *hold) promise(safeUntil time.Time) time.Duration {
	now := time.Now()
	g := max(min(safeUntil.Sub(now), h.b.promiseBound), 0)
	h.mu.Lock()
	if d := now.Add(g); d.After(h.promised) {
		h.promised = d
	}
	h.mu.Unlock()
	return g
}

// lingerUntil is when a hold whose connection was lost may be released:
// the last deadline promised to its client, plus lingerGrace.
func (h *hold) lingerUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.promised.IsZero() {
		return time.Now()
	}
	return h.promised.Add(lingerGrace)
}
