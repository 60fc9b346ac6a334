package lockctl_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// `lockctl lock --read|--write KEY -- cmd` and `lockctl lock K1 K2 ... --
// cmd` (issue 43) against a real broker.
func TestLockReadWriteAndMultiKey(t *testing.T) {
	h := newHarness(t)
	t.Run("ReadWrite", func(t *testing.T) { t.Parallel(); testReadWrite(t, h) })
	t.Run("MultiKey", func(t *testing.T) { t.Parallel(); testMultiKey(t, h) })
}

// holdScript writes "$LOCKBROKER_TOKEN $LOCKBROKER_MODE $LOCKBROKER_SESSION"
// to the file given as $0 and sleeps.
const holdScript = `echo "$LOCKBROKER_TOKEN ${LOCKBROKER_MODE:-none} $LOCKBROKER_SESSION" > "$0"; exec sleep 60`

func token(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err, "token %q", s)
	return n
}

// testReadWrite: two --read holders hold at once; --write waits for both;
// a plain lock of the key is refused naming RWLOCK; the writer's token is
// above the readers'.
func testReadWrite(t *testing.T, h *harness) {
	const key = "lockctl-test/rw"
	dir := t.TempDir()
	r1f, r2f := filepath.Join(dir, "r1"), filepath.Join(dir, "r2")
	r1 := h.start(t, nil, "lock", "--read", "-v", key, "--", "sh", "-c", holdScript, r1f)
	got1 := r1.waitFile(t, r1f)
	r2 := h.start(t, nil, "lock", key, "--read", "sh", "-c", holdScript, r2f) // old form: --read after KEY
	got2 := r2.waitFile(t, r2f)                                               // both hold at once
	assert.Equal(t, "read", got1[1], "LOCKBROKER_MODE")
	assert.Equal(t, "read", got2[1])
	assert.NotEqual(t, got1[2], got2[2], "a session each")
	assert.Greater(t, token(t, got2[0]), token(t, got1[0]), "tokens grow per key")
	assert.Contains(t, r1.stderr.String(), `lockctl: acquired "`+key+`" (read): session `+got1[2]+", token "+got1[0])

	code, out, _ := h.run(t, nil, "get", key)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "read-write lock (2 readers)")

	code, _, stderr := h.run(t, nil, "lock", "--write", "--try", key, "--", "sh", "-c", "echo must not run; exit 99")
	assert.Equal(t, exitBusy, code, "a writer beside readers: %s", stderr)
	code, stdout, stderr := h.run(t, nil, "lock", "--try", key, "--", "sh", "-c", "echo must not run; exit 99")
	assert.Equal(t, 1, code, "a plain lock of a read-write key: %s", stderr)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "FAILED_PRECONDITION")
	assert.Contains(t, stderr, "is a read-write lock", "names the kind found")

	wf := filepath.Join(dir, "w")
	w := h.start(t, nil, "lock", "--write", "-v", key, "--", "sh", "-c", holdScript, wf)
	time.Sleep(time.Second)
	assert.NoFileExists(t, wf, "the writer must wait for the readers")
	for _, r := range []*proc{r1, r2} {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		assert.Equal(t, 128+int(syscall.SIGTERM), r.wait(t, 15*time.Second), "stderr: %s", r.stderr.String())
	}
	gotW := w.waitFile(t, wf)
	assert.Equal(t, "write", gotW[1])
	assert.Greater(t, token(t, gotW[0]), token(t, got2[0]), "the writer's token is above every reader's")
	assert.Contains(t, w.stderr.String(), `(write): session `+gotW[2])

	code, _, stderr = h.run(t, nil, "lock", "--read", "--try", key, "--", "true")
	assert.Equal(t, exitBusy, code, "a reader beside the writer: %s", stderr)
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	assert.Equal(t, 128+int(syscall.SIGTERM), w.wait(t, 15*time.Second), "stderr: %s", w.stderr.String())

	// --read on a plain lock key is refused, naming LOCK.
	const plain = "lockctl-test/rw-plain"
	pf := filepath.Join(dir, "plain")
	p := h.start(t, nil, "lock", plain, "--", "sh", "-c", holdScript, pf)
	p.waitFile(t, pf)
	code, _, stderr = h.run(t, nil, "lock", "--read", "--try", plain, "--", "true")
	assert.Equal(t, 1, code, "stderr: %s", stderr)
	assert.Contains(t, stderr, "FAILED_PRECONDITION")
	assert.Contains(t, stderr, "is a lock", "names the kind found")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 15*time.Second)
}

