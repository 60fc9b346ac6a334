package consulstore

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"
)

// connPool is the round tripper of a Store's plain calls (transactions,
// sessions, reads; not blocking queries): HTTP/1.1 over at most max
// connections to the one agent, each request written and its answer read
// on the caller's goroutine.
//
// net/http's Transport runs two goroutines per connection and hands every
// request and answer between them and the caller: four goroutine switches
// a call. On these short calls that is a fair share of the call: a one-op
// transaction took 275–299 µs and 127–134 µs of this process's CPU over
// the Transport, 228–245 µs and 77–89 µs over the pool, on a 2-core
// machine (BenchmarkTxnTransport). The pool keeps what the Store needs of
// that Transport: its dialer and TLS config, a cap on connections, idle
// reuse and a request's context ending the call. It does not speak HTTP/2
// or go through a proxy: openPool returns nil for a config that needs
// either (or a custom TLS dialer), and the Store keeps the Transport.
type connPool struct {
	scheme, host string // the only scheme and host it serves
	// dial opens a connection to the agent (with TLS for https).
	dial        func(ctx context.Context) (net.Conn, error)
	idleTimeout time.Duration

	tokens chan struct{} // one per connection that may be open or being dialled

	mu   sync.Mutex
	idle []*poolConn // most recently used last
}

