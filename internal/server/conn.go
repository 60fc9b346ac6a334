package server

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// A hold's stream that ends because its connection was lost is kept until
// the last deadline promised to the client (it may be resuming); one the
// client cancelled is released at once (see internal/broker/link.go).
// TrackConns is how the server tells them apart: it wraps the listener the
// gRPC server serves, and each accepted connection is registered, by its
// local and remote address, until it is closed. Each hold's stream links
// itself to its connection (withConnGone) until its context ends.
//
// gRPC closes a connection before it cancels the connection's streams,
// and cancels a stream the client reset (RST_STREAM) as it reads the
// reset, before it reads on. So when the connection is closed, a linked
// stream whose context has not ended yet is being lost with it, and one
// whose context has ended was cancelled by its client first, even if the
// client closed the connection right after (a process that cancels and
// exits). The decision is taken then, in Close, not when the hold gets
// round to asking: a hold that asked after both had happened could not
// tell them apart.

// TrackConns wraps lis so that holds can tell a lost connection from a
// cancel. Serve the gRPC server on the returned listener.
func TrackConns(lis net.Listener) net.Listener { return &trackingListener{Listener: lis} }

var conns sync.Map // connKey → *trackedConn

func connKey(local, remote net.Addr) string {
	if local == nil || remote == nil {
		return ""
	}
	return local.Network() + " " + local.String() + " " + remote.String()
}

type trackingListener struct{ net.Listener }

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	t := &trackedConn{Conn: c, key: connKey(c.LocalAddr(), c.RemoteAddr())}
	if sc, ok := c.(syscall.Conn); ok {
		t.raw, _ = sc.SyscallConn()
	}
	if _, dup := conns.LoadOrStore(t.key, t); dup || t.key == "" {
		// Addresses that do not tell connections apart (unix sockets):
		// such streams are treated as cancelled when they end.
		t.key = ""
	}
	return t, nil
}

type trackedConn struct {
	net.Conn
	raw syscall.RawConn // nil when the connection has no file descriptor
	key string

	mu     sync.Mutex
	closed bool
	links  map[*streamLink]struct{} // the linked streams whose context has not ended
}

// A streamLink is one stream's tie to its connection: lost is closed if the
// connection is closed while the stream's context is still live.
type streamLink struct {
	ctx  context.Context
	lost chan struct{}
}

// link ties the stream with context ctx to c and returns the channel that
// closes if c is lost under it.
func (c *trackedConn) link(ctx context.Context) <-chan struct{} {
	l := &streamLink{ctx: ctx, lost: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed { // the stream's context ends with the connection's close
		close(l.lost)
		return l.lost
	}
	if c.links == nil {
		c.links = make(map[*streamLink]struct{})
	}
	c.links[l] = struct{}{}
	context.AfterFunc(ctx, func() {
		c.mu.Lock()
		delete(c.links, l)
		c.mu.Unlock()
	})
	return l.lost
}

// ReadOnReady waits until data has arrived, then reads it into a buffer
// from pool. gRPC reads a connection that has it so that an idle one holds
// no read buffer (the optional net.Conn interface of gRPC's
// internal/transport/readyreader); gRPC does the same for a bare
// *net.TCPConn, which this wrapper hides from it. Without it every
// connection kept a 32 KiB read buffer for its whole life: 28 MiB of the
// broker's heap with 1,000 client connections (TestScale -scale.conns
// 1000).
func (c *trackedConn) ReadOnReady(size int, pool mem.BufferPool) (*[]byte, int, error) {
	if c.raw == nil {
		buf := pool.Get(size)
		n, err := c.Conn.Read(*buf)
		if n == 0 {
			pool.Put(buf)
			return nil, 0, err
		}
		return buf, n, err
	}
	var (
		buf     *[]byte
		n       int
		readErr error
	)
	err := c.raw.Read(func(fd uintptr) bool {
		buf = pool.Get(size)
		n, readErr = syscall.Read(int(fd), *buf)
		if readErr != nil {
			pool.Put(buf)
			buf = nil
		}
		return !errors.Is(readErr, syscall.EAGAIN)
	})
	switch {
	case err != nil: // closed, or a deadline passed
		if buf != nil {
			pool.Put(buf)
		}
		return nil, 0, err
	case readErr != nil:
		return nil, 0, readErr
	case n == 0: // the peer closed its side
		pool.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}

func (c *trackedConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		if c.key != "" {
			conns.CompareAndDelete(c.key, c)
		}
		for l := range c.links {
			if l.ctx.Err() == nil { // not cancelled before: lost with c
				close(l.lost)
			}
		}
		c.links = nil
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// withConnGone links a stream to its connection and gives the stream's
// context the channel that closes if the connection is lost under it
// (unchanged when the connection is not tracked).
func withConnGone(ctx context.Context) context.Context {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx
	}
	v, ok := conns.Load(connKey(p.LocalAddr, p.Addr))
	if !ok {
		return ctx
	}
	return broker.WithConnGone(ctx, v.(*trackedConn).link(ctx))
}
