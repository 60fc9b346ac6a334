package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestCancelAndExitReleasesAtOnce: a client that cancels its held stream
// and closes its connection with nothing in between (a process that gives
// up and exits: the RST_STREAM and the FIN leave back to back) gave the
// hold up, and the next waiter gets the key at once, every time. The
// broker reads the reset before the end of the connection, however soon
// after the reset the end comes; a hold that mistook it for a lost
// connection would be kept for its promise (up to 14.5 s).
//
// The client is a minimal HTTP/2 client over a raw TCP connection, so that
// the reset is written before the close by construction (a gRPC client's
// Close may drop a reset still queued).
func TestCancelAndExitReleasesAtOnce(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	const rounds = 30
	var worst time.Duration
	for i := range rounds {
		key := fmt.Sprintf("linger/cancel-exit/%d", i)
		h := dialRawAcquire(t, r.Addr, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		h.awaitAcquired(t, 5*time.Second)
		waiter := acquire(t, r.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		waiter.next(5*time.Second, isQueued)
		start := time.Now()
		h.resetAndClose(t)
		waiter.acquired(5 * time.Second)
		took := time.Since(start)
		worst = max(worst, took)
		require.Less(t, took, 2*time.Second, "round %d: the waiter got the key %s after the holder cancelled and exited", i, took)
		waiter.cancel()
	}
	t.Logf("%d rounds: the waiter got the key at most %s after the holder cancelled and exited", rounds, worst)
}

// rawAcquire is one Acquire stream (id 1) on a raw HTTP/2 connection.
type rawAcquire struct {
	conn net.Conn
	fr   *http2.Framer
}

func dialRawAcquire(t *testing.T, addr string, req *lockbrokerv1.AcquireRequest) *rawAcquire {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	h := &rawAcquire{conn: conn, fr: http2.NewFramer(conn, conn)}
	_, err = conn.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	require.NoError(t, h.fr.WriteSettings())
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/" + lockbrokerv1.LockService_ServiceDesc.ServiceName + "/Acquire"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	require.NoError(t, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr.Bytes(), EndHeaders: true}))
	msg, err := proto.Marshal(req)
	require.NoError(t, err)
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	require.NoError(t, h.fr.WriteData(1, true, append(framed, msg...))) // the request, and the half-close
	return h
}

// awaitAcquired reads the connection until the stream's acquired event,
// answering the server's settings and pings on the way.
func (h *rawAcquire) awaitAcquired(t *testing.T, timeout time.Duration) {
	t.Helper()
	require.NoError(t, h.conn.SetReadDeadline(time.Now().Add(timeout)))
	defer func() { _ = h.conn.SetReadDeadline(time.Time{}) }()
	var data []byte
	for {
		f, err := h.fr.ReadFrame()
		require.NoError(t, err, "waiting for acquired")
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, h.fr.WriteSettingsAck())
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				require.NoError(t, h.fr.WritePing(true, f.Data))
			}
		case *http2.HeadersFrame:
			require.False(t, f.StreamEnded(), "the stream ended before acquired")
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			t.Fatalf("the stream ended before acquired: %v", f)
		case *http2.DataFrame:
			data = append(data, f.Data()...)
			for len(data) >= 5 {
				n := int(binary.BigEndian.Uint32(data[1:5]))
				if len(data) < 5+n {
					break
				}
				var resp lockbrokerv1.AcquireResponse
				require.NoError(t, proto.Unmarshal(data[5:5+n], &resp))
				data = data[5+n:]
				if resp.GetAcquired() != nil {
					return
				}
			}
		}
	}
}

// resetAndClose cancels the stream and closes the connection right after:
// the reset is in the kernel's send buffer, ahead of the FIN, when the
// close begins.
func (h *rawAcquire) resetAndClose(t *testing.T) {
	t.Helper()
	assert.NoError(t, h.fr.WriteRSTStream(1, http2.ErrCodeCancel))
	assert.NoError(t, h.conn.Close())
}
