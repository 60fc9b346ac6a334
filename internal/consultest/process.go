package consultest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	startTimeout  = 30 * time.Second // upper bound on waiting for readiness
	stopGrace     = 5 * time.Second  // SIGTERM → SIGKILL delay
	startAttempts = 3                // launches tried when a port is taken
	tailLines     = 30               // agent output lines quoted in errors
)

// errBind marks a start that failed because a port was already taken.
var errBind = errors.New("port already in use")

// portConflict says whether an agent's output shows a start that failed
// on its ports: one already taken by another process, or one the harness
// picked that the caller's configuration (WithHCL) also gives to another
// listener, which Consul refuses as "… already configured for …". Both
// are worth a retry with fresh ports.
func portConflict(tail *tailBuffer) bool {
	return tail.contains("address already in use") || tail.contains("already configured for")
}

// nodeSeq makes node names unique within this process.
var nodeSeq atomic.Int64

// ProcessConfig configures StartProcess. The zero value is usable.
type ProcessConfig struct {
	// Binary is the consul binary to run; "" means Binary().
	Binary string
	// HTTPPort is the loopback HTTP API port; 0 picks a free one.
	HTTPPort int
	// DataDir is the agent's data directory, created if missing and left in
	// place; "" means a fresh temporary directory that Stop removes.
	DataDir string
	// LogWriter receives the agent's stdout and stderr; nil discards them.
	LogWriter io.Writer
	// HCL holds extra agent configuration fragments, passed as -hcl after
	// the harness's own (so they may override it), e.g. `session_ttl_min = "1s"`.
	HCL []string
	// Token is the ACL token the readiness probe uses. Set it (with an HCL
	// fragment that enables ACLs and makes it the initial management token)
	// to run an agent whose default policy is deny; "" sends no token.
	Token string
	// HTTPS, when set, makes the agent serve its API over HTTPS only, on
	// the HTTP port (plain HTTP is off), with these files; the readiness
	// probe verifies the agent against HTTPS.CAFile.
	HTTPS *HTTPS
	// Server, when set, makes the agent a client agent (not a server) of
	// that server agent: it joins it and counts as ready once it sees it
	// as the leader (see StartClient).
	Server *Process
}

// Process is a running `consul agent -dev` child process.
type Process struct {
	cfg     ProcessConfig // Binary resolved
	ports   ports
	node    string
	dataDir string
	tempDir bool // dataDir was created by launch and is removed by Stop
	cmd     *exec.Cmd
	tail    *tailBuffer
	done    chan struct{} // closed once the process has exited

	mu       sync.Mutex
	stopping bool
	exited   bool
	exitErr  error
	waiters  []chan error

	stopOnce sync.Once
	stopErr  error
}

// StartProcess starts a dev-mode Consul agent bound to 127.0.0.1 on free
// ports (HTTP, server RPC, Serf LAN and WAN; DNS, gRPC and HTTPS disabled)
// and waits until it has elected itself leader and accepts a KV write. If a
// port is taken before the agent binds it, it retries with fresh ports, up to
// 3 launches in all. ctx (further capped at 30s) bounds only the startup:
// once StartProcess returns, the agent runs until Stop.
func StartProcess(ctx context.Context, cfg ProcessConfig) (*Process, error) {
	if cfg.Binary == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	node := fmt.Sprintf("consultest-%d-%d", os.Getpid(), nodeSeq.Add(1))
	return launchRetry(ctx, cfg, node, func() (ports, error) { return freePorts(cfg.HTTPPort) })
}

// restart launches a new agent with p's configuration, ports and node name.
func (p *Process) restart(ctx context.Context) (*Process, error) {
	return launchRetry(ctx, p.cfg, p.node, func() (ports, error) { return p.ports, nil })
}

