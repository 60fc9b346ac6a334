package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// lockArgs: the keys, flags and command of `lockctl lock`, the old
// single-key forms unchanged.
func TestLockArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		key     string
		keys    []string
		argv    []string
		read    bool
		timeout time.Duration
	}{
		{"old form, no --", []string{"k", "cmd", "a"}, "k", nil, []string{"cmd", "a"}, false, 0},
		{"old form, --", []string{"k", "--", "cmd", "a"}, "k", nil, []string{"cmd", "a"}, false, 0},
		{"old form, flags around the key", []string{"--try", "k", "--timeout", "2s", "cmd"}, "k", nil, []string{"cmd"}, false, 2 * time.Second},
		{"old form, the command's own flags and --", []string{"k", "sh", "-c", "exit 0", "--", "x"}, "k", nil, []string{"sh", "-c", "exit 0", "--", "x"}, false, 0},
		{"old form, -- inside a quoted argument", []string{"k", "sh", "-c", "echo -- x"}, "k", nil, []string{"sh", "-c", "echo -- x"}, false, 0},
		{"old form, the command's -- after its own flags", []string{"k", "--timeout", "1s", "rsync", "-a", "--", "src"}, "k", nil, []string{"rsync", "-a", "--", "src"}, false, time.Second},
		{"read", []string{"--read", "k", "--", "cmd"}, "k", nil, []string{"cmd"}, true, 0},
		{"read after the key, old form", []string{"k", "--read", "cmd"}, "k", nil, []string{"cmd"}, true, 0},
		{"several keys", []string{"a", "b", "c", "--", "cmd", "x"}, "a", []string{"b", "c"}, []string{"cmd", "x"}, false, 0},
		{"several keys, flags between", []string{"a", "--timeout", "3s", "b", "-v", "--", "cmd", "--", "y"}, "a", []string{"b"}, []string{"cmd", "--", "y"}, false, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &cli{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
			var f lockFlags
			key, argv, err := c.lockArgs(lockFlagSet(c, &f), &f, tt.args)
			require.NoError(t, err)
			assert.Equal(t, tt.key, key)
			assert.Equal(t, tt.keys, f.keys)
			assert.Equal(t, tt.argv, argv)
			assert.Equal(t, tt.read, f.read)
			assert.Equal(t, tt.timeout, f.timeout.d)
			assert.Equal(t, tt.timeout != 0, f.timeout.set)
			assert.Equal(t, 10*time.Second, f.grace, "defaults stay")
		})
	}
}

// The request carries the mode and the keys; the child's environment has
// every key's token.
func TestLockRequestAndEnv(t *testing.T) {
	f := lockFlags{read: true}
	req := f.request("k")
	assert.Equal(t, lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, req.GetKind())
	f = lockFlags{write: true}
	assert.Equal(t, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE, f.request("k").GetKind())
	f = lockFlags{keys: []string{"b", "c"}}
	req = f.request("a")
	assert.Equal(t, lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED, req.GetKind())
	assert.Equal(t, []string{"b", "c"}, req.GetKeys())

	seqs := []*lockbrokerv1.Sequencer{
		{Key: "a", SessionId: "s", Token: 5, LockIndex: 1},
		{Key: "b", SessionId: "s", Token: 9, LockIndex: 2},
		{Key: "c", SessionId: "s", Token: 7, LockIndex: 3},
	}
	env := envMap(seqEnv(seqs, &f))
	assert.Equal(t, "a", env["LOCKBROKER_KEY"])
	assert.Equal(t, "5", env["LOCKBROKER_TOKEN"])
	assert.Equal(t, "1", env["LOCKBROKER_LOCK_INDEX"])
	assert.Equal(t, "a\nb\nc", env["LOCKBROKER_KEYS"])
	assert.Equal(t, "5 9 7", env["LOCKBROKER_TOKENS"])
	assert.NotContains(t, env, "LOCKBROKER_MODE")
	assert.Equal(t, `"a" (token 5), "b" (token 9), "c" (token 7): session s`, grantText(seqs, &f))

	f = lockFlags{read: true}
	env = envMap(seqEnv(seqs[:1], &f))
	assert.Equal(t, "read", env["LOCKBROKER_MODE"])
	assert.Equal(t, "5", env["LOCKBROKER_TOKENS"])
	assert.Equal(t, `"a" (read): session s, token 5`, grantText(seqs[:1], &f))
}

func envMap(env []string) map[string]string {
	out := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// Combinations lockctl refuses before any call.
func TestLockModeUsageErrors(t *testing.T) {
	dead := closedAddr(t)
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"read and write", []string{"lock", "--read", "--write", "k", "--", "true"}, "lockctl: usage: --read and --write exclude each other"},
		{"read with -n", []string{"lock", "--read", "-n", "3", "k", "--", "true"}, "lockctl: usage: --read and --write take a read-write lock"},
		{"several keys with --write", []string{"lock", "--write", "a", "b", "--", "true"}, "lockctl: usage: several keys are a multi-key lock"},
		{"several keys with -n", []string{"lock", "-n", "2", "a", "b", "--", "true"}, "lockctl: usage: several keys are a multi-key lock"},
		{"keys but no command", []string{"lock", "a", "b", "--"}, "lockctl: usage: lock wants a command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"--addr", dead}, tt.args...), strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, exitError, code)
			assert.True(t, strings.HasPrefix(stderr.String(), tt.wantErr), "stderr %q, want prefix %q", stderr.String(), tt.wantErr)
		})
	}
	var stdout bytes.Buffer
	assert.Equal(t, exitOK, run(context.Background(), []string{"lock", "a", "b", "--help", "--", "x"}, strings.NewReader(""), &stdout, io.Discard))
	assert.Equal(t, 1, strings.Count(stdout.String(), "Usage: lockctl lock"), "help printed once")
	assert.Contains(t, stdout.String(), "LOCKBROKER_TOKENS")
}
