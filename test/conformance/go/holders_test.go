package conformance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// The `hold` CLIs of every language (scenarios.md, S5): how to start
// them, whether they can run here, and one running CLI process with the
// JSON lines it printed.

// lang is one language's hold CLI.
type lang struct {
	name string
	// argv is the command line of `hold` (before the common flags).
	argv []string
	env  []string
	// missing says why the CLI cannot run here ("" when it can).
	missing string
}

// s5Required lists the languages whose CLI must be there (a failure, not a
// skip, when one is not): LOCKBROKER_S5_REQUIRE=python,node,java, or "all".
func s5Required(name string) bool {
	req := os.Getenv("LOCKBROKER_S5_REQUIRE")
	return req == "all" || oneOf(name, strings.Split(req, ",")...)
}

var (
	goCLIOnce sync.Once
	goCLIPath string
)

// goCLI builds test/conformance/go/cli once per test binary.
func goCLI(t *testing.T) lang {
	goCLIOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lockbroker-conformance-cli-")
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "cli")
		cmd := exec.Command("go", "build", "-o", out, "./test/conformance/go/cli")
		cmd.Dir = brokertest.RepoRoot(t)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./test/conformance/go/cli: %v\n%s", err, b)
		}
		goCLIPath = out
	})
	return lang{name: "go", argv: []string{goCLIPath, "hold"}}
}

// pythonCLI is `python3 -m lockbroker.conformance` from client/python.
func pythonCLI(t *testing.T) lang {
	root := brokertest.RepoRoot(t)
	l := lang{name: "python", argv: []string{"/usr/bin/python3", "-m", "lockbroker.conformance", "hold"},
		env: []string{"PYTHONPATH=" + filepath.Join(root, "client", "python")}}
	cmd := exec.Command("/usr/bin/python3", "-c", "import grpc, google.protobuf, lockbroker.conformance")
	cmd.Dir, cmd.Env = root, append(os.Environ(), l.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.missing = fmt.Sprintf("/usr/bin/python3 cannot import grpc, protobuf and lockbroker (apt-get install python3-grpcio python3-protobuf): %v %s", err, bytes.TrimSpace(out))
	}
	return l
}

// nodeCLI is client/node/conformance.mjs; it needs client/node's packages.
func nodeCLI(t *testing.T) lang {
	root := brokertest.RepoRoot(t)
	l := lang{name: "node", argv: []string{"node", filepath.Join(root, "client", "node", "conformance.mjs"), "hold"}}
	if _, err := exec.LookPath("node"); err != nil {
		l.missing = "no node on PATH"
	} else if _, err := os.Stat(filepath.Join(root, "client", "node", "node_modules", "@connectrpc")); err != nil {
		l.missing = "client/node/node_modules is missing: run npm ci --prefix client/node"
	}
	return l
}

var (
	javaOnce    sync.Once
	javaMissing string
)

// javaCLI is client/java/conformance.sh; it needs the Java build
// (make -C client/java build). The first call runs
// `make -s -C client/java classpath` (which compiles the CLI if it is
// stale) so that later starts only start a JVM.
func javaCLI(t *testing.T) lang {
	root := brokertest.RepoRoot(t)
	l := lang{name: "java", argv: []string{filepath.Join(root, "client", "java", "conformance.sh"), "hold"}}
	javaOnce.Do(func() {
		if _, err := exec.LookPath("java"); err != nil {
			javaMissing = "no java on PATH (make -C client/java build installs OpenJDK)"
			return
		}
		if _, err := os.Stat(filepath.Join(root, "client", "java", "build", "lockbroker-client.jar")); err != nil {
			javaMissing = "the Java build is not there: run make -C client/java build"
			return
		}
		cmd := exec.Command("make", "-s", "-C", filepath.Join(root, "client", "java"), "classpath")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := runBounded(cmd, 3*time.Minute); err != nil {
			javaMissing = fmt.Sprintf("make -s -C client/java classpath: %v\n%s", err, out.Bytes())
		}
	})
	l.missing = javaMissing
	return l
}

