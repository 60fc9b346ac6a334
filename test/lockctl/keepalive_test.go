package lockctl_test

import (
	"errors"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldForRE matches lockctl -v's lines that carry a guarantee ("acquired
// ... held for at least 9.2s", "renewed, held for at least 9.9s").
var heldForRE = regexp.MustCompile(`held for at least (\S+)`)

// TestLockGuaranteeEnforced pauses the broker (SIGSTOP) while lockctl runs
// a command that ignores SIGTERM. No keepalive comes any more, so lockctl
// must treat the lock as lost and have killed the command before the last
// guarantee it was given (arrival of the last keepalive + guaranteed_for)
// runs out, then exit 75. It uses a broker of its own.
func TestLockGuaranteeEnforced(t *testing.T) {
	h := newHarness(t)
	const grace = time.Second
	file := filepath.Join(t.TempDir(), "child")
	p := h.start(t, nil, "lock", "-v", "--ttl", "10s", "--grace", grace.String(), "lockctl-test/guarantee", "--",
		"sh", "-c", `trap '' TERM; echo $$ > "$0"; exec sleep 60`, file)
	pid, err := strconv.Atoi(p.waitFile(t, file)[0])
	require.NoError(t, err)
	// One keepalive after the grant, so that the broker is known to renew.
	require.Eventually(t, func() bool { return len(guarantees(p)) >= 2 }, 15*time.Second, 50*time.Millisecond,
		"no keepalive from the broker: %s", p.stderr.String())

	h.broker.Stop()
	stopped := time.Now()
	t.Cleanup(h.broker.Cont)
	code := p.wait(t, 20*time.Second)
	exited := time.Now()
	h.broker.Cont()

	g := guarantees(p)
	end := g[len(g)-1]
	assert.Equal(t, exitLost, code, "stderr: %s", p.stderr.String())
	assert.Contains(t, p.stderr.String(), "no keepalive from the broker")
	assert.True(t, exited.Before(end), "lockctl exited %v after the guarantee ended", exited.Sub(end))
	err = syscall.Kill(pid, 0)
	assert.True(t, errors.Is(err, syscall.ESRCH), "the command (pid %d) must be gone, kill(0) says %v", pid, err)
	t.Logf("broker paused; lockctl killed the command and exited %v later, %v before the guarantee ended",
		exited.Sub(stopped).Round(10*time.Millisecond), end.Sub(exited).Round(10*time.Millisecond))
}

// guarantees returns, for each line of p's stderr that carries a
// guarantee, when it ends as the test sees it: the line's arrival plus the
// duration it names (later than lockctl's own end by the pipe's delay).
func guarantees(p *proc) []time.Time {
	var out []time.Time
	for _, w := range p.stderr.stamped() {
		for _, m := range heldForRE.FindAllStringSubmatch(w.text, -1) {
			if d, err := time.ParseDuration(m[1]); err == nil {
				out = append(out, w.at.Add(d))
			}
		}
	}
	return out
}
