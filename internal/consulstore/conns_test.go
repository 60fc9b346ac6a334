package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// dialCounter wraps a dialer: it counts the connections dialled and those
// open at once.
type dialCounter struct {
	dials, open, maxOpen atomic.Int64
}

func (d *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.dials.Add(1)
	n := d.open.Add(1)
	for m := d.maxOpen.Load(); n > m && !d.maxOpen.CompareAndSwap(m, n); m = d.maxOpen.Load() {
	}
	return &countedConn{Conn: c, d: d}, nil
}

type countedConn struct {
	net.Conn
	d    *dialCounter
	once sync.Once
}

// SyscallConn lets stillOpen peek at the socket, as on a plain connection.
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.d.open.Add(-1) })
	return c.Conn.Close()
}

// openCounted opens a Store on agent whose plain calls dial through d;
// idle is the transport's IdleConnTimeout (0: the default).
func openCounted(t *testing.T, agent *consultest.Agent, d *dialCounter, opts Options, idle time.Duration) *Store {
	t.Helper()
	cfg := agent.Config()
	cfg.Transport = newTransport(nil)
	cfg.Transport.DialContext = d.dial
	if idle > 0 {
		cfg.Transport.IdleConnTimeout = idle
	}
	s := openConfig(t, cfg, opts)
	require.NotNil(t, s.pool, "plain calls go over the pool")
	return s
}

func setOp(key string) []broker.Op {
	return []broker.Op{{Verb: broker.OpSet, Key: key, Value: []byte("v")}}
}

// TestPoolReusesAndCapsConnections proves, on a real agent, that calls one
// after another share one connection, and that calls that keep their
// connections (blocking reads on the plain client) never open more than
// MaxConns: the others wait for one and all complete.
func TestPoolReusesAndCapsConnections(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	var d dialCounter
	s := openCounted(t, agent, &d, Options{MaxConns: 2}, 0)
	for i := range 20 {
		_, err := s.Txn(t.Context(), setOp(fmt.Sprintf("pool/%d", i)))
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), d.dials.Load(), "20 calls in a row: one connection")

	_, meta, err := s.c.KV().Get("pool/0", nil)
	require.NoError(t, err)
	const wait = 300 * time.Millisecond
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			q := (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: wait}).WithContext(t.Context())
			_, _, err := s.c.KV().Get("pool/0", q)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.LessOrEqual(t, d.maxOpen.Load(), int64(2), "never more than MaxConns open")
	assert.GreaterOrEqual(t, time.Since(start), 3*wait-50*time.Millisecond, "six reads of %v over two connections take three turns", wait)
	assert.LessOrEqual(t, d.dials.Load(), int64(2))
}

// TestPoolClosesIdleConnections proves that connections a burst opened are
// closed once idle longer than the transport's IdleConnTimeout, while a
// steady trickle of calls keeps reusing the most recent one.
func TestPoolClosesIdleConnections(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	var d dialCounter
	const idle = 300 * time.Millisecond
	s := openCounted(t, agent, &d, Options{MaxConns: 4}, idle)
	_, err := s.Txn(t.Context(), setOp("idle/k"))
	require.NoError(t, err)
	_, meta, err := s.c.KV().Get("idle/k", nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			q := (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 100 * time.Millisecond}).WithContext(t.Context())
			_, _, err := s.c.KV().Get("idle/k", q)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, int64(4), d.open.Load(), "the burst opened every connection allowed")
	for end := time.Now().Add(3 * idle); time.Now().Before(end); time.Sleep(idle / 6) {
		_, err := s.Txn(t.Context(), setOp("idle/k"))
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), d.open.Load(), "the burst's idle connections were closed")
	assert.Equal(t, int64(4), d.dials.Load(), "the trickle kept reusing one")
}

// TestPoolCallEndedByContext proves that a call its context ends returns
// at once with that error, that its connection is closed rather than kept
// (an answer may still be on its way), and that its slot is free again.
func TestPoolCallEndedByContext(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	var d dialCounter
	s := openCounted(t, agent, &d, Options{MaxConns: 1}, 0)
	_, err := s.Txn(t.Context(), setOp("cancel/k"))
	require.NoError(t, err)
	_, meta, err := s.c.KV().Get("cancel/k", nil)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = s.c.KV().Get("cancel/k", (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 10 * time.Second}).WithContext(ctx))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 2*time.Second, "the context ends the call, not the agent's wait")
	assert.Equal(t, int64(0), d.open.Load(), "the interrupted connection is closed")

	_, err = s.Txn(t.Context(), setOp("cancel/k"))
	require.NoError(t, err, "the one slot is free again")
	assert.Equal(t, int64(2), d.dials.Load())
}

