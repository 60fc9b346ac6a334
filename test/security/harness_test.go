package security

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// brokerProc is the broker binary running as a child process.
type brokerProc struct {
	Addr, HTTPAddr, LogPath string
	cmd                     *exec.Cmd
	done                    chan struct{}
}

// startBroker runs the broker binary with env and flags (after its
// --listen, --http-listen and --drain-timeout) and, when wait is set,
// waits until /healthz says SERVING. The test's cleanup stops it.
func startBroker(t *testing.T, wait bool, env []string, flags ...string) *brokerProc {
	t.Helper()
	bin := brokertest.BrokerBinary(t)
	ports := freePorts(t, 2)
	p := &brokerProc{
		Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		LogPath: filepath.Join(t.TempDir(), "broker.log"), done: make(chan struct{}),
	}
	log, err := os.Create(p.LogPath)
	require.NoError(t, err)
	defer log.Close()
	args := append([]string{"--listen", p.Addr, "--http-listen", p.HTTPAddr, "--drain-timeout", "2s", "--log-level", "debug"}, flags...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("broker log (%s):\n%s", p.LogPath, tail(p.LogPath, 40))
		}
	})
	if wait {
		deadline := time.Now().Add(60 * time.Second)
		for !p.serving() {
			select {
			case <-p.done:
				t.Fatalf("broker exited:\n%s", tail(p.LogPath, 40))
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("broker not SERVING after 60s:\n%s", tail(p.LogPath, 40))
			}
		}
	}
	return p
}

// serving reports whether /healthz answers 200.
func (p *brokerProc) serving() bool {
	resp, err := http.Get("http://" + p.HTTPAddr + "/healthz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// answering reports whether the broker's HTTP listener answers at all
// (its gRPC listener opens first).
func (p *brokerProc) answering() bool {
	resp, err := http.Get("http://" + p.HTTPAddr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

// hup sends SIGHUP.
func (p *brokerProc) hup(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
}

// logLines are the broker's JSON log lines so far.
func (p *brokerProc) logLines(t *testing.T) []map[string]any {
	t.Helper()
	f, err := os.Open(p.LogPath)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// cleanEnv is the test's environment without Consul's and the broker's
// variables, which the test sets itself.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONSUL_") && !strings.HasPrefix(kv, "LOCKBROKER_") {
			out = append(out, kv)
		}
	}
	return out
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// dial connects to addr over TLS verified by caFile, with a client
// certificate (nil: none) and a bearer token ("": none), through the Go
// client's DialOptions.
func dial(t *testing.T, addr, caFile string, cert *testpki.Pair, token string) *grpc.ClientConn {
	t.Helper()
	opts := []client.DialOption{client.WithCACert(caFile)}
	if cert != nil {
		c, k := cert.Write(t, t.TempDir(), "client")
		opts = append(opts, client.WithClientCert(c, k))
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	dopts, err := client.DialOptions(opts...)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, dopts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// errorInfo is err's google.rpc.ErrorInfo (nil if none).
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// requireStatus checks err's code and ErrorInfo reason.
func requireStatus(t *testing.T, err error, c codes.Code, reason string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, c, status.Code(err), "%v", err)
	info := errorInfo(err)
	require.NotNil(t, info, "%v", err)
	require.Equal(t, reason, info.GetReason(), "%v", err)
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
