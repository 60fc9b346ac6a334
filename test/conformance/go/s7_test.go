package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/tenant"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// testS7: a broker serving TLS with a tenants file that knows one bearer
// token. The client with the CA and the token locks and releases; without
// the token it gets UNAUTHENTICATED; with another CA it cannot connect.
func testS7(t *testing.T) {
	agent := consultest.Start(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, "conformance CA")
	caFile := ca.WriteCA(t, dir, "ca.pem")
	certFile, keyFile := ca.Server(t, "broker").Write(t, dir, "broker")
	otherCA := testpki.NewCA(t, "another CA").WriteCA(t, dir, "other-ca.pem")
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	tenants := filepath.Join(dir, "tenants.yaml")
	require.NoError(t, os.WriteFile(tenants, []byte(fmt.Sprintf(
		"tenants:\n  - name: conformance\n    identities: [%q]\n    prefixes: [\"conformance/\"]\n", tenant.TokenIdentity(token))), 0o600))
	addr := startSecureBroker(t, agent, "--tls-cert", certFile, "--tls-key", keyFile, "--tenants", tenants)
	key := testKey(t)

	connect := func(opts ...client.DialOption) *client.Client {
		t.Helper()
		dopts, err := client.DialOptions(opts...)
		require.NoError(t, err)
		conn, err := grpc.NewClient(addr, dopts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return client.New(conn)
	}
	bounded := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	// TLS (the CA) and the token: lock and release.
	c := connect(client.WithCACert(caFile), client.WithToken(token))
	lease, err := c.Lock(bounded(), key, client.WithValue([]byte("s7")))
	require.NoError(t, err)
	assert.NotZero(t, lease.Sequencer().GetToken())
	require.NoError(t, lease.Release(bounded()))
	assert.Equal(t, client.ErrReleased, lease.Err())

	// TLS without the token: UNAUTHENTICATED.
	_, err = connect(client.WithCACert(caFile)).Lock(bounded(), key)
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "without the token: %v", err)
	t.Logf("S7 without the token: %v", err)

	// Another CA: the broker's certificate is refused, nothing connects.
	_, err = connect(client.WithCACert(otherCA), client.WithToken(token)).Lock(bounded(), key)
	assert.ErrorIs(t, err, client.ErrUnavailable, "with a wrong CA: %v", err)
	t.Logf("S7 with another CA: %v", err)
	st, err := c.GetLock(bounded(), key)
	require.NoError(t, err)
	assert.Empty(t, st.GetHolders(), "nothing was held through a refused connection")
}

// startSecureBroker runs the broker binary with flags (TLS, tenants)
// against agent and waits until /healthz on its HTTP port answers 200 (its
// gRPC port needs TLS, which brokertest's plaintext health check cannot
// speak). The test's cleanup stops it.
func startSecureBroker(t *testing.T, agent *consultest.Agent, flags ...string) string {
	t.Helper()
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	logPath := filepath.Join(t.TempDir(), "broker.log")
	log, err := os.Create(logPath)
	require.NoError(t, err)
	defer log.Close()
	cmd := exec.Command(brokertest.BrokerBinary(t), append([]string{"--listen", grpcAddr, "--http-listen", httpAddr, "--drain-timeout", "2s"}, flags...)...)
	cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+agent.HTTPAddr(), "CONSUL_HTTP_TOKEN=")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("broker log:\n%s", out)
		}
	})
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := hc.Get("http://" + httpAddr + "/healthz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return grpcAddr
			}
		}
		select {
		case <-done:
			out, _ := os.ReadFile(logPath)
			t.Fatalf("broker exited before serving:\n%s", out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("broker not serving after 60s")
		}
	}
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}