// testMultiKey: three keys as one; the command sees every key and token;
// each key is held (a try of one is busy); a second multi-key lock that
// overlaps waits and holds none of its keys meanwhile.
func testMultiKey(t *testing.T, h *harness) {
	a, b, c, d := "lockctl-test/multi-a", "lockctl-test/multi-b", "lockctl-test/multi-c", "lockctl-test/multi-d"
	dir := t.TempDir()
	f1 := filepath.Join(dir, "first")
	script := `printf '%s|%s|%s|%s\n' "$LOCKBROKER_TOKENS" "$(echo "$LOCKBROKER_KEYS" | tr '\n' ,)" "$LOCKBROKER_KEY" "$LOCKBROKER_TOKEN" > "$0"; exec sleep 60`
	first := h.start(t, nil, "lock", "-v", a, b, c, "--", "sh", "-c", script, f1)
	line := strings.Join(first.waitFile(t, f1), " ")
	parts := strings.Split(line, "|")
	require.Len(t, parts, 4, "line %q", line)
	tokens := strings.Fields(parts[0])
	require.Len(t, tokens, 3, "one token per key: %q", parts[0])
	assert.Equal(t, a+","+b+","+c+",", parts[1], "LOCKBROKER_KEYS, in order")
	assert.Equal(t, a, parts[2], "LOCKBROKER_KEY is the first key")
	assert.Equal(t, tokens[0], parts[3], "LOCKBROKER_TOKEN is the first key's")
	assert.Contains(t, first.stderr.String(), `lockctl: acquired "`+a+`" (token `+tokens[0]+`), "`+b+`" (token `+tokens[1]+`), "`+c+`" (token `+tokens[2]+`): session `)

	code, _, stderr := h.run(t, nil, "lock", "--try", b, "--", "true")
	assert.Equal(t, exitBusy, code, "b is held: %s", stderr)

	f2 := filepath.Join(dir, "second")
	second := h.start(t, nil, "lock", c, d, "--", "sh", "-c", script, f2)
	time.Sleep(time.Second)
	assert.NoFileExists(t, f2, "c and d must wait for c")
	code, out, _ := h.run(t, nil, "get", d)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "free", "a waiting multi-key lock holds none of its keys")

	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	assert.Equal(t, 128+int(syscall.SIGTERM), first.wait(t, 15*time.Second), "stderr: %s", first.stderr.String())
	parts2 := strings.Split(strings.Join(second.waitFile(t, f2), " "), "|")
	require.Len(t, parts2, 4)
	assert.Equal(t, c+","+d+",", parts2[1])
	assert.Greater(t, token(t, strings.Fields(parts2[0])[0]), token(t, tokens[2]), "c's token grows")
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	second.wait(t, 15*time.Second)
}

// TestLockResumesRWAndMultiKey: a --write hold and a multi-key hold whose
// broker is killed resume on the other broker as the same hold (every
// key, the same tokens); the command is never signalled and lockctl exits
// with its code.
func TestLockResumesRWAndMultiKey(t *testing.T) {
	lockctl := brokertest.Build(t, "./cmd/lockctl", "lockctl")
	agent := consultest.Start(t)
	h := &harness{lockctl: lockctl}
	kv := agent.Client().KV()
	for _, tt := range []struct {
		name string
		args []string // flags and keys
		want string   // in the resumed line, after the tokens are known
	}{
		{"write", []string{"--write", "lockctl-test/resume-rw"}, `"lockctl-test/resume-rw" (write): session `},
		{"multi-key", []string{"lockctl-test/resume-m1", "lockctl-test/resume-m2"}, `"lockctl-test/resume-m1" (token `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := brokertest.StartProcess(t, agent), brokertest.StartProcess(t, agent)
			file := filepath.Join(t.TempDir(), "child")
			args := append(append([]string{"--addr", a.Addr + "," + b.Addr, "lock", "-v", "--ttl", "10s"}, tt.args...), "--", "sh", "-c", resumeScript, file)
			p := h.start(t, nil, args...)
			got := p.waitFile(t, file)
			session, token := got[0], got[1]

			a.Kill()
			require.Eventually(t, func() bool { return strings.Contains(p.stderr.String(), "lockctl: resumed on "+b.Addr) },
				15*time.Second, 20*time.Millisecond, "no resume on B; stderr: %s", p.stderr.String())
			assert.Contains(t, p.stderr.String(), "lockctl: resumed on "+b.Addr+": "+tt.want)
			assert.Contains(t, p.stderr.String(), "token "+token, "the same grant")
			if tt.name == "multi-key" {
				for _, k := range tt.args {
					e, _, err := kv.Get(k, &api.QueryOptions{RequireConsistent: true})
					require.NoError(t, err)
					require.NotNil(t, e, k)
					assert.Equal(t, session, e.Session, "%s still held by the session", k)
				}
			}
			require.NoError(t, os.WriteFile(file+".go", nil, 0o644))
			assert.Equal(t, 0, p.wait(t, 15*time.Second), "stderr: %s", p.stderr.String())
			assert.NoFileExists(t, file+".term", "the command was never signalled")
		})
	}
}
