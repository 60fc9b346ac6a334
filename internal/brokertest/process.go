package brokertest

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

	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/pause"
)

const (
	readyTimeout   = 90 * time.Second // Consul start (--dev) + broker start, build excluded
	terminateGrace = 20 * time.Second // SIGTERM → SIGKILL in Terminate and the cleanup
	launchAttempts = 3                // launches tried when a picked port was taken
	tailLines      = 40               // broker output lines quoted on failure
	// defaultDrain is the --drain-timeout the harness passes unless the
	// test passes its own: a test's broker stops within seconds.
	defaultDrain = "3s"
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
		cmd := exec.Command("go", "build", "-o", buildPath, "github.com/lockbroker/lockbroker/cmd/broker")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// ProcessOption configures a broker process.
type ProcessOption func(*processConfig)

type processConfig struct {
	flags []string
	env   []string
}

// WithFlags passes extra command-line flags to the broker, after the
// harness's own (--listen, --http-listen, --drain-timeout 3s, ...), so they
// may override them.
func WithFlags(flags ...string) ProcessOption {
	return func(c *processConfig) { c.flags = append(c.flags, flags...) }
}

// WithEnv adds KEY=VALUE variables to the broker's environment.
func WithEnv(kv ...string) ProcessOption {
	return func(c *processConfig) { c.env = append(c.env, kv...) }
}

// Process is a broker running as a child process, in a process group of
// its own (with --dev, its Consul agent is in it too). The test can pause
// it (Stop, Cont), crash it (Kill) or stop it as an orchestrator does
// (Terminate). The test's cleanup ends whatever is left.
type Process struct {
	// Addr is the gRPC address, HTTPAddr the /metrics and /healthz
	// address, ConsulAddr the HTTP address of its Consul agent.
	Addr, HTTPAddr, ConsulAddr string
	// LogPath is the file holding the broker's stdout and stderr.
	LogPath string

	t         testing.TB
	cmd       *exec.Cmd
	done      chan struct{} // closed once the process has exited
	transport *http.Transport
}

// StartProcess runs the broker binary against agent and waits until it
// reports SERVING. The test's cleanup stops it (SIGCONT, SIGTERM, then
// SIGKILL to its group).
func StartProcess(t testing.TB, agent *consultest.Agent, opts ...ProcessOption) *Process {
	t.Helper()
	return start(t, agent.HTTPAddr(), opts)
}

// StartProcessAt is StartProcess with the Consul agent at consulAddr
// (host:port), such as a proxy in front of an agent that a test cuts.
func StartProcessAt(t testing.TB, consulAddr string, opts ...ProcessOption) *Process {
	t.Helper()
	return start(t, consulAddr, opts)
}

// StartDev runs `broker --dev`, which starts and supervises a Consul dev
// agent from bin/consul, on free loopback ports, and waits until it reports
// SERVING. Use it for tests that need one broker and nothing else; use
// StartProcess with a consultest agent to share Consul between replicas or
// to stop Consul.
func StartDev(t testing.TB, opts ...ProcessOption) *Process {
	t.Helper()
	return start(t, "", opts)
}

// start launches a broker (on consulAddr, or --dev when it is empty),
// retrying with fresh ports when a picked port was taken in between.
func start(t testing.TB, consulAddr string, opts []ProcessOption) *Process {
	t.Helper()
	var cfg processConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := BrokerBinary(t)
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		p, err := launch(t, bin, consulAddr, cfg, filepath.Join(dir, fmt.Sprintf("broker-%d.log", attempt)))
		if err == nil {
			return p
		}
		out := tail(p.LogPath, tailLines)
		if attempt == launchAttempts || !strings.Contains(out, "address already in use") {
			t.Fatalf("brokertest: %v\nlast broker output (%s):\n%s", err, p.LogPath, out)
		}
	}
}