// launchRetry calls launch with ports from pick until it succeeds, fails for
// a reason other than a taken port, or has been tried startAttempts times.
func launchRetry(ctx context.Context, cfg ProcessConfig, node string, pick func() (ports, error)) (*Process, error) {
	var err error
	for range startAttempts {
		var pp ports
		if pp, err = pick(); err != nil {
			return nil, err
		}
		var p *Process
		if p, err = launch(ctx, cfg, pp, node); err == nil || !errors.Is(err, errBind) || ctx.Err() != nil {
			return p, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("consultest: gave up after %d attempts: %w", startAttempts, err)
}

// launch starts one agent on pp and waits for it to be ready; on failure the
// agent is stopped and the error quotes its last output lines.
func launch(ctx context.Context, cfg ProcessConfig, pp ports, node string) (*Process, error) {
	p := &Process{cfg: cfg, ports: pp, node: node, dataDir: cfg.DataDir,
		tail: new(tailBuffer), done: make(chan struct{})}
	if p.dataDir == "" {
		dir, err := os.MkdirTemp("", "consultest-")
		if err != nil {
			return nil, fmt.Errorf("consultest: data dir: %w", err)
		}
		p.dataDir, p.tempDir = dir, true
	} else if err := os.MkdirAll(p.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("consultest: data dir: %w", err)
	}
	var out io.Writer = p.tail
	if cfg.LogWriter != nil {
		out = io.MultiWriter(cfg.LogWriter, p.tail)
	}
	args := []string{"agent", "-dev", "-node=" + node, "-data-dir=" + p.dataDir, "-hcl=" + baseHCL(pp)}
	if cfg.HTTPS != nil {
		args = append(args, "-hcl="+cfg.HTTPS.hcl(pp.HTTP))
	}
	leader := "127.0.0.1:" + strconv.Itoa(pp.Server)
	if s := cfg.Server; s != nil {
		args = append(args, fmt.Sprintf("-hcl=server = false\nbootstrap = false\nretry_join = [\"127.0.0.1:%d\"]", s.ports.SerfLAN))
		leader = "127.0.0.1:" + strconv.Itoa(s.ports.Server)
	}
	for _, h := range cfg.HCL {
		args = append(args, "-hcl="+h)
	}
	p.cmd = exec.Command(cfg.Binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		p.removeTempDir()
		return nil, fmt.Errorf("consultest: start %s: %w", cfg.Binary, err)
	}
	go p.reap()

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := waitReady(ctx, p.HTTPAddr(), leader, cfg.Token, cfg.HTTPS, p.done); err != nil {
		stopErr := p.Stop()
		if portConflict(p.tail) {
			err = fmt.Errorf("%w: %w", errBind, err)
		}
		return nil, fmt.Errorf("consultest: consul agent on %s not ready: %w\n--- last agent output ---\n%s",
			p.HTTPAddr(), errors.Join(err, stopErr), p.tail.lastLines(tailLines))
	}
	return p, nil
}

// baseHCL is the harness's agent configuration for ports pp.
func baseHCL(pp ports) string {
	return `bind_addr = "127.0.0.1"
client_addr = "127.0.0.1"
advertise_addr = "127.0.0.1"
advertise_addr_wan = "127.0.0.1"
log_level = "warn"
limits { http_max_conns_per_client = 200 }
` + pp.hcl()
}

// HTTPAddr returns the agent's HTTP API address, "127.0.0.1:NNNN".
func (p *Process) HTTPAddr() string {
	return "127.0.0.1:" + strconv.Itoa(p.ports.HTTP)
}

// Wait returns a channel that receives one value when the agent exits and is
// then closed: nil if the exit was caused by Stop, otherwise an error
// describing the unexpected exit. Each call returns a new channel.
func (p *Process) Wait() <-chan error {
	ch := make(chan error, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		ch <- p.exitErr
		close(ch)
	} else {
		p.waiters = append(p.waiters, ch)
	}
	return ch
}

// reap waits for the process to exit and notifies Wait callers.
func (p *Process) reap() {
	err := p.cmd.Wait()
	p.mu.Lock()
	switch {
	case p.stopping:
		err = nil
	case err == nil:
		err = errors.New("consultest: consul agent exited unexpectedly with status 0")
	default:
		err = fmt.Errorf("consultest: consul agent exited unexpectedly: %w\n--- last agent output ---\n%s",
			err, p.tail.lastLines(tailLines))
	}
	p.exited, p.exitErr = true, err
	for _, ch := range p.waiters {
		ch <- err
		close(ch)
	}
	p.waiters = nil
	p.mu.Unlock()
	close(p.done)
}

// running reports whether the agent is alive and Stop has not been called.
func (p *Process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.exited && !p.stopping
}

// Stop sends the agent SIGTERM, SIGKILLs it if it has not exited after 5s,
// waits for it to exit, and removes its data directory if StartProcess
// created it. It is idempotent; later calls return the first call's result.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.stop() })
	return p.stopErr
}

// stop does the work of Stop.
func (p *Process) stop() error {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	var errs []error
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = p.cmd.Process.Kill() // no SIGTERM on this platform
	}
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("consultest: kill consul agent: %w", err))
		}
		<-p.done
	}
	if err := p.removeTempDir(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeTempDir removes the data directory if launch created it.
func (p *Process) removeTempDir() error {
	if !p.tempDir {
		return nil
	}
	return os.RemoveAll(p.dataDir)
}
