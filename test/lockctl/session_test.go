package lockctl_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWorkflows runs, on one broker, the workflows lockctl completes
// beyond lock: nesting, client-owned sessions, and a TLS mismatch.
func TestWorkflows(t *testing.T) {
	h := newHarness(t)
	t.Run("NestedLock", func(t *testing.T) { testNestedLock(t, h) })
	t.Run("ClientOwnedSession", func(t *testing.T) { testClientOwnedSession(t, h) })
	t.Run("TLSMismatch", func(t *testing.T) { testTLSMismatch(t, h) })
}

// testClientOwnedSession is the cron-job workflow without a
// stream: create sessions, take a key with try-acquire and acquire, list
// the sessions with what they hold, wait on a busy key, release, destroy.
// The holds outlive the lockctl that took them.
func testClientOwnedSession(t *testing.T, h *harness) {
	const key = "lockctl-test/client-owned"
	newSession := func() string {
		code, stdout, stderr := h.run(t, nil, "session", "create", "--ttl", "30s", "--lock-delay", "0s", "--name", "cron")
		require.Equal(t, 0, code, stderr)
		id := strings.TrimSpace(stdout)
		require.Regexp(t, uuidRE, id)
		t.Cleanup(func() { h.run(t, nil, "session", "destroy", id) })
		return id
	}
	grant := func(stdout string) (string, uint64, string) {
		f := strings.Fields(stdout)
		require.Len(t, f, 3, "want KEY TOKEN SESSION, got %q", stdout)
		token, err := strconv.ParseUint(f[1], 10, 64)
		require.NoError(t, err)
		return f[0], token, f[2]
	}
	a, b := newSession(), newSession()

	code, stdout, stderr := h.run(t, nil, "try-acquire", key, a)
	require.Equal(t, 0, code, stderr)
	k, tokenA, s := grant(stdout)
	assert.Equal(t, key, k)
	assert.Equal(t, a, s)

	code, stdout, stderr = h.run(t, nil, "session", "list")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `(?m)^`+a+` +client +30s +cron +"`+key+`" \(token `+strconv.FormatUint(tokenA, 10)+`\)$`, stdout)
	assert.Regexp(t, `(?m)^`+b+` +client +30s +cron +-$`, stdout)
	code, stdout, stderr = h.run(t, nil, "session", "list", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, `"id":"`+a+`"`)

	code, _, stderr = h.run(t, nil, "try-acquire", key, b)
	assert.Equal(t, exitBusy, code, stderr)
	assert.Contains(t, stderr, a, "a busy key names its holder")
	code, _, stderr = h.run(t, nil, "acquire", key, b, "--timeout", "0s")
	assert.Equal(t, exitBusy, code, stderr)
	code, _, stderr = h.run(t, nil, "acquire", key, b, "--timeout", "500ms")
	assert.Equal(t, exitTimeout, code, stderr)

	// The waiter gets the key once a releases it, whether its Acquire
	// arrived before the release (it waits) or after (the key is free).
	waiter := h.start(t, nil, "acquire", key, b)
	code, stdout, stderr = h.run(t, nil, "release", key, a)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "released")
	require.Equal(t, 0, waiter.wait(t, 30*time.Second), waiter.stderr.String())
	_, tokenB, s := grant(waiter.stdout.String())
	assert.Equal(t, b, s)
	assert.Greater(t, tokenB, tokenA)

	// The hold outlived the lockctl that took it.
	code, stdout, stderr = h.run(t, nil, "get", key)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "session "+b)
	// Taking it again with the same session gives the same grant back.
	code, stdout, stderr = h.run(t, nil, "try-acquire", key, b)
	require.Equal(t, 0, code, stderr)
	_, again, _ := grant(stdout)
	assert.Equal(t, tokenB, again)

	code, _, stderr = h.run(t, nil, "session", "destroy", b)
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr = h.run(t, nil, "get", key)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "free")
}

// testTLSMismatch: TLS against a plaintext broker fails its
// handshake, and lockctl says the TLS settings do not match the broker's.
func testTLSMismatch(t *testing.T, h *harness) {
	code, _, stderr := h.run(t, nil, "--tls", "--connect-timeout", "10s", "get", "lockctl-test/tls")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "authentication handshake failed")
	assert.Contains(t, stderr, "(the TLS settings, --tls, --cacert, --cert, do not match the broker's)")
}
