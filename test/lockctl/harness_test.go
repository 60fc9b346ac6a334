package lockctl_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// harness is a real broker and a freshly built lockctl.
type harness struct {
	broker  *brokertest.Process
	lockctl string
}

// newHarness builds lockctl and starts a broker for t.
func newHarness(t *testing.T) *harness {
	t.Helper()
	return &harness{
		lockctl: brokertest.Build(t, "./cmd/lockctl", "lockctl"),
		broker:  brokertest.StartDev(t),
	}
}

// proc is a lockctl process started by a test.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{} // closed once it has exited
}

// start runs `lockctl --addr <broker> args...` (just `lockctl args...` when
// args start with --addr) with env added to the test's environment. t.Cleanup stops it if it is still running (SIGTERM, which
// lockctl forwards to its command, then SIGKILL).
func (h *harness) start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	if len(args) == 0 || args[0] != "--addr" {
		args = append([]string{"--addr", h.broker.Addr}, args...)
	}
	p.cmd = exec.Command(h.lockctl, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.WaitDelay = 5 * time.Second // do not hang on pipes an orphan keeps open
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits at most timeout for p to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("lockctl %q still running after %v; stderr so far: %s", p.cmd.Args[1:], timeout, p.stderr.String())
		return 0
	}
}

// run runs lockctl to completion (at most a minute) and returns its exit
// code, stdout and stderr.
func (h *harness) run(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := h.start(t, env, args...)
	code = p.wait(t, time.Minute)
	return code, p.stdout.String(), p.stderr.String()
}

// waitFile waits until the command run by lockctl p has written a complete
// line to the file at path and returns its fields. It fails at once if
// lockctl exits first, and after 30s.
func (p *proc) waitFile(t *testing.T, path string) []string {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return strings.Fields(string(b))
		}
		select {
		case <-p.done:
			t.Fatalf("lockctl exited %d before its command wrote %s; stderr: %s",
				p.cmd.ProcessState.ExitCode(), path, p.stderr.String())
		case <-deadline:
			t.Fatalf("the locked command did not write %s within 30s; lockctl stderr: %s", path, p.stderr.String())
		case <-tick.C:
		}
	}
}

// syncBuffer is a bytes.Buffer that can be read while a process writes it.
// It also remembers when each write arrived.
type syncBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes []stampedWrite
}

// stampedWrite is one write and when it arrived.
type stampedWrite struct {
	at   time.Time
	text string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writes = append(b.writes, stampedWrite{time.Now(), string(p)})
	return b.buf.Write(p)
}

// stamped returns every write so far with its arrival time.
func (b *syncBuffer) stamped() []stampedWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]stampedWrite(nil), b.writes...)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
