package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lockbroker/lockbroker/internal/pause"
)

// Mutants the suite knows, and the build tag of each that lives in the
// broker (no-fencing lives in the clients and the resource).
var Mutants = map[string]string{
	"no-loss-notice":  "mutant_no_loss_notice",
	"no-fencing":      "",
	"no-resume-fence": "mutant_no_resume_fence",
	"no-shared-queue": "mutant_no_shared_queue",
	// Issue 43: read-write and multi-key locks.
	"rw-reader-beside-writer": "mutant_rw_reader_beside_writer",
	"rw-stale-token":          "mutant_rw_stale_token",
	"multi-partial":           "mutant_multi_partial",
}

// BuildBroker builds cmd/broker from the module at src into dir, with the
// race detector if race, and the build tags tags; it returns the binary.
func BuildBroker(ctx context.Context, src, dir string, race bool, tags string) (string, error) {
	name := "broker"
	if tags != "" {
		name += "-" + tags
	}
	if race {
		name += "-race"
	}
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/broker")...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "CGO_ENABLED="+map[bool]string{true: "1", false: "0"}[race])
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s (tags %q) in %s: %v\n%s", name, tags, src, err, b)
	}
	return out, nil
}

// Broker is one broker replica run as a child process, on fixed ports
// across restarts, talking to Consul through its own proxy.
type Broker struct {
	Index      int
	Addr       string // gRPC, direct (clients go through their own proxies)
	HTTPAddr   string
	ConsulAddr string // the proxy to its Consul server
	bin        string
	logPath    string
	shutdown   time.Duration

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{}
	paused      bool
	incarnation int
	rebinds     int
}

// NewBroker prepares replica i (not started).
func NewBroker(i int, bin, consulAddr, logDir string, shutdown time.Duration) (*Broker, error) {
	ports, err := freeTCPPorts(2)
	if err != nil {
		return nil, err
	}
	return &Broker{Index: i, bin: bin, ConsulAddr: consulAddr, shutdown: shutdown,
		Addr: ports[0], HTTPAddr: ports[1], logPath: filepath.Join(logDir, fmt.Sprintf("broker-%d.log", i))}, nil
}

// Name names the replica in faults and reports.
func (b *Broker) Name() string { return fmt.Sprintf("broker-%d", b.Index) }

// LogPath is the replica's log (every incarnation appended).
func (b *Broker) LogPath() string { return b.logPath }

// Start launches an incarnation and waits (at most 15s) until its gRPC
// port accepts connections, and then briefly for SERVING (which needs its
// Consul, possibly down on purpose: not waited for beyond 10s).
func (b *Broker) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return fmt.Errorf("%s already running", b.Name())
	}
	log, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	b.incarnation++
	fmt.Fprintf(log, "=== chaos: %s incarnation %d starting at %s\n", b.Name(), b.incarnation, time.Now().Format(time.RFC3339Nano))
	level := "warn"
	if v := os.Getenv("CHAOS_BROKER_LOG_LEVEL"); v != "" {
		level = v // debug, to replay a failing seed with the brokers' reasoning
	}
	cmd := exec.Command(b.bin, "--listen", b.Addr, "--http-listen", b.HTTPAddr, "--log-level", level,
		"--shutdown-timeout", b.shutdown.String())
	env := []string{"CONSUL_HTTP_ADDR=" + b.ConsulAddr, "GORACE=halt_on_error=0"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONSUL_") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.cmd, b.done, b.paused = cmd, done, false

	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			b.cmd = nil
			// Someone took a port between our probe and the bind (or since
			// the last incarnation). The metrics port may always move; the
			// gRPC port only before anything points at it.
			tail := tailFile(b.logPath)
			if i := strings.LastIndex(tail, "=== chaos: "); i >= 0 {
				tail = tail[i:] // this incarnation's output only
			}
			httpTaken := strings.Contains(tail, "--http-listen: listen") && strings.Contains(tail, "address already in use")
			grpcTaken := strings.Contains(tail, "--listen: listen") && strings.Contains(tail, "address already in use")
			if (httpTaken || grpcTaken && b.incarnation == 1) && b.rebinds < 3 {
				ports, err := freeTCPPorts(2)
				if err != nil {
					return err
				}
				b.HTTPAddr = ports[1]
				if grpcTaken {
					b.Addr = ports[0]
				}
				b.rebinds++
				b.mu.Unlock()
				defer b.mu.Lock()
				return b.Start(ctx)
			}
			return fmt.Errorf("%s exited at start: %s (see %s)", b.Name(), cmd.ProcessState, b.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not listen on %s after 15s", b.Name(), b.Addr)
		}
	}
	b.rebinds = 0
	b.waitServing(ctx, 10*time.Second)
	return nil
}

// waitServing polls the gRPC health check for up to d.
func (b *Broker) waitServing(ctx context.Context, d time.Duration) bool {
	conn, err := grpc.NewClient(b.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// Running reports whether an incarnation is up (paused or not).
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd != nil
}

// Paused reports whether the replica is SIGSTOPped.
func (b *Broker) Paused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.paused
}

// signal sends sig to the current incarnation.
func (b *Broker) signal(sig syscall.Signal) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return fmt.Errorf("%s is not running", b.Name())
	}
	switch sig {
	case syscall.SIGSTOP:
		b.paused = true
		// Returns once every thread has stopped: the replica is silent
		// for the whole of the fault's hold.
		return pause.Stop(b.cmd.Process.Pid)
	case syscall.SIGCONT:
		b.paused = false
	}
	return b.cmd.Process.Signal(sig)
}

// Pause SIGSTOPs the replica (a GC-like pause).
func (b *Broker) Pause() error { return b.signal(syscall.SIGSTOP) }

// Continue SIGCONTs it.
func (b *Broker) Continue() error { return b.signal(syscall.SIGCONT) }

// Kill SIGKILLs the replica (its process group) and waits for it.
func (b *Broker) Kill() {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.cmd, b.paused = nil, false
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Term sends SIGTERM and waits for the exit, at most the shutdown timeout
// plus 5s (then it kills). It returns nil for a clean exit: status 0 in
// time.
func (b *Broker) Term() error {
	b.mu.Lock()
	cmd, done, paused := b.cmd, b.done, b.paused
	b.cmd, b.paused = nil, false
	b.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	limit := b.shutdown + 5*time.Second
	select {
	case <-done:
	case <-time.After(limit):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("%s did not exit within %s of SIGTERM", b.Name(), limit)
	}
	if !cmd.ProcessState.Success() {
		return fmt.Errorf("%s exited with %s after SIGTERM (%s)", b.Name(), cmd.ProcessState, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// freeTCPPorts returns n loopback addresses that were free a moment ago.
func freeTCPPorts(n int) ([]string, error) {
	var out []string
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// scanLog returns the lines of path that show a data race, a panic, a
// fatal runtime error or a broken invariant the broker reports.
func scanLog(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.Contains(line, "WARNING: DATA RACE"),
			strings.HasPrefix(line, "panic:"),
			strings.HasPrefix(line, "fatal error:"),
			strings.Contains(line, `"panic in handler"`),
			strings.Contains(line, "a watched key had no query"), // a broken hub invariant (internal/broker/sweep.go)
			strings.Contains(line, `"level":"panic"`), strings.Contains(line, `"level":"fatal"`),
			strings.Contains(line, "Found ") && strings.Contains(line, "data race"):
			out = append(out, fmt.Sprintf("%s: %s", filepath.Base(path), truncate(line, 300)))
		}
	}
	return out
}

// tailFile returns the last 4 KiB of the file at path.
func tailFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data[max(0, len(data)-4096):])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