// runBounded runs cmd and kills it after limit.
func runBounded(cmd *exec.Cmd, limit time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	t := time.AfterFunc(limit, func() { _ = cmd.Process.Kill() })
	defer t.Stop()
	return cmd.Wait()
}

// event is one JSON line of a CLI, with when the test read it.
type event struct {
	fields map[string]any
	read   time.Time
}

func (e event) name() string { s, _ := e.fields["event"].(string); return s }

// at is the line's own timestamp ("t", Unix seconds), else when it was read.
func (e event) at() time.Time {
	if f, ok := e.fields["t"].(float64); ok {
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9))
	}
	return e.read
}

func (e event) token() uint64 { f, _ := e.fields["token"].(float64); return uint64(f) }

// cli is one running hold CLI process.
type cli struct {
	lang  lang
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu       sync.Mutex
	events   []event
	changed  chan struct{} // closed and replaced on every event
	exited   chan struct{}
	stderr   bytes.Buffer
	askedEnd time.Time // when the test closed stdin or signalled it
}

// startCLI runs `hold` of l on the broker at addr, with stdin a pipe (its
// end is a request to release) and in a process group of its own. The
// test's cleanup stops it. Safe to call from any goroutine.
func startCLI(t *testing.T, l lang, addr, key string, limit int, seconds float64, extra ...string) (*cli, error) {
	args := append(append([]string{}, l.argv[1:]...), "--target", addr, "--key", key,
		"--limit", fmt.Sprint(limit), "--seconds", fmt.Sprint(seconds))
	cmd := exec.Command(l.argv[0], append(args, extra...)...)
	cmd.Dir = brokertest.RepoRoot(t)
	cmd.Env = append(os.Environ(), l.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c := &cli{lang: l, cmd: cmd, changed: make(chan struct{}), exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &c.mu, w: &c.stderr}
	var err error
	c.stdin, err = cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s CLI: %w", l.name, err)
	}
	go c.read(stdout)
	t.Cleanup(c.stop)
	return c, nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w.Len() < 64<<10 {
		w.w.Write(p)
	}
	return len(p), nil
}

func (c *cli) read(stdout io.Reader) {
	s := bufio.NewScanner(stdout)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		var f map[string]any
		if json.Unmarshal(s.Bytes(), &f) != nil {
			continue
		}
		c.add(event{fields: f, read: time.Now()})
	}
	_, _ = io.Copy(io.Discard, stdout)
	_ = c.cmd.Wait()
	c.add(event{fields: map[string]any{"event": "exit"}, read: time.Now()})
	close(c.exited)
}

func (c *cli) add(e event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
	close(c.changed)
	c.changed = make(chan struct{})
}

// find returns the first event called name.
func (c *cli) find(name string) (event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.events {
		if e.name() == name {
			return e, true
		}
	}
	return event{}, false
}

func (c *cli) has(name string) bool { _, ok := c.find(name); return ok }

// wait waits for the event called name; an error or lost event, the
// process's exit or the timeout first is an error.
func (c *cli) wait(name string, timeout time.Duration) (event, error) {
	return c.waitOr(name, timeout, nil)
}

// errGaveUp: waitOr's cancel channel was closed first.
var errGaveUp = errors.New("gave up waiting")

// waitOr is wait that also gives up (errGaveUp) when cancel is closed.
func (c *cli) waitOr(name string, timeout time.Duration, cancel <-chan struct{}) (event, error) {
	end := time.After(timeout)
	for {
		c.mu.Lock()
		changed := c.changed
		for _, e := range c.events {
			switch {
			case e.name() == name:
				c.mu.Unlock()
				return e, nil
			case oneOf(e.name(), "error", "lost", "exit"):
				err := fmt.Errorf("%s CLI: %v before %s; stderr: %s", c.lang.name, e.fields, name, c.stderr.String())
				c.mu.Unlock()
				return event{}, err
			}
		}
		c.mu.Unlock()
		select {
		case <-changed:
		case <-cancel:
			return event{}, errGaveUp
		case <-end:
			return event{}, fmt.Errorf("%s CLI: no %s within %v: %v", c.lang.name, name, timeout, c.all())
		}
	}
}

