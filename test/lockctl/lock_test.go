package lockctl_test

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Exit codes documented in `lockctl --help`.
const (
	exitBusy    = 73
	exitTimeout = 74
	exitLost    = 75
)

func TestLock(t *testing.T) {
	h := newHarness(t)
	t.Run("NoOverlap", func(t *testing.T) { t.Parallel(); testNoOverlap(t, h) })
	t.Run("ExitCode", func(t *testing.T) { t.Parallel(); testExitCode(t, h) })
	t.Run("Busy", func(t *testing.T) { t.Parallel(); testBusy(t, h) })
	t.Run("Lost", func(t *testing.T) { t.Parallel(); testLost(t, h) })
	t.Run("Semaphore", func(t *testing.T) { t.Parallel(); testSemaphore(t, h) })
	t.Run("NoLockDelay", func(t *testing.T) { t.Parallel(); testNoLockDelay(t, h) })
	t.Run("VerboseWait", func(t *testing.T) { t.Parallel(); testVerboseWait(t, h) })
}

// testVerboseWait: with -v, a wait is reported once per change of the
// holders, not once per heartbeat of the broker (a `queued` every 2 s).
func testVerboseWait(t *testing.T, h *harness) {
	const key = "lockctl-test/verbose-wait"
	file := filepath.Join(t.TempDir(), "holder")
	holder := h.start(t, nil, "lock", key, "--", "sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, file)
	session := holder.waitFile(t, file)[0]
	code, stdout, stderr := h.run(t, nil, "lock", "-v", "--timeout", "5s", key, "--", "sh", "-c", "echo must not run; exit 99")
	assert.Equal(t, exitTimeout, code, "stderr: %s", stderr)
	assert.Empty(t, stdout, "the command must not run")
	assert.Equal(t, 1, strings.Count(stderr, "lockctl: waiting: "), "one waiting line over two heartbeats, got %q", stderr)
	assert.Contains(t, stderr, session, "the waiting line names the holder's session")
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	assert.Equal(t, 128+int(syscall.SIGTERM), holder.wait(t, 15*time.Second), "stderr: %s", holder.stderr.String())
}

// hold is one run of the locked command, as recordHold logged it.
type hold struct {
	start, end int64 // Unix nanoseconds
	token      uint64
	session    string
}

// testNoOverlap runs several lockctls on one key at once; each child logs
// when it starts and ends, and no two may overlap. Tokens must grow in the
// order the holds were granted.
func testNoOverlap(t *testing.T, h *harness) {
	const n, key = 3, "lockctl-test/overlap"
	file := filepath.Join(t.TempDir(), "holds.log")
	self, err := os.Executable()
	require.NoError(t, err)
	env := []string{helperEnv + "=record", "LOCKCTL_TEST_FILE=" + file, "LOCKCTL_TEST_HOLD=300ms"}

	procs := make([]*proc, n)
	for i := range procs { // all at once: they contend for the key
		procs[i] = h.start(t, env, "lock", "--value", "worker-"+strconv.Itoa(i), key, "--", self)
	}
	for i, p := range procs {
		assert.Equal(t, 0, p.wait(t, time.Minute), "lockctl %d: %s", i, p.stderr.String())
	}

	holds := readHolds(t, file, key)
	require.Len(t, holds, n, "every locked command must have run once")
	for i := 1; i < len(holds); i++ {
		prev, cur := holds[i-1], holds[i]
		assert.Greater(t, cur.start, prev.end, "hold %d (token %d) started before hold %d (token %d) ended", i, cur.token, i-1, prev.token)
		assert.Greater(t, cur.token, prev.token, "tokens must grow with every grant")
		assert.NotEqual(t, cur.session, prev.session)
	}
}

// readHolds parses the log written by recordHold, sorted by start time.
func readHolds(t *testing.T, file, key string) []hold {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	byToken := map[uint64]*hold{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 3, "bad line %q", line)
		ns, err := strconv.ParseInt(f[1], 10, 64)
		require.NoError(t, err)
		token, err := strconv.ParseUint(f[2], 10, 64)
		require.NoError(t, err, "LOCKBROKER_TOKEN must be a number: %q", line)
		hd := byToken[token]
		if hd == nil {
			hd = &hold{token: token}
			byToken[token] = hd
		}
		switch f[0] {
		case "start":
			require.Len(t, f, 6, "start line %q", line)
			hd.start, hd.session = ns, f[3]
			assert.Equal(t, key, f[4], "LOCKBROKER_KEY")
			assert.NotEqual(t, "0", f[5], "LOCKBROKER_LOCK_INDEX")
		case "end":
			hd.end = ns
		}
	}
	holds := make([]hold, 0, len(byToken))
	for _, hd := range byToken {
		require.NotZero(t, hd.start, "token %d has no start", hd.token)
		require.NotZero(t, hd.end, "token %d has no end", hd.token)
		holds = append(holds, *hd)
	}
	sort.Slice(holds, func(i, j int) bool { return holds[i].start < holds[j].start })
	return holds
}

