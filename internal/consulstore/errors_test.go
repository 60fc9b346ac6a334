package consulstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// requireStoreError asserts that err is a *broker.StoreError of kind k for
// Consul operation op, and returns it.
func requireStoreError(t *testing.T, err error, k broker.StoreErrorKind, op string) *broker.StoreError {
	t.Helper()
	var se *broker.StoreError
	require.ErrorAs(t, err, &se, "want a store error, got %v", err)
	assert.Equal(t, k, se.Kind, "kind of %v", err)
	assert.Equal(t, op, se.Op)
	assert.NotErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	return se
}

// unreachableConfig returns a configuration for a loopback address where
// nothing listens.
func unreachableConfig(t *testing.T) *api.Config {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return &api.Config{Address: addr, Scheme: "http"}
}

// storeCall is one Store method called with throwaway arguments.
type storeCall struct {
	name, op string
	call     func(ctx context.Context, s *Store) error
}

// everyCall calls each Store method once.
var everyCall = []storeCall{
	{"CreateSession", "session create", func(ctx context.Context, s *Store) error {
		_, err := s.CreateSession(ctx, broker.SessionSpec{TTL: 15 * time.Second})
		return err
	}},
	{"RenewSession", "session renew", func(ctx context.Context, s *Store) error {
		_, err := s.RenewSession(ctx, "3f1c7a52-0000-4000-8000-000000000000")
		return err
	}},
	{"DestroySession", "session destroy", func(ctx context.Context, s *Store) error {
		return s.DestroySession(ctx, "3f1c7a52-0000-4000-8000-000000000000")
	}},
	{"Session", "session info", func(ctx context.Context, s *Store) error {
		_, err := s.Session(ctx, "3f1c7a52-0000-4000-8000-000000000000")
		return err
	}},
	{"Sessions", "session list", func(ctx context.Context, s *Store) error {
		_, err := s.Sessions(ctx)
		return err
	}},
	{"List", "kv list", func(ctx context.Context, s *Store) error {
		_, _, err := s.List(ctx, "p/", true)
		return err
	}},
	{"Watch", "kv watch", func(ctx context.Context, s *Store) error {
		_, _, err := s.Watch(ctx, "p/", 0)
		return err
	}},
	{"Txn write", "kv txn", func(ctx context.Context, s *Store) error {
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpSet, Key: "p/k", Value: []byte("v")}})
		return err
	}},
	{"Txn read", "kv txn", func(ctx context.Context, s *Store) error {
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpGet, Key: "p/k"}})
		return err
	}},
	{"Healthy", "status leader", func(ctx context.Context, s *Store) error {
		return s.Healthy(ctx)
	}},
}

// TestStoppedAgentIsUnavailable proves that every method fails fast with
// StoreUnavailable when the agent is gone (connection refused), and that
// the failures are counted as unavailable.
func TestStoppedAgentIsUnavailable(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{CallTimeout: 2 * time.Second})
	require.NoError(t, s.Healthy(t.Context()))
	agent.Stop()

	for _, tt := range everyCall {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			err := tt.call(t.Context(), s)
			requireStoreError(t, err, broker.StoreUnavailable, tt.op)
			assert.ErrorIs(t, err, broker.ErrUnavailable)
			assert.Less(t, time.Since(start), 2*time.Second, "refused is not a timeout")
		})
	}
	assert.Equal(t, uint64(len(everyCall)), gatherResult(t, s, "unavailable"))
}

// blackhole is a loopback TCP listener that accepts connections and never
// answers: the network view of a hung (SIGSTOPped) agent. It is not a fake
// Consul; it answers nothing at all.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestCallTimeoutIsUnavailable proves that every call is bounded by the
// Store's own timeout when ctx has none, that the timeout is
// StoreUnavailable (not a context error the caller could take for its
// own), and that a caller's earlier deadline comes back as
// context.DeadlineExceeded, unwrapped.
func TestCallTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	s := openConfig(t, &api.Config{Address: blackhole(t), Scheme: "http"},
		Options{CallTimeout: timeout, WaitTime: 100 * time.Millisecond})

	for _, tt := range everyCall {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			err := tt.call(context.Background(), s)
			elapsed := time.Since(start)
			requireStoreError(t, err, broker.StoreUnavailable, tt.op)
			assert.GreaterOrEqual(t, elapsed, timeout)
			assert.Less(t, elapsed, 5*time.Second)
		})
	}
	t.Run("caller deadline first", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpSet, Key: "k"}})
		assert.Equal(t, context.DeadlineExceeded, err, "unwrapped")
	})
}

