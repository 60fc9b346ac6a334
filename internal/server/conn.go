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
// local and remote address, until it is closed (gRPC closes the
// connection before it cancels the connection's streams).

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
	t := &trackedConn{Conn: c, gone: make(chan struct{}), key: connKey(c.LocalAddr(), c.RemoteAddr())}
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
	raw  syscall.RawConn // nil when the connection has no file descriptor
	key  string
	gone chan struct{}
	once sync.Once
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
	c.once.Do(func() {
		if c.key != "" {
			conns.CompareAndDelete(c.key, c)
		}
		close(c.gone)
	})
	return c.Conn.Close()
}

// withConnGone gives a stream's context the channel that closes when its
// connection ends (unchanged when the connection is not tracked).
func withConnGone(ctx context.Context) context.Context {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx
	}
	v, ok := conns.Load(connKey(p.LocalAddr, p.Addr))
	if !ok {
		return ctx
	}
	return broker.WithConnGone(ctx, v.(*trackedConn).gone)
}
