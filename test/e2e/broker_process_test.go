package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func healthOf(t *testing.T, addr string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.GetStatus()
}

// TestDevMode runs `broker --dev` as `make run` does: it starts its own
// Consul, serves reflection, health and metrics, and SIGTERM stops both.
func TestDevMode(t *testing.T) {
	bin := brokertest.BrokerBinary(t)
	grpcAddr, httpAddr, consulAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "--dev", "--listen", grpcAddr, "--http-listen", httpAddr, "--dev-consul-http", consulAddr, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })

	require.Eventually(t, func() bool { return healthOf(t, grpcAddr) == healthpb.HealthCheckResponse_SERVING }, 60*time.Second, 100*time.Millisecond)

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	require.NoError(t, err)
	require.NoError(t, rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := rs.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	assert.Contains(t, names, "lockbroker.v1.LockService")
	assert.Contains(t, names, "lockbroker.v1.SessionService")
	require.NoError(t, rs.CloseSend())

	for _, path := range []string{"/metrics", "/healthz"} {
		r, err := http.Get("http://" + httpAddr + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		assert.Equal(t, http.StatusOK, r.StatusCode, path)
		if path == "/metrics" {
			assert.Contains(t, string(body), "lockbroker_consul_blocking_queries")
		}
	}
	r, err := http.Get("http://" + consulAddr + "/v1/status/leader")
	require.NoError(t, err)
	r.Body.Close()

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		done <- err
		assert.NoError(t, err, "broker should exit 0 on SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("broker did not stop within 20s of SIGTERM")
	}
	// The dev agent is gone with it.
	_, err = (&http.Client{Timeout: time.Second}).Get("http://" + consulAddr + "/v1/status/leader")
	assert.Error(t, err, "consul dev agent still answers after the broker stopped")
}

func TestDevModeWithoutConsulBinary(t *testing.T) {
	bin := brokertest.BrokerBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--dev", "--consul-bin", "/nonexistent/consul", "--listen", freeAddr(t), "--http-listen", freeAddr(t), "--dev-consul-http", freeAddr(t)).CombinedOutput()
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "broker hung instead of failing")
	assert.Contains(t, string(out), "consul")
	assert.True(t, strings.Contains(string(out), "/nonexistent/consul"), "%s", out)
}

// TestHealthFollowsConsul: NOT_SERVING within a few seconds of Consul
// stopping, SERVING again when it is back.
func TestHealthFollowsConsul(t *testing.T) {
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthOf(t, p.Addr))
	agent.Stop()
	start := time.Now()
	require.Eventually(t, func() bool { return healthOf(t, p.Addr) == healthpb.HealthCheckResponse_NOT_SERVING }, 10*time.Second, 100*time.Millisecond)
	t.Logf("NOT_SERVING %s after Consul stopped", time.Since(start).Round(time.Millisecond))
	agent.Restart()
	require.Eventually(t, func() bool { return healthOf(t, p.Addr) == healthpb.HealthCheckResponse_SERVING }, 10*time.Second, 100*time.Millisecond)
	require.NoError(t, p.Terminate())
}