// TestContextCanceled proves that a call whose ctx is cancelled returns
// context.Canceled itself, whether it was in flight or waiting for a
// blocking-query slot, and is counted as canceled.
func TestContextCanceled(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxBlocking: 1})
	_, idx, err := s.List(t.Context(), "c/", false)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 2)
	go func() { _, _, err := s.Watch(ctx, "c/", idx); errs <- err }()
	require.Eventually(t, func() bool { return s.OpenBlockingQueries() == 1 }, 5*time.Second, time.Millisecond)
	go func() { _, _, err := s.Watch(ctx, "c/", idx); errs <- err }()
	require.Eventually(t, func() bool { return s.QueuedBlockingQueries() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	for range 2 {
		select {
		case err := <-errs:
			assert.Equal(t, context.Canceled, err, "unwrapped")
		case <-time.After(5 * time.Second):
			t.Fatal("a cancelled Watch did not return")
		}
	}
	assert.Zero(t, s.OpenBlockingQueries())
	assert.Zero(t, s.QueuedBlockingQueries())
	// Only the Watch that reached Consul counts as a call.
	assert.Equal(t, uint64(1), gatherValue(t, s, "kv_watch", "canceled"))
}

// TestTooManyConnectionsRealAgent provokes Consul's own per-client
// connection limit (http_max_conns_per_client) and proves the refusal is
// StoreUnavailable with a retry hint when Consul's 429 is read (the limiter
// may also just close the connection: still unavailable).
func TestTooManyConnectionsRealAgent(t *testing.T) {
	t.Parallel()
	const limit = 4
	agent := consultest.Start(t, consultest.WithHCL(fmt.Sprintf(`limits { http_max_conns_per_client = %d }`, limit)))
	s := open(t, agent, Options{})
	_, idx, err := s.List(t.Context(), "busy/", false)
	require.NoError(t, err)
	s.Close() // its idle connection would count against the limit

	// Take every connection the agent allows us with blocking queries.
	other := openConfig(t, agent.Config(), Options{MaxBlocking: limit, WaitTime: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() {
			idx := idx
			for ctx.Err() == nil { // a watch refused by the limiter tries again
				_, next, err := other.Watch(ctx, "busy/", idx)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
				idx = max(idx, next)
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()
	require.Eventually(t, func() bool { return other.OpenBlockingQueries() == limit }, 5*time.Second, time.Millisecond)
	// Blocking queries are only in flight at Consul once it accepted their
	// connections; give the last one a moment to be counted.
	var lastErr error
	require.Eventually(t, func() bool {
		s.Close() // no idle connection from before: the next call dials
		_, lastErr = s.Txn(t.Context(), []broker.Op{{Verb: broker.OpSet, Key: "busy/k", Value: []byte("v")}})
		return lastErr != nil
	}, 5*time.Second, 20*time.Millisecond)
	se := requireStoreError(t, lastErr, broker.StoreUnavailable, "kv txn")
	t.Logf("over the limit: %v (retry after %v)", se, se.RetryAfter)
	if strings.Contains(se.Error(), "HTTP 429") {
		assert.Equal(t, time.Second, se.RetryAfter, "Consul sends no Retry-After: the default")
	}
}

// TestStatusShapes checks the classification of HTTP answers that a real
// agent cannot be made to give on demand (a 429 with Retry-After, 5xx, a
// body quoting the token). THIS USES A FAKE HTTP SERVER, for the shape of
// the answers only: every Consul behaviour is tested against real agents.
func TestStatusShapes(t *testing.T) {
	t.Parallel()
	const token = "5ec7e700-aaaa-bbbb-cccc-000000000000"
	var mu sync.Mutex
	var status int
	var header, body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		if header != "" {
			w.Header().Set("Retry-After", header)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	s := openConfig(t, &api.Config{Address: strings.TrimPrefix(srv.URL, "http://"), Scheme: "http", Token: token},
		Options{})

	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name         string
		status       int
		header, body string
		kind         broker.StoreErrorKind
		retry        time.Duration // -1: about 90s
	}{
		{"429 with Retry-After seconds", 429, "7", "Too Many Requests", broker.StoreUnavailable, 7 * time.Second},
		{"429 with Retry-After date", 429, date, "", broker.StoreUnavailable, -1},
		{"429 without Retry-After", 429, "", "Your IP is issuing too many concurrent connections", broker.StoreUnavailable, time.Second},
		{"500 no leader", 500, "", "No cluster leader", broker.StoreUnavailable, 0},
		{"502", 502, "", "bad gateway", broker.StoreUnavailable, 0},
		{"503 with Retry-After", 503, "3", "rate limit exceeded, try again later", broker.StoreUnavailable, 3 * time.Second},
		{"403", 403, "", "Permission denied: token with AccessorID 'x' lacks permission 'key:write'", broker.StorePermissionDenied, 0},
		{"403 ACL not found", 403, "", "ACL not found", broker.StorePermissionDenied, 0},
		{"400", 400, "", "Missing session", broker.StoreRejected, 0},
		{"413", 413, "", "Request body too large", broker.StoreRejected, 0},
		{"405", 405, "", "method not allowed", broker.StoreRejected, 0},
		{"token echoed", 400, "", "bad token " + token + " in ?token=" + token + "&x=1", broker.StoreRejected, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			status, header, body = tt.status, tt.header, tt.body
			mu.Unlock()
			for _, c := range everyCall {
				se := requireStoreError(t, c.call(t.Context(), s), tt.kind, c.op)
				switch {
				case tt.retry < 0:
					assert.InDelta(t, 90*time.Second, se.RetryAfter, float64(5*time.Second), c.name)
				default:
					assert.Equal(t, tt.retry, se.RetryAfter, c.name)
				}
				assert.NotContains(t, se.Error(), token, c.name)
			}
		})
	}
}

// TestRedact checks that secrets and token parameters never survive.
func TestRedact(t *testing.T) {
	t.Parallel()
	s := &Store{secrets: []string{"s3cret"}}
	got := s.redact(`Put "http://h/v1/txn?token=abc&x=1": s3cret; Token=def`)
	assert.Equal(t, `Put "http://h/v1/txn?token=<redacted>&x=1": <redacted>; Token=<redacted>`, got)
	assert.Len(t, s.redact(strings.Repeat("x", 10000)), maxCauseLen+3)
	assert.Equal(t, time.Duration(0), retryAfter("", 0))
	assert.Equal(t, 2*time.Second, retryAfter("junk", 2*time.Second))
	assert.Equal(t, 5*time.Second, retryAfter(" 5 ", 0))
	assert.True(t, errors.Is(&broker.StoreError{Kind: broker.StoreUnavailable}, broker.ErrUnavailable))
}