// TestPoolDropsConnectionTheAgentClosed restarts the agent under an idle
// pooled connection: the next call sees it closed before using it and
// dials a new one, so it succeeds.
func TestPoolDropsConnectionTheAgentClosed(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	var d dialCounter
	s := openCounted(t, agent, &d, Options{}, 0)
	_, err := s.Txn(t.Context(), setOp("restart/k"))
	require.NoError(t, err)
	agent.Restart()
	require.Eventually(t, func() bool {
		s.pool.mu.Lock()
		defer s.pool.mu.Unlock()
		return len(s.pool.idle) == 1 && !stillOpen(s.pool.idle[0].nc)
	}, 5*time.Second, 10*time.Millisecond, "the idle connection is seen closed")
	_, err = s.Txn(t.Context(), setOp("restart/k"))
	require.NoError(t, err)
	assert.Equal(t, int64(2), d.dials.Load())
	assert.Equal(t, int64(1), d.open.Load(), "the dead connection was closed")
}

// TestOpenPoolFallsBack checks which transports the pool leaves to
// net/http: those with a proxy for the agent's address or a custom TLS
// dialer, and schemes other than http and https. Keep-alives off (as
// api.NewClient sets for a unix socket) do not stop it.
func TestOpenPoolFallsBack(t *testing.T) {
	t.Parallel()
	proxied := newTransport(nil)
	proxied.Proxy = func(*http.Request) (*url.URL, error) { return url.Parse("http://proxy.example:3128") }
	tlsDialer := newTransport(nil)
	tlsDialer.DialTLSContext = func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("unused") }
	noKeepAlive := newTransport(nil)
	noKeepAlive.DisableKeepAlives = true
	tests := []struct {
		name   string
		tr     *http.Transport
		scheme string
		pooled bool
	}{
		{"plain http", newTransport(nil), "http", true},
		{"https", newTransport(nil), "https", true},
		{"proxy", proxied, "http", false},
		{"custom TLS dialer", tlsDialer, "https", false},
		{"keep-alives off", noKeepAlive, "http", true},
		{"other scheme", newTransport(nil), "ftp", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.pooled, openPool(tt.tr, tt.scheme, "127.0.0.1:8500", 4) != nil)
		})
	}
}

// TestStillOpen checks the idle probe on a loopback pair: open while
// nothing arrived, not once the peer wrote or closed.
func TestStillOpen(t *testing.T) {
	t.Parallel()
	pair := func() (net.Conn, net.Conn) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		p, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(); _ = p.Close() })
		return c, p
	}
	c, p := pair()
	assert.True(t, stillOpen(c))
	_, err := p.Write([]byte("x"))
	require.NoError(t, err)
	assert.Eventually(t, func() bool { return !stillOpen(c) }, time.Second, time.Millisecond, "unexpected data")

	c, p = pair()
	require.NoError(t, p.Close())
	assert.Eventually(t, func() bool { return !stillOpen(c) }, time.Second, time.Millisecond, "closed by the peer")
}

// TestPoolOverUnixSocket proves the pool serves an agent reached through
// a unix:// address, as api.NewClient dials it.
func TestPoolOverUnixSocket(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "cs")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "http.sock")
	agent := consultest.Start(t, consultest.WithHCL(fmt.Sprintf(`addresses { http = "127.0.0.1 unix://%s" }`, sock)))
	_ = agent
	s := openConfig(t, &api.Config{Address: "unix://" + sock}, Options{})
	require.NotNil(t, s.pool)
	for range 3 {
		_, err := s.Txn(t.Context(), setOp("unix/k"))
		require.NoError(t, err)
	}
	entries, _, err := s.List(t.Context(), "unix/", false)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
	s.pool.mu.Lock()
	assert.Len(t, s.pool.idle, 1, "one connection served every call")
	s.pool.mu.Unlock()
}

// BenchmarkTxnTransport measures a one-op transaction on a real agent over
// the pool and over net/http's Transport (the Store's own, which the pool
// replaced for plain calls), with this process's CPU per call:
//
//	go test -run '^$' -bench TxnTransport -count 5 ./internal/consulstore/
func BenchmarkTxnTransport(b *testing.B) {
	agent := consultest.Start(b)
	stores := make([]*Store, 2)
	for i := range stores {
		s, err := Open(agent.Config(), Options{})
		require.NoError(b, err)
		defer s.Close()
		require.NotNil(b, s.pool)
		stores[i] = s
	}
	stores[1].txn.hc = &http.Client{Transport: recorder{next: stores[1].transports[0]}}
	for _, bm := range []struct {
		name string
		s    *Store
	}{{"pool", stores[0]}, {"net-http", stores[1]}} {
		b.Run(bm.name, func(b *testing.B) {
			ops := setOp("bench/k")
			c0 := cpuTime()
			for b.Loop() {
				if _, err := bm.s.Txn(context.Background(), ops); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N)/1e3, "cpu-µs/op")
		})
	}
}

// cpuTime is this process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