// launch starts one broker process and waits for it to be SERVING. On
// error the process is gone and p is still returned for its log.
func launch(t testing.TB, bin, consulAddr string, cfg processConfig, logPath string) (*Process, error) {
	ports, err := freePorts(3)
	if err != nil {
		return &Process{LogPath: logPath}, err
	}
	p := &Process{
		Addr:       fmt.Sprintf("127.0.0.1:%d", ports[0]),
		HTTPAddr:   fmt.Sprintf("127.0.0.1:%d", ports[1]),
		ConsulAddr: consulAddr,
		LogPath:    logPath,
		t:          t,
		done:       make(chan struct{}),
		transport:  &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
	}
	args := []string{"--listen", p.Addr, "--http-listen", p.HTTPAddr, "--drain-timeout", defaultDrain}
	env := append(os.Environ(), cfg.env...)
	if consulAddr == "" {
		p.ConsulAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
		args = append(args, "--dev", "--dev-consul-http", p.ConsulAddr)
	} else {
		env = append(env, "CONSUL_HTTP_ADDR="+consulAddr, "CONSUL_HTTP_TOKEN=")
	}
	log, err := os.Create(logPath)
	if err != nil {
		return p, err
	}
	defer log.Close() // the child has its own copy of the descriptor
	p.cmd = exec.Command(bin, append(args, cfg.flags...)...)
	p.cmd.Dir = RepoRoot(t) // where --dev finds bin/consul
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return p, err
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	if err := p.waitServing(); err != nil {
		p.Kill()
		return p, err
	}
	t.Cleanup(func() {
		p.cleanup()
		if t.Failed() {
			t.Logf("brokertest: last output of broker %s (full log %s):\n%s", p.Addr, p.LogPath, tail(p.LogPath, tailLines))
		}
	})
	return p, nil
}

// waitServing polls the gRPC health service until it answers SERVING, the
// process exits, or readyTimeout passes.
func (p *Process) waitServing() error {
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
		case <-p.done:
			return fmt.Errorf("broker exited before it was serving: %v", p.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("broker at %s not SERVING after %v (last health answer: %s)", p.Addr, readyTimeout, last)
}

// Pid is the broker's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the broker process (not its group).
func (p *Process) Signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
}

// Stop pauses the broker with SIGSTOP: it answers nothing, renews nothing
// and sends nothing until Cont, as a stalled machine would. It returns once
// every thread of the broker has stopped (kill(2) returns before that, and
// a thread already running could still answer a request).
func (p *Process) Stop() {
	if err := pause.Stop(p.cmd.Process.Pid); err != nil {
		p.t.Errorf("brokertest: %v", err)
	}
}

// Cont resumes a broker paused by Stop (SIGCONT).
func (p *Process) Cont() { p.Signal(syscall.SIGCONT) }

// Kill SIGKILLs the broker and everything in its process group (a crash:
// no cleanup) and waits for it to exit.
func (p *Process) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Terminate sends SIGTERM, as an orchestrator does, and waits up to 20s for
// the process to exit; it returns an error unless it exited 0 in time (it
// is killed after 20s).
func (p *Process) Terminate() error {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.cmd.ProcessState.Success() {
			return nil
		}
		return fmt.Errorf("broker exited: %s", p.cmd.ProcessState)
	case <-time.After(terminateGrace):
		p.Kill()
		return fmt.Errorf("broker did not stop within %v of SIGTERM", terminateGrace)
	}
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode is the process's exit code (-1 if a signal ended it). Only valid
// once Done is closed.
func (p *Process) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// ConsulClient returns a client of the broker's Consul agent, for tests
// that act on Consul behind the broker's back (destroying a session, say).
func (p *Process) ConsulClient() *api.Client {
	c, err := api.NewClient(&api.Config{Address: p.ConsulAddr, Transport: p.transport})
	if err != nil {
		panic(fmt.Sprintf("brokertest: consul client for %s: %v", p.ConsulAddr, err)) // only on a malformed config
	}
	return c
}

// cleanup ends the process if it still runs: SIGCONT (it may be paused),
// SIGTERM, then SIGKILL to its group after terminateGrace.
func (p *Process) cleanup() {
	defer p.transport.CloseIdleConnections()
	select {
	case <-p.done:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // a --dev agent left behind
		return
	default:
	}
	p.Cont()
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(terminateGrace):
	}
	p.Kill()
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (start retries when one is taken in between).
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
