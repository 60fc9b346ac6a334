package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
)

var _ mem.BufferPool = (*countingPool)(nil)

// countingPool is a mem.BufferPool that counts what is out.
type countingPool struct{ out atomic.Int64 }

func (p *countingPool) Get(n int) *[]byte {
	p.out.Add(1)
	b := make([]byte, n)
	return &b
}

func (p *countingPool) Put(*[]byte) { p.out.Add(-1) }

// acceptTracked is a connected pair: the accepted side through
// TrackConns, and the dialled side.
func acceptTracked(t *testing.T) (*trackedConn, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	peer, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	c, err := TrackConns(lis).Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = peer.Close() })
	return c.(*trackedConn), peer
}

// TestTrackedConnReadOnReady: the read gRPC makes on a tracked connection
// waits for data before it takes a buffer, returns what arrived, and ends
// with io.EOF when the peer closes and with an error when the connection
// is closed under it; no buffer stays out of the pool in any case. A
// connection without a file descriptor (none of the broker's listeners
// gives one today) is read with a plain read into a pooled buffer.
func TestTrackedConnReadOnReady(t *testing.T) {
	t.Run("data, then EOF", func(t *testing.T) {
		c, peer := acceptTracked(t)
		require.NotNil(t, c.raw, "a TCP connection reads through its file descriptor")
		pool := &countingPool{}
		want := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB: several reads of 16 KiB
		go func() {
			_, _ = peer.Write(want)
			_ = peer.Close()
		}()
		assert.Equal(t, want, readOnReadyToEOF(t, c, pool))
		assert.Zero(t, pool.out.Load(), "buffers out of the pool")
	})

	t.Run("a connection without a descriptor", func(t *testing.T) {
		a, peer := net.Pipe()
		c := &trackedConn{Conn: a}
		t.Cleanup(func() { _ = c.Close(); _ = peer.Close() })
		pool := &countingPool{}
		want := bytes.Repeat([]byte("0123456789abcdef"), 1024)
		go func() {
			_, _ = peer.Write(want)
			_ = peer.Close()
		}()
		assert.Equal(t, want, readOnReadyToEOF(t, c, pool))
		assert.Zero(t, pool.out.Load(), "buffers out of the pool")
	})

	t.Run("closed while it waits", func(t *testing.T) {
		c, _ := acceptTracked(t)
		pool := &countingPool{}
		errc := make(chan error, 1)
		go func() {
			_, _, err := c.ReadOnReady(1024, pool)
			errc <- err
		}()
		time.Sleep(50 * time.Millisecond)
		assert.Zero(t, pool.out.Load(), "no buffer is taken before data arrives")
		require.NoError(t, c.Close())
		select {
		case err := <-errc:
			require.True(t, errors.Is(err, net.ErrClosed), "%v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("the read did not end when the connection closed")
		}
		assert.Zero(t, pool.out.Load())
	})

	t.Run("a deadline ends it", func(t *testing.T) {
		c, _ := acceptTracked(t)
		pool := &countingPool{}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
		_, n, err := c.ReadOnReady(1024, pool)
		assert.Zero(t, n)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
		assert.Zero(t, pool.out.Load())
	})
}

// TestStreamLinks: closing a connection marks lost the linked streams
// whose context is still live, and only those: a stream cancelled before
// the close (a client that cancels, then exits) is not lost, however soon
// after the close its hold asks. A stream linked after the close is lost;
// a stream whose context ends is unlinked.
func TestStreamLinks(t *testing.T) {
	isClosed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	c, _ := acceptTracked(t)
	liveCtx, stop := context.WithCancel(context.Background())
	defer stop()
	live := c.link(liveCtx)
	cancelledCtx, cancel := context.WithCancel(context.Background())
	cancelled := c.link(cancelledCtx)
	endedCtx, end := context.WithCancel(context.Background())
	ended := c.link(endedCtx)
	end()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.links) == 2
	}, 5*time.Second, time.Millisecond, "a stream whose context ended stays linked")
	assert.False(t, isClosed(live) || isClosed(cancelled) || isClosed(ended), "lost before the connection closed")

	cancel() // then close at once, before the link is dropped
	require.NoError(t, c.Close())
	assert.True(t, isClosed(live), "a live stream is not lost with its connection")
	assert.False(t, isClosed(cancelled), "a stream cancelled before the close is lost with it")
	assert.False(t, isClosed(ended))
	assert.True(t, isClosed(c.link(context.Background())), "a stream linked after the close is not lost")
	_ = c.Close() // a second close closes no channel twice
}

// readOnReadyToEOF reads c as gRPC does, in reads of 16 KiB, until
// io.EOF, and returns what came; each buffer goes back to pool.
func readOnReadyToEOF(t *testing.T, c *trackedConn, pool mem.BufferPool) []byte {
	t.Helper()
	var got []byte
	for {
		buf, n, err := c.ReadOnReady(16<<10, pool)
		if n > 0 {
			got = append(got, (*buf)[:n]...)
			pool.Put(buf)
		}
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			return got
		}
		require.Positive(t, n)
	}
}

// TestIdleConnectionsHoldNoReadBuffer: gRPC connections served through
// TrackConns hold no read buffer while they wait, as bare TCP connections
// do not in gRPC. Every allocation is recorded (MemProfileRate 1), and
// none of gRPC's buffered readers may still be live with streams open and
// idle.
func TestIdleConnectionsHoldNoReadBuffer(t *testing.T) {
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = rate }()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	served := make(chan struct{})
	go func() { defer close(served); _ = g.Serve(TrackConns(lis)) }()
	defer func() { g.Stop(); <-served }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const conns = 20
	for range conns {
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer cc.Close()
		st, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = st.Recv()
		require.NoError(t, err)
	}
	time.Sleep(100 * time.Millisecond) // the server's reads are back waiting
	runtime.GC()
	runtime.GC() // the profile shows the heap as of the last completed cycle

	recs := make([]runtime.MemProfileRecord, 4096)
	n, ok := runtime.MemProfile(recs, false)
	for !ok {
		recs = make([]runtime.MemProfileRecord, n+1024)
		n, ok = runtime.MemProfile(recs, false)
	}
	var live, liveBytes int64
	for _, r := range recs[:n] {
		if r.InUseObjects() == 0 {
			continue
		}
		frames := runtime.CallersFrames(r.Stack())
		var stack []string
		for {
			f, more := frames.Next()
			stack = append(stack, f.Function)
			if !more {
				break
			}
		}
		s := strings.Join(stack, " < ")
		if strings.Contains(s, "bufio.NewReaderSize") && strings.Contains(s, "grpc/internal/transport.newFramer") {
			live += r.InUseObjects()
			liveBytes += r.InUseBytes()
			t.Logf("live: %d objects, %d bytes: %s", r.InUseObjects(), r.InUseBytes(), s)
		}
	}
	assert.Zero(t, live, "gRPC read buffers live with %d idle connections: %d bytes", conns, liveBytes)
}
