package brokertest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// BrokerBinary builds cmd/broker once per test binary and returns its path.
func BrokerBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lockbroker-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "broker")
		out, err := exec.Command("go", "build", "-o", buildPath, "github.com/lockbroker/lockbroker/cmd/broker").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// Process is a broker running as a child process.
type Process struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// StartProcess runs the broker binary against agent and waits until it
// reports SERVING. The test's cleanup kills it.
func StartProcess(t testing.TB, agent *consultest.Agent) *Process {
	t.Helper()
	bin := BrokerBinary(t)
	p := &Process{Addr: freeAddr(t), done: make(chan struct{})}
	p.cmd = exec.Command(bin, "--listen", p.Addr, "--http-listen", freeAddr(t), "--log-level", "warn")
	p.cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+agent.HTTPAddr(), "CONSUL_HTTP_TOKEN=")
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Kill)
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("broker at %s did not become SERVING", p.Addr)
	return nil
}

// Kill SIGKILLs the broker (a crash: no cleanup) and waits for it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Terminate sends SIGTERM and waits up to 15s for a clean exit.
func (p *Process) Terminate() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.cmd.ProcessState.Success() {
			return nil
		}
		return fmt.Errorf("broker exited: %s", p.cmd.ProcessState)
	case <-time.After(15 * time.Second):
		p.Kill()
		return fmt.Errorf("broker did not stop within 15s")
	}
}
