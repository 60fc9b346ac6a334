// Package testbroker runs a real lockbroker for end-to-end tests: it builds
// cmd/broker, starts it with --dev (which runs a Consul dev agent from
// bin/consul) on free loopback ports, waits until its gRPC health check
// says SERVING, and stops it when the test ends.
package testbroker

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const (
	readyTimeout = 90 * time.Second // build excluded: Consul start + broker start
	stopGrace    = 15 * time.Second // SIGTERM → SIGKILL
	attempts     = 3                // launches tried when a picked port was taken
	tailLines    = 40               // broker output lines quoted on failure
)

// Broker is a running `broker --dev` owned by one test.
type Broker struct {
	addr, httpAddr, consulAddr string
	logPath                    string
	cmd                        *exec.Cmd
	done                       chan struct{} // closed once the process has exited
	transport                  *http.Transport
	stopOnce                   sync.Once
}

// Start builds and starts a broker for t and registers its Stop with
// t.Cleanup; if the test failed, the cleanup also logs the broker's last
// output lines. It calls t.Fatal when the broker does not become SERVING
// within 90s.
func Start(t testing.TB) *Broker {
	t.Helper()
	bin := Build(t, "./cmd/broker", "broker")
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		b, err := launch(t, bin, filepath.Join(dir, fmt.Sprintf("broker-%d.log", attempt)))
		if err == nil {
			return b
		}
		if attempt == attempts || !strings.Contains(tail(b.logPath, tailLines), "address already in use") {
			t.Fatalf("testbroker: %v\nlast broker output (%s):\n%s", err, b.logPath, tail(b.logPath, tailLines))
		}
	}
}

// launch starts one broker process and waits for it to be SERVING. On
// error the process is stopped and b is still returned for its log.
func launch(t testing.TB, bin, logPath string) (*Broker, error) {
	ports, err := freePorts(3)
	if err != nil {
		return &Broker{logPath: logPath}, err
	}
	b := &Broker{
		addr:       fmt.Sprintf("127.0.0.1:%d", ports[0]),
		httpAddr:   fmt.Sprintf("127.0.0.1:%d", ports[1]),
		consulAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]),
		logPath:    logPath,
		done:       make(chan struct{}),
		transport:  &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
	}
	log, err := os.Create(logPath)
	if err != nil {
		return b, err
	}
	defer log.Close() // the child has its own copy of the descriptor
	b.cmd = exec.Command(bin, "--dev", "--listen", b.addr, "--http-listen", b.httpAddr, "--dev-consul-http", b.consulAddr)
	b.cmd.Dir = RepoRoot(t) // where --dev finds bin/consul
	b.cmd.Stdout, b.cmd.Stderr = log, log
	b.cmd.SysProcAttr = sysProcAttr()
	if err := b.cmd.Start(); err != nil {
		return b, err
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.done)
	}()
	if err := b.waitServing(); err != nil {
		b.Stop()
		return b, err
	}
	t.Cleanup(func() {
		b.Stop()
		if t.Failed() {
			t.Logf("testbroker: last output of broker %s (full log %s):\n%s", b.addr, b.logPath, tail(b.logPath, tailLines))
		}
	})
	return b, nil
}

// waitServing polls the standard gRPC health service until it answers
// SERVING, the process exits, or readyTimeout passes.
func (b *Broker) waitServing() error {
	conn, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(readyTimeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		last = fmt.Sprint(resp.GetStatus(), err)
		select {
		case <-b.done:
			return fmt.Errorf("broker exited before it was serving: %v", b.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("broker at %s not SERVING after %v (last health answer: %s)", b.addr, readyTimeout, last)
}

// Addr is the broker's gRPC address (host:port).
func (b *Broker) Addr() string { return b.addr }

// HTTPAddr is the broker's metrics and health HTTP address (host:port).
func (b *Broker) HTTPAddr() string { return b.httpAddr }

// ConsulAddr is the HTTP address (host:port) of the broker's Consul agent.
func (b *Broker) ConsulAddr() string { return b.consulAddr }

// ConsulClient returns a client of the broker's Consul agent, for tests that
// act on Consul behind the broker's back (destroying a session, say).
func (b *Broker) ConsulClient() *api.Client {
	c, err := api.NewClient(&api.Config{Address: b.consulAddr, Transport: b.transport})
	if err != nil {
		panic(fmt.Sprintf("testbroker: consul client for %s: %v", b.consulAddr, err)) // only on a malformed config
	}
	return c
}

// Stop stops the broker: SIGTERM, then SIGKILL to its process group after
// 15s, and waits for it to exit. It is idempotent and safe to call before
// the test's cleanup.
func (b *Broker) Stop() {
	b.stopOnce.Do(func() {
		defer b.transport.CloseIdleConnections()
		if b.cmd == nil || b.cmd.Process == nil {
			return
		}
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
			<-b.done
		}
	})
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (Start retries when one is taken in between).
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