// poolConn is one connection of a connPool.
type poolConn struct {
	nc        net.Conn // what requests go over (a *tls.Conn for https)
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

// aLongTimeAgo is a deadline that ends any I/O on a connection at once.
var aLongTimeAgo = time.Unix(1, 0)

// openPool returns a pool that serves tr's requests to scheme://host, or
// nil if tr's settings need what the pool does not do (a proxy for that
// address, a custom TLS dialer). The pool keeps connections even if tr
// has keep-alives off: api.NewClient turns them off for a unix:// address
// (cleanhttp's non-pooled transport), where reuse is as safe as over TCP.
func openPool(tr *http.Transport, scheme, host string, max int) *connPool {
	//lint:ignore SA1019 net/http still honours DialTLS: a transport with one is left to it
	if scheme != "http" && scheme != "https" || max <= 0 || tr.DialTLSContext != nil || tr.DialTLS != nil {
		return nil
	}
	if tr.Proxy != nil {
		probe := &http.Request{Method: http.MethodGet, URL: &url.URL{Scheme: scheme, Host: host}, Header: http.Header{}}
		if u, err := tr.Proxy(probe); err != nil || u != nil {
			return nil
		}
	}
	addr := host
	if _, _, err := net.SplitHostPort(host); err != nil {
		port := "80"
		if scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(host, port)
	}
	dialTCP := tr.DialContext
	if dialTCP == nil {
		dialTCP = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	p := &connPool{scheme: scheme, host: host, idleTimeout: tr.IdleConnTimeout, tokens: make(chan struct{}, max)}
	for range max {
		p.tokens <- struct{}{}
	}
	p.dial = func(ctx context.Context) (net.Conn, error) { return dialTCP(ctx, "tcp", addr) }
	if scheme == "https" {
		cfg := &tls.Config{}
		if tr.TLSClientConfig != nil {
			cfg = tr.TLSClientConfig.Clone()
		}
		if cfg.ServerName == "" {
			h, _, err := net.SplitHostPort(addr)
			if err != nil {
				h = host
			}
			cfg.ServerName = h
		}
		cfg.NextProtos = []string{"http/1.1"}
		handshake := tr.TLSHandshakeTimeout
		p.dial = func(ctx context.Context) (net.Conn, error) {
			raw, err := dialTCP(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			if handshake > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, handshake)
				defer cancel()
			}
			tc := tls.Client(raw, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = raw.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	return p
}

// RoundTrip sends req over an idle connection, or a new one while fewer
// than max are open, else waits for one (within req's context). The
// answer's body must be closed: that returns its connection to the pool,
// or closes it if the answer was not read to its end.
func (p *connPool) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != p.scheme || req.URL.Host != p.host {
		closeBody(req)
		return nil, fmt.Errorf("consulstore: request for %s://%s on the pool of %s://%s", req.URL.Scheme, req.URL.Host, p.scheme, p.host)
	}
	ctx := req.Context()
	select {
	case <-p.tokens:
	case <-ctx.Done():
		closeBody(req)
		return nil, ctx.Err()
	}
	pc := p.takeIdle()
	for try := 0; ; try++ {
		reused := pc != nil
		if !reused {
			var err error
			if pc, err = p.open(ctx); err != nil {
				p.tokens <- struct{}{}
				closeBody(req)
				return nil, err
			}
		}
		resp, stop, err := pc.roundTrip(ctx, req)
		if err == nil {
			resp.Body = &poolBody{p: p, pc: pc, body: resp.Body, stop: stop, keep: !resp.Close && !req.Close}
			return resp, nil
		}
		stop()
		_ = pc.nc.Close()
		pc = nil
		// A kept connection the agent closed while it was idle fails the
		// next request before any answer: send it again on a new one, as
		// net/http does, when nothing can have been done with it.
		if !reused || try > 0 || ctx.Err() != nil || !retryable(req, err) {
			p.tokens <- struct{}{}
			return nil, err
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				p.tokens <- struct{}{}
				return nil, err
			}
			req = req.Clone(ctx)
			req.Body = body
		}
	}
}

// writeError is a request that could not be written in full: the agent
// cannot have acted on it.
type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

// retryable says whether req may be sent again after err on a connection
// that had been idle: it was not written in full (and its body can be
// made again), or it reads only and no answer began.
func retryable(req *http.Request, err error) bool {
	if errors.As(err, new(writeError)) {
		return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	}
	return (req.Method == http.MethodGet || req.Method == http.MethodHead) && errors.Is(err, io.EOF)
}

// roundTrip writes req and reads its answer's head. stop unhooks the
// context from the connection; it reports false if the context ended the
// connection's I/O.
func (pc *poolConn) roundTrip(ctx context.Context, req *http.Request) (*http.Response, func() bool, error) {
	nc := pc.nc
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	if err := req.Write(pc.bw); err != nil {
		return nil, stop, writeError{err}
	}
	if err := pc.bw.Flush(); err != nil {
		return nil, stop, writeError{err}
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		return nil, stop, err
	}
	return resp, stop, nil
}

// open dials a new connection.
func (p *connPool) open(ctx context.Context) (*poolConn, error) {
	nc, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &poolConn{nc: nc, br: bufio.NewReaderSize(nc, 4096), bw: bufio.NewWriterSize(nc, 4096)}, nil
}

// takeIdle returns the most recently used idle connection that is still
// open, or nil. Connections idle too long or closed by the agent are
// closed on the way.
func (p *connPool) takeIdle() *poolConn {
	var stale []*poolConn
	defer func() { closeConns(stale) }()
	p.mu.Lock()
	defer p.mu.Unlock()
	for n := len(p.idle); n > 0; n = len(p.idle) {
		pc := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if (p.idleTimeout > 0 && time.Since(pc.idleSince) > p.idleTimeout) || pc.br.Buffered() > 0 || !stillOpen(pc.nc) {
			stale = append(stale, pc)
			continue
		}
		return pc
	}
	return nil
}

// putIdle keeps pc for the next request, and closes the connections idle
// longer than the idle timeout: the oldest, at the front (a burst's extra
// connections are not kept for good by a steady load that reuses the most
// recent one).
func (p *connPool) putIdle(pc *poolConn) {
	now := time.Now()
	pc.idleSince = now
	var expired []*poolConn
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && p.idleTimeout > 0 && now.Sub(p.idle[n].idleSince) > p.idleTimeout {
		n++
	}
	if n > 0 {
		expired = slices.Clone(p.idle[:n])
		p.idle = slices.Delete(p.idle, 0, n)
	}
	p.idle = append(p.idle, pc)
	p.mu.Unlock()
	closeConns(expired)
}

// CloseIdleConnections closes the idle connections; those in use close
// when their answer has been read.
func (p *connPool) CloseIdleConnections() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	closeConns(idle)
}

// closeConns closes conns (taken out of the pool, outside its lock).
func closeConns(conns []*poolConn) {
	for _, pc := range conns {
		_ = pc.nc.Close()
	}
}

// maxDrain is how much of an answer left unread Close reads to keep its
// connection; beyond it the connection is closed.
const maxDrain = 64 << 10

// poolBody is an answer's body; Close gives its connection back.
type poolBody struct {
	p    *connPool
	pc   *poolConn
	body io.ReadCloser
	stop func() bool
	keep bool // neither side asked to close the connection
	eof  bool
	done bool
}

func (b *poolBody) Read(buf []byte) (int, error) {
	if b.done {
		return 0, errors.New("consulstore: read of a closed answer body")
	}
	n, err := b.body.Read(buf)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *poolBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	if !b.eof && b.keep {
		if n, err := io.CopyN(io.Discard, b.body, maxDrain+1); err == io.EOF && n <= maxDrain {
			b.eof = true
		}
	}
	if b.eof {
		_ = b.body.Close() // (before the end, it would read on to it)
	}
	if b.stop() && b.eof && b.keep {
		b.p.putIdle(b.pc)
	} else {
		_ = b.pc.nc.Close()
	}
	b.p.tokens <- struct{}{}
	return nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