func (c *cli) all() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, e := range c.events {
		out = append(out, e.fields)
	}
	return out
}

func (c *cli) markEnd() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.askedEnd.IsZero() {
		c.askedEnd = time.Now()
	}
}

// release closes stdin: the CLI releases and exits.
func (c *cli) release() {
	c.markEnd()
	_ = c.stdin.Close()
}

// terminate sends SIGTERM to the CLI's process group (a waiting CLI gives
// up; a holding one releases).
func (c *cli) terminate() {
	c.markEnd()
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
}

// stop ends the CLI: stdin closed, then SIGTERM, then SIGKILL, each given
// a few seconds.
func (c *cli) stop() {
	c.release()
	for _, step := range []func(){func() {}, c.terminate, func() { _ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) }} {
		step()
		select {
		case <-c.exited:
			return
		case <-time.After(5 * time.Second):
		}
	}
	<-c.exited
}

// belief is when the CLI believed it held the slot, as far as the test
// can tell from outside, never wider than the truth: from its acquired
// line (printed after the grant) to when the test asked it to release
// (before it could act on it), or to its lost line. ok is false when it
// never acquired.
func (c *cli) belief() (iv interval, ok bool) {
	acq, ok := c.find("acquired")
	if !ok {
		return interval{}, false
	}
	c.mu.Lock()
	end := c.askedEnd
	c.mu.Unlock()
	if lost, isLost := c.find("lost"); isLost && (end.IsZero() || lost.at().Before(end)) {
		end = lost.at()
	}
	if end.IsZero() { // ended by itself (--seconds): its released line
		if rel, done := c.find("released"); done {
			end = rel.at()
		} else {
			end = time.Now()
		}
	}
	return interval{who: c.lang.name, from: acq.at(), to: end, token: acq.token()}, true
}

// interval is one holder's belief that it held a slot.
type interval struct {
	who      string
	from, to time.Time
	token    uint64
}

// maxOverlap is the largest number of intervals that overlap at one
// instant (an interval ending when another starts does not overlap it),
// and the intervals at that instant.
func maxOverlap(ivs []interval) (int, []interval) {
	type edge struct {
		at    time.Time
		delta int
		i     int
	}
	var edges []edge
	for i, iv := range ivs {
		edges = append(edges, edge{iv.from, +1, i}, edge{iv.to, -1, i})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends first
	})
	best := 0
	var at []interval
	active := map[int]bool{}
	for _, e := range edges {
		if e.delta > 0 {
			active[e.i] = true
		} else {
			delete(active, e.i)
		}
		if len(active) > best {
			best, at = len(active), nil
			for i := range active {
				at = append(at, ivs[i])
			}
		}
	}
	return best, at
}

// TestMaxOverlap checks the overlap count S5 relies on.
func TestMaxOverlap(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, int64(ms)*int64(time.Millisecond)) }
	iv := func(who string, from, to int) interval { return interval{who: who, from: at(from), to: at(to)} }
	tests := []struct {
		name string
		ivs  []interval
		want int
	}{
		{"none", nil, 0},
		{"one", []interval{iv("a", 0, 10)}, 1},
		{"hand-off at the same instant", []interval{iv("a", 0, 10), iv("b", 10, 20)}, 1},
		{"nested", []interval{iv("a", 0, 100), iv("b", 10, 20), iv("c", 15, 30), iv("d", 19, 25)}, 4},
		{"chain", []interval{iv("a", 0, 10), iv("b", 5, 15), iv("c", 12, 20), iv("d", 16, 30)}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, who := maxOverlap(tt.ivs)
			if got != tt.want || len(who) != tt.want {
				t.Errorf("maxOverlap = %d %v, want %d", got, who, tt.want)
			}
		})
	}
}
