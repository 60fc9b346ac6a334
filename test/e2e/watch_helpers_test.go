package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// wtObserver is a Watch stream whose responses a goroutine records as
// soon as they arrive, with their arrival times.
type wtObserver struct {
	t      testing.TB
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}

	mu     sync.Mutex
	got    []*lockbrokerv1.WatchResponse
	at     []time.Time
	err    error // the final Recv error
	cursor int   // next response `until` looks at
}

// wtObserve opens a Watch of key (of every key under it with prefix) and
// records what it sends until the test ends.
func wtObserve(t testing.TB, name string, c lockbrokerv1.LockServiceClient, key string, prefix bool) *wtObserver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ws, err := c.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key, Prefix: prefix})
	require.NoError(t, err)
	o := &wtObserver{t: t, name: name, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go func() {
		defer close(o.done)
		for {
			resp, err := ws.Recv()
			now := time.Now()
			o.mu.Lock()
			if err != nil {
				o.err = err
			} else {
				o.got = append(o.got, resp)
				o.at = append(o.at, now)
			}
			o.mu.Unlock()
			select {
			case o.wake <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-o.done })
	return o
}

// responses returns what the observer has received so far.
func (o *wtObserver) responses() ([]*lockbrokerv1.WatchResponse, []time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*lockbrokerv1.WatchResponse(nil), o.got...), append([]time.Time(nil), o.at...)
}

// until returns the first response after the previous match whose state
// satisfies want, and when it arrived; it fails the test after timeout.
func (o *wtObserver) until(timeout time.Duration, what string, want func(*lockbrokerv1.LockState) bool) (*lockbrokerv1.WatchResponse, time.Time) {
	o.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		o.mu.Lock()
		for o.cursor < len(o.got) {
			i := o.cursor
			o.cursor++
			if want(o.got[i].GetState()) {
				resp, at := o.got[i], o.at[i]
				o.mu.Unlock()
				return resp, at
			}
		}
		err := o.err
		o.mu.Unlock()
		if err != nil {
			o.t.Fatalf("%s: watch ended before %s: %v", o.name, what, err)
		}
		select {
		case <-o.wake:
		case <-deadline.C:
			got, _ := o.responses()
			o.t.Fatalf("%s: no %s within %s; got %s", o.name, what, timeout, wtDescribe(got))
		}
	}
}

// unread makes the last match the next one until can return again.
func (o *wtObserver) unread() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cursor > 0 {
		o.cursor--
	}
}

// wtHeldBy matches a lock state held by the session.
func wtHeldBy(session string) func(*lockbrokerv1.LockState) bool {
	return func(st *lockbrokerv1.LockState) bool {
		return len(st.GetHolders()) == 1 && st.GetHolders()[0].GetSessionId() == session
	}
}

// wtFree matches a state with no holder.
func wtFree(st *lockbrokerv1.LockState) bool { return len(st.GetHolders()) == 0 }

// wtDescribe renders responses compactly for failure messages.
func wtDescribe(rs []*lockbrokerv1.WatchResponse) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(wtState(r.GetState()))
		if r.GetSkipped() > 0 {
			fmt.Fprintf(&b, "(skipped %d)", r.GetSkipped())
		}
	}
	return "[" + b.String() + "]"
}

func wtState(st *lockbrokerv1.LockState) string {
	kind := strings.TrimPrefix(st.GetKind().String(), "LOCK_KIND_")
	if len(st.GetHolders()) == 0 {
		return fmt.Sprintf("%s:%s@%d:free", st.GetKey(), kind, st.GetIndex())
	}
	parts := make([]string, 0, len(st.GetHolders()))
	for _, h := range st.GetHolders() {
		parts = append(parts, fmt.Sprintf("%s/%d", h.GetValue(), h.GetToken()))
	}
	return fmt.Sprintf("%s:%s@%d:%s", st.GetKey(), kind, st.GetIndex(), strings.Join(parts, "+"))
}
