package lockctl_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testNestedLock runs a lockctl lock inside a lockctl lock, with the
// connection settings in the environment as a script would have them. The
// inner lockctl inherits the outer's settings and the outer's
// LOCKBROKER_KEY and LOCKBROKER_TOKEN (the lock's key and fencing token):
// it must read neither as its key file or bearer token, and its own
// command sees its own lock's key and token.
func testNestedLock(t *testing.T, h *harness) {
	env := []string{"LOCKBROKER_ADDR=" + h.broker.Addr}
	p := h.start(t, env, "--addr", h.broker.Addr, "lock", "lockctl-test/outer", "--",
		"sh", "-c", `echo "outer $LOCKBROKER_KEY $LOCKBROKER_TOKEN"; exec "$0" lock lockctl-test/inner -- sh -c 'echo "inner $LOCKBROKER_KEY $LOCKBROKER_TOKEN"'`,
		h.lockctl)
	code := p.wait(t, time.Minute)
	require.Equal(t, 0, code, "nested lockctl lock must succeed; stderr: %s", p.stderr.String())
	lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
	require.Len(t, lines, 2, p.stdout.String())
	outer, inner := strings.Fields(lines[0]), strings.Fields(lines[1])
	require.Len(t, outer, 3, lines[0])
	require.Len(t, inner, 3, lines[1])
	assert.Equal(t, []string{"outer", "lockctl-test/outer"}, outer[:2])
	assert.Equal(t, []string{"inner", "lockctl-test/inner"}, inner[:2])
	outerToken, err := strconv.ParseUint(outer[2], 10, 64)
	require.NoError(t, err)
	innerToken, err := strconv.ParseUint(inner[2], 10, 64)
	require.NoError(t, err)
	assert.Greater(t, innerToken, outerToken, "the inner lock is a later grant, with a token of its own")
	assert.Empty(t, p.stderr.String())
}
