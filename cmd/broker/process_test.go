package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/pause"
)

// vanishedClientBound is the promise: a client that stops answering (its
// machine dead, partitioned, or SIGSTOPped) loses its broker-owned hold in
// Consul within 20 s, through the server keepalive.
const vanishedClientBound = 20 * time.Second

// TestStoppedClientReleased runs a client process that holds a lock
// through a broker process, SIGSTOPs the client, and reads the key in
// Consul (consistent) until nobody holds it: the server keepalive must
// notice the silent client and the broker release its hold within 20 s.
func TestStoppedClientReleased(t *testing.T) {
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent)
	const key = "keepalive/stopped-client"

	self, err := os.Executable()
	require.NoError(t, err)
	holder := exec.Command(self, "-test.run=^$")
	holder.Env = append(os.Environ(), roleEnv+"=holder", "BROKER_TEST_ADDR="+p.Addr, "BROKER_TEST_KEY="+key)
	holder.Stderr = os.Stderr
	out, err := holder.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, holder.Start())
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = holder.Process.Signal(syscall.SIGCONT)
		_ = holder.Process.Kill()
		<-exited
	})
	lines := make(chan string, 1)
	go func() {
		defer close(exited)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		_ = holder.Wait()
		close(lines)
	}()
	var session string
	select {
	case line := <-lines:
		session = strings.TrimPrefix(line, "acquired ")
	case <-time.After(30 * time.Second):
		t.Fatal("the holder process did not acquire the lock within 30s")
	}
	require.NotEmpty(t, session)
	kv := agent.Client().KV()
	holderOf := func() string {
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		if e == nil {
			return ""
		}
		return e.Session
	}
	require.Equal(t, session, holderOf())

	require.NoError(t, pause.Stop(holder.Process.Pid))
	stopped := time.Now()
	require.Eventually(t, func() bool { return holderOf() == "" }, vanishedClientBound, 100*time.Millisecond,
		"the stopped client's hold must be released within %v", vanishedClientBound)
	t.Logf("stopped client's hold released in Consul %v after SIGSTOP", time.Since(stopped).Round(100*time.Millisecond))
	// The broker-owned session holds nothing any more: it is destroyed, or
	// (default options) back in the broker's session pool, with nothing
	// acquired and nothing recorded for it.
	pairs, _, err := kv.List("", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	for _, p := range pairs {
		if p.Key != "lockbroker/sessions/"+session {
			assert.NotEqual(t, session, p.Session, "the stopped client's session still holds %s", p.Key)
		} else {
			assert.NotContains(t, string(p.Value), key, "the session's record still lists the key")
		}
	}
}

// TestDrainBounded opens, on a broker process, a holder that reads its
// stream and a client that never reads (an Acquire stream and a Watch of a
// key whose 250 KiB value overflows the stream's flow-control window, so
// the broker's Send blocks), then sends SIGTERM: health is NOT_SERVING at
// once, the reading holder is told `lost: BROKER_SHUTDOWN`, and the process
// exits 0 within --drain-timeout + 2 s, having released the hold nobody
// resumed.
func TestDrainBounded(t *testing.T) {
	const drain = 4 * time.Second
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent, brokertest.WithFlags("--drain-timeout", drain.String()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	good := dial(t, p.Addr)
	holdStream, err := lockbrokerv1.NewLockServiceClient(good).Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "drain/held", Value: make([]byte, 250<<10)})
	require.NoError(t, err)
	first, err := holdStream.Recv()
	require.NoError(t, err)
	require.NotNil(t, first.GetAcquired(), "want acquired, got %v", first)

	// The client that never reads: its streams are opened and left alone.
	stuck := dial(t, p.Addr)
	_, err = lockbrokerv1.NewLockServiceClient(stuck).Watch(ctx, &lockbrokerv1.WatchRequest{Key: "drain/held"})
	require.NoError(t, err)
	_, err = lockbrokerv1.NewLockServiceClient(stuck).Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "drain/stuck"})
	require.NoError(t, err)

	// Health as an orchestrator sees it: a health Watch opened before the
	// signal, and /healthz.
	hw, err := healthpb.NewHealthClient(good).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	hs, err := hw.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hs.GetStatus())
	require.Equal(t, http.StatusOK, healthz(t, p.HTTPAddr))
	metrics := get(t, "http://"+p.HTTPAddr+"/metrics")
	for _, m := range []string{"lockbroker_consul_blocking_queries", `lockbroker_consul_requests_total{op="kv_txn_write",result="ok"}`, "grpc_server_handled_total"} {
		assert.Contains(t, metrics, m)
	}
	time.Sleep(500 * time.Millisecond) // let the Watch's first Send fill the window

	p.Signal(syscall.SIGTERM)
	signalled := time.Now()
	hs, err = hw.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, hs.GetStatus())
	notServing := time.Since(signalled)
	assert.Equal(t, http.StatusServiceUnavailable, healthz(t, p.HTTPAddr), "/healthz during the drain")
	assert.Less(t, notServing, time.Second, "health must turn NOT_SERVING at once")

	for {
		resp, err := holdStream.Recv()
		require.NoError(t, err, "the holder must be told before its stream ends")
		if l := resp.GetLost(); l != nil {
			assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN, l.GetReason())
			break
		}
	}

	select {
	case <-p.Done():
	case <-time.After(drain + 2*time.Second):
		t.Fatalf("broker still running %v after SIGTERM (--drain-timeout %v)", time.Since(signalled).Round(time.Millisecond), drain)
	}
	took := time.Since(signalled)
	assert.Equal(t, 0, p.ExitCode())
	// Nobody resumed the hold: the drain released it before the exit.
	e, _, err := agent.Client().KV().Get("drain/held", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	if e != nil {
		assert.Empty(t, e.Session, "the hold nobody resumed must be released by the drain")
	}
	t.Logf("NOT_SERVING %v after SIGTERM; exited %v after SIGTERM (--drain-timeout %v)",
		notServing.Round(time.Millisecond), took.Round(time.Millisecond), drain)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get returns the body of a GET of url.
func get(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// healthz returns the HTTP status of GET /healthz, or 0 when it does not
// answer.
func healthz(t *testing.T, addr string) int {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