// testExitCode checks that lockctl exits with its command's exit code.
func testExitCode(t *testing.T, h *harness) {
	tests := []struct {
		name   string
		script string
		want   int
	}{
		{"zero", "exit 0", 0},
		{"seven", "exit 7", 7},
		{"killed by SIGTERM", "kill -TERM $$", 128 + int(syscall.SIGTERM)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := h.run(t, nil, "lock", "lockctl-test/exit-code", "--", "sh", "-c", tt.script)
			assert.Equal(t, tt.want, code, "stderr: %s", stderr)
		})
	}
}

// testBusy holds a key with one lockctl and checks that another one with
// --try exits 73, and with --timeout exits 74, naming the holder on one
// line of stderr.
func testBusy(t *testing.T, h *harness) {
	const key = "lockctl-test/busy"
	file := filepath.Join(t.TempDir(), "holder")
	holder := h.start(t, nil, "lock", "--value", "holder-A", key, "--",
		"sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, file)
	session := holder.waitFile(t, file)[0]

	tests := []struct {
		name  string
		flags []string
		want  int
	}{
		{"try", []string{"--try"}, exitBusy},
		{"timeout", []string{"--timeout", "500ms"}, exitTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"lock"}, tt.flags...), key, "--", "sh", "-c", "echo must not run; exit 99")
			code, stdout, stderr := h.run(t, nil, args...)
			assert.Equal(t, tt.want, code, "stderr: %s", stderr)
			assert.Empty(t, stdout, "the command must not run")
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line on stderr, got %q", stderr)
			assert.True(t, strings.HasPrefix(stderr, "lockctl: "), "stderr: %q", stderr)
			assert.Contains(t, stderr, session, "the line must name the holder's session")
		})
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM) // forwarded to sleep
	assert.Equal(t, 128+int(syscall.SIGTERM), holder.wait(t, 15*time.Second), "stderr: %s", holder.stderr.String())
}

// testLost destroys the holder's session in Consul while its command runs
// and checks that lockctl stops the command within --grace (SIGTERM, then
// SIGKILL for a command that ignores SIGTERM) and exits 75.
func testLost(t *testing.T, h *harness) {
	const grace = 2 * time.Second
	tests := []struct {
		name   string
		script string
		killed bool // the command ignores SIGTERM and needs SIGKILL
	}{
		{"obeys SIGTERM", `echo $$ "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, false},
		{"ignores SIGTERM", `trap '' TERM; echo $$ "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "child")
			key := "lockctl-test/lost-" + strconv.Itoa(i)
			p := h.start(t, nil, "lock", "--grace", grace.String(), key, "--", "sh", "-c", tt.script, file)
			fields := p.waitFile(t, file)
			pid, err := strconv.Atoi(fields[0])
			require.NoError(t, err)
			session := fields[1]

			destroyed := time.Now()
			_, err = h.broker.ConsulClient().Session().Destroy(session, nil)
			require.NoError(t, err)
			code := p.wait(t, grace+2*time.Second)
			elapsed := time.Since(destroyed)

			assert.LessOrEqual(t, elapsed, grace+2*time.Second)
			assert.Equal(t, exitLost, code, "stderr: %s", p.stderr.String())
			assert.Contains(t, p.stderr.String(), "lock lost")
			if tt.killed {
				assert.GreaterOrEqual(t, elapsed, grace, "SIGKILL must wait for --grace")
			}
			err = syscall.Kill(pid, 0)
			assert.True(t, errors.Is(err, syscall.ESRCH), "the command (pid %d) must be gone, kill(0) says %v", pid, err)
		})
	}
}

// testSemaphore runs two lockctls with -n 2 on one prefix at once (both
// commands must start) and checks that a third one finds it full.
func testSemaphore(t *testing.T, h *harness) {
	const key = "lockctl-test/semaphore"
	dir := t.TempDir()
	var holders []*proc
	sessions := map[string]bool{}
	for i := range 2 {
		file := filepath.Join(dir, strconv.Itoa(i))
		p := h.start(t, nil, "lock", "-n", "2", key, "--",
			"sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, file)
		holders = append(holders, p)
		sessions[p.waitFile(t, file)[0]] = true
	}
	assert.Len(t, sessions, 2, "two holders with their own sessions")

	code, _, stderr := h.run(t, nil, "lock", "-n", "2", "--try", key, "--", "true")
	assert.Equal(t, exitBusy, code, "stderr: %s", stderr)
	for _, p := range holders {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		assert.Equal(t, 128+int(syscall.SIGTERM), p.wait(t, 15*time.Second), "stderr: %s", p.stderr.String())
	}
}

// testNoLockDelay checks --lock-delay 0s: once the holder's session is
// destroyed, the key can be taken at once (with Consul's default 15s
// lock-delay, a try would find it busy).
func testNoLockDelay(t *testing.T, h *harness) {
	const key = "lockctl-test/no-lock-delay"
	file := filepath.Join(t.TempDir(), "holder")
	holder := h.start(t, nil, "lock", "--lock-delay", "0s", key, "--",
		"sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, file)
	session := holder.waitFile(t, file)[0]
	_, err := h.broker.ConsulClient().Session().Destroy(session, nil)
	require.NoError(t, err)
	assert.Equal(t, exitLost, holder.wait(t, 15*time.Second), "stderr: %s", holder.stderr.String())

	code, _, stderr := h.run(t, nil, "lock", "--try", key, "--", "true")
	assert.Equal(t, 0, code, "no lock-delay after --lock-delay 0s: %s", stderr)
}
