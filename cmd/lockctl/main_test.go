package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestRunWithoutBroker covers everything lockctl decides before or
// without a broker: help, usage errors, exit codes and the one-line errors.
// (test/lockctl runs it against a real broker.)
func TestRunWithoutBroker(t *testing.T) {
	dead := closedAddr(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    string // substring of stdout
		wantErr    string // prefix of stderr, which must be one line if set
		wantErrSub string // substring of stderr
	}{
		{name: "help", args: []string{"--help"}, wantOut: "Exit codes:"},
		{name: "version", args: []string{"--version"}, wantOut: "lockctl "},
		{name: "lock help", args: []string{"lock", "--help"}, wantOut: "Usage: lockctl lock KEY"},
		{name: "lock help lists codes", args: []string{"lock", "-h"}, wantOut: "75   lock: the lock was lost"},
		{name: "get help", args: []string{"get", "--help"}, wantOut: "Usage: lockctl get KEY"},
		{name: "watch help", args: []string{"watch", "--help"}, wantOut: "--prefix"},
		{name: "release help", args: []string{"release", "--help"}, wantOut: "Usage: lockctl release KEY SESSION"},
		{name: "session help", args: []string{"session", "--help"}, wantOut: "session create"},
		{name: "session create help", args: []string{"session", "create", "--help"}, wantOut: "--behavior"},
		{name: "health help", args: []string{"health", "--help"}, wantOut: "--http"},
		{name: "no command", args: nil, wantCode: 1, wantErr: "lockctl: usage: missing command"},
		{name: "unknown command", args: []string{"frob"}, wantCode: 1, wantErr: `lockctl: usage: unknown command "frob"`},
		{name: "unknown flag", args: []string{"get", "--frob", "k"}, wantCode: 1, wantErr: "lockctl: usage: flag provided but not defined: -frob"},
		{name: "get without key", args: []string{"get"}, wantCode: 1, wantErr: "lockctl: usage: get wants KEY"},
		{name: "release one arg", args: []string{"release", "k"}, wantCode: 1, wantErr: "lockctl: usage: release wants KEY SESSION"},
		{name: "lock without command", args: []string{"lock", "k", "--try"}, wantCode: 1, wantErr: "lockctl: usage: lock wants a command"},
		{name: "lock try and timeout", args: []string{"lock", "--try", "k", "--timeout", "1s", "--", "true"}, wantCode: 1, wantErr: "lockctl: usage: --try and --timeout"},
		{name: "lock bad duration", args: []string{"lock", "--ttl", "soon", "k", "true"}, wantCode: 1, wantErr: "lockctl: usage: invalid value \"soon\" for flag -ttl"},
		{name: "lock unknown program", args: []string{"lock", "k", "-n", "2", "--", "lockctl-no-such-program"}, wantCode: 1, wantErrSub: "executable file not found"},
		{name: "session bad behavior", args: []string{"session", "create", "--behavior", "keep"}, wantCode: 1, wantErr: "lockctl: usage: --behavior must be release or delete"},
		{name: "unreachable", args: []string{"--addr", dead, "get", "k"}, wantCode: 1, wantErr: "lockctl: UNAVAILABLE: no broker reachable: " + dead},
		{name: "unreachable, flags after key", args: []string{"lock", "k", "-n", "2", "--addr", dead + "," + dead, "sh", "-c", "exit 3"}, wantCode: 1, wantErrSub: dead + ": "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("LOCKBROKER_ADDR", dead)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code, "stderr: %s", stderr.String())
			assert.Contains(t, stdout.String(), tt.wantOut)
			if tt.wantErr != "" {
				assert.True(t, strings.HasPrefix(stderr.String(), tt.wantErr), "stderr %q, want prefix %q", stderr.String(), tt.wantErr)
				assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %q", stderr.String())
			}
			assert.Contains(t, stderr.String(), tt.wantErrSub)
			if tt.wantCode == 0 {
				assert.Empty(t, stderr.String())
			}
		})
	}
}
