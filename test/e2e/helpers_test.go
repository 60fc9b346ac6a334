package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// stream is an Acquire stream with its events on a channel.
type stream struct {
	t      testing.TB
	cancel context.CancelFunc
	events chan *lockbrokerv1.AcquireResponse
	done   chan error // the final Recv error (io.EOF on a clean end)
}

// acquire opens an Acquire stream; events arrive on s.events.
func acquire(t testing.TB, c lockbrokerv1.LockServiceClient, req *lockbrokerv1.AcquireRequest) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Acquire(ctx, req)
	require.NoError(t, err)
	s := &stream{t: t, cancel: cancel, events: make(chan *lockbrokerv1.AcquireResponse, 1000), done: make(chan error, 1)}
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				s.done <- err
				close(s.events)
				return
			}
			s.events <- resp
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range s.events {
		}
	})
	return s
}

// next returns the next event that matches want, failing after timeout.
func (s *stream) next(timeout time.Duration, want func(*lockbrokerv1.AcquireResponse) bool) *lockbrokerv1.AcquireResponse {
	s.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				err := <-s.done
				s.done <- err
				s.t.Fatalf("stream ended before the wanted event: %v", err)
			}
			if want(ev) {
				return ev
			}
		case <-deadline:
			s.t.Fatalf("no wanted event within %s", timeout)
		}
	}
}

// acquired waits for the `acquired` event.
func (s *stream) acquired(timeout time.Duration) *lockbrokerv1.AcquireAcquired {
	s.t.Helper()
	return s.next(timeout, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil }).GetAcquired()
}

// end waits for the stream to end and returns its final error.
func (s *stream) end(timeout time.Duration) error {
	s.t.Helper()
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				err := <-s.done
				s.done <- err
				return err
			}
		case <-time.After(timeout):
			s.t.Fatalf("stream did not end within %s", timeout)
		}
	}
}

func isLost(r *lockbrokerv1.AcquireResponse) bool   { return r.GetLost() != nil }
func isQueued(r *lockbrokerv1.AcquireResponse) bool { return r.GetQueued() != nil }

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// fast is a session with the shortest TTL and no lock-delay.
func fast() *lockbrokerv1.AcquireRequest_NewSession {
	return &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: dur(10 * time.Second), LockDelay: dur(0)}}
}
