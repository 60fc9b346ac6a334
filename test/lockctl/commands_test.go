package lockctl_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// uuidRE matches a Consul session id.
var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// TestCommands covers the inspection and session commands: get, watch,
// release, session, health, errors and broker failover.
func TestCommands(t *testing.T) {
	h := newHarness(t)

	t.Run("Health", func(t *testing.T) {
		code, stdout, stderr := h.run(t, nil, "health")
		assert.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "SERVING")
		code, _, stderr = h.run(t, nil, "health", "--http", "http://"+h.broker.HTTPAddr+"/healthz")
		assert.Equal(t, 0, code, "the broker must answer /healthz (docker-compose's health check): %s", stderr)
	})

	t.Run("GetFree", func(t *testing.T) {
		code, stdout, stderr := h.run(t, nil, "get", "lockctl-test/free")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, `"lockctl-test/free": free`+"\n", stdout)
		code, stdout, stderr = h.run(t, nil, "get", "--json", "lockctl-test/free")
		require.Equal(t, 0, code, stderr)
		var resp struct{ State struct{ Key, Kind string } }
		require.NoError(t, json.Unmarshal([]byte(stdout), &resp), stdout)
		assert.Equal(t, "lockctl-test/free", resp.State.Key)
		assert.Equal(t, "LOCK_KIND_NONE", resp.State.Kind)
	})

	t.Run("BadKey", func(t *testing.T) {
		code, _, stderr := h.run(t, nil, "get", "a//b")
		assert.Equal(t, 1, code)
		assert.Regexp(t, `^lockctl: INVALID_ARGUMENT: .*key.*\n$`, stderr)
	})

	t.Run("Failover", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead := l.Addr().String()
		require.NoError(t, l.Close())
		code, stdout, stderr := h.run(t, nil, "get", "--addr", dead+","+h.broker.Addr, "lockctl-test/failover")
		assert.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "free")
		code, _, stderr = h.run(t, []string{"LOCKBROKER_ADDR=" + dead}, "--addr", dead, "get", "lockctl-test/failover")
		assert.Equal(t, 1, code)
		assert.Regexp(t, `^lockctl: UNAVAILABLE: no broker reachable: `+regexp.QuoteMeta(dead), stderr)
	})

	t.Run("WatchAndRelease", func(t *testing.T) { testWatchAndRelease(t, h) })

	t.Run("Session", func(t *testing.T) {
		code, stdout, stderr := h.run(t, nil, "session", "create", "--ttl", "20s", "--lock-delay", "0s")
		require.Equal(t, 0, code, stderr)
		id := strings.TrimSpace(stdout)
		require.Regexp(t, uuidRE, id)
		code, stdout, stderr = h.run(t, nil, "session", "get", id)
		require.Equal(t, 0, code, stderr)
		assert.Regexp(t, `(?m)^ttl: +20s$`, stdout)
		assert.Regexp(t, `(?m)^lock-delay: +0s$`, stdout, "--lock-delay 0s disables Consul's lock-delay")
		assert.Regexp(t, `(?m)^checks: +-$`, stdout, "without --check the session depends on its TTL alone")
		code, stdout, stderr = h.run(t, nil, "session", "renew", id)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "renewed "+id)
		code, _, stderr = h.run(t, nil, "session", "destroy", id)
		require.Equal(t, 0, code, stderr)
		code, _, stderr = h.run(t, nil, "session", "get", id)
		assert.Equal(t, 1, code)
		assert.Regexp(t, `^lockctl: NOT_FOUND: `, stderr)
	})
}

// testWatchAndRelease watches a key while a lockctl takes it and another
// lockctl releases it from outside: the watch shows free, held, free, and
// the holder exits 75 (its lock was taken away).
func testWatchAndRelease(t *testing.T, h *harness) {
	const key = "lockctl-test/watch"
	watch := exec.Command(h.lockctl, "--addr", h.broker.Addr, "watch", "--json", key)
	out, err := watch.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, watch.Start())
	lines := make(chan string)
	go func() { // ends when watch exits and closes its stdout
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	defer func() {
		_ = watch.Process.Signal(syscall.SIGTERM)
		for range lines {
		}
		assert.NoError(t, watch.Wait(), "watch must exit 0 on SIGTERM")
	}()

	type state struct {
		Kind    string
		Holders []struct{ SessionID, Token string }
	}
	next := func() state {
		t.Helper()
		select {
		case line, ok := <-lines:
			require.True(t, ok, "watch ended early")
			var resp struct{ State state }
			require.NoError(t, json.Unmarshal([]byte(line), &resp), line)
			return resp.State
		case <-time.After(30 * time.Second):
			t.Fatal("no watch event within 30s")
			return state{}
		}
	}
	assert.Equal(t, "LOCK_KIND_NONE", next().Kind, "first the state now")

	file := filepath.Join(t.TempDir(), "holder")
	holder := h.start(t, nil, "lock", key, "--", "sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"; exec sleep 60`, file)
	session := holder.waitFile(t, file)[0]
	st := next()
	for len(st.Holders) == 0 { // the key may show up before its holder
		st = next()
	}
	assert.Equal(t, "LOCK_KIND_LOCK", st.Kind)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, session, st.Holders[0].SessionID)

	code, stdout, stderr := h.run(t, nil, "get", key)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "session "+session)

	code, stdout, stderr = h.run(t, nil, "release", key, session, "--grant-token", st.Holders[0].Token)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "released")
	assert.Equal(t, exitLost, holder.wait(t, 15*time.Second), "stderr: %s", holder.stderr.String())
	for len(st.Holders) > 0 {
		st = next()
	}
}
