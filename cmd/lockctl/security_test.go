package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSecurityFlagsWithoutBroker covers the TLS and token flags' own
// errors: a token is never sent in clear to a broker off loopback, a
// certificate needs its key, a CA file must exist, an address needs a
// port; each is reported as a mistake in the settings, not as UNAVAILABLE;
// the token never shows in an error.
func TestSecurityFlagsWithoutBroker(t *testing.T) {
	const token = "token-never-printed-1234"
	tests := []struct {
		name, want string
		args       []string
		env        map[string]string
	}{
		{"token in clear off loopback", "only over TLS", []string{"--addr", "192.0.2.1:8700", "--token", token, "get", "k"}, nil},
		{"token from env in clear off loopback", "only over TLS", []string{"--addr", "192.0.2.1:8700", "get", "k"}, map[string]string{"LOCKBROKER_BEARER_TOKEN": token}},
		{"LOCKBROKER_KEY is not the key file", "--cert and --key go together", []string{"--cert", "c.pem", "get", "k"}, map[string]string{"LOCKBROKER_KEY": "lock/key"}},
		{"cert without key", "--cert and --key go together", []string{"--cert", "c.pem", "get", "k"}, nil},
		{"missing CA file", "lockctl: configuration: CA certificate", []string{"--cacert", "/nonexistent/ca.pem", "get", "k"}, nil},
		{"missing client certificate", "lockctl: configuration: client certificate", []string{"--cert", "/nonexistent/c.pem", "--key", "/nonexistent/k.pem", "get", "k"}, nil},
		{"address without port", `lockctl: configuration: --addr "broker"`, []string{"--addr", "broker", "get", "k"}, nil},
		{"address with a bad port", `lockctl: configuration: --addr "broker:http"`, []string{"--addr", "127.0.0.1:8700,broker:http", "get", "k"}, nil},
		{"admin without subcommand", "admin wants", []string{"admin"}, nil},
		{"admin unknown", "unknown admin command", []string{"admin", "nuke"}, nil},
		{"force-release without key", "force-release wants KEY", []string{"admin", "force-release"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, exitError, code)
			require.Contains(t, stderr.String(), tt.want)
			assert.NotContains(t, stderr.String(), "UNAVAILABLE", "a mistake in the settings is not the broker's")
			assert.NotContains(t, stderr.String()+stdout.String(), token)
		})
	}
}

// TestOldTokenVariableHint: a caller still setting $LOCKBROKER_TOKEN for
// its bearer token (which lockctl no longer reads: under lockctl lock it
// is the fencing token) is told so when the broker refuses it
// UNAUTHENTICATED.
func TestOldTokenVariableHint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return status.Error(codes.Unauthenticated, "no identity") // as a shared broker answers a stranger
	}))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	t.Setenv("LOCKBROKER_TOKEN", "42")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--addr", lis.Addr().String(), "get", "k"}, strings.NewReader(""), &stdout, &stderr)
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr.String(), "lockctl: UNAUTHENTICATED: no identity ($LOCKBROKER_TOKEN is not read as the bearer token: set $LOCKBROKER_BEARER_TOKEN)")

	t.Setenv("LOCKBROKER_BEARER_TOKEN", "secret")
	stderr.Reset()
	code = run(context.Background(), []string{"--addr", lis.Addr().String(), "get", "k"}, strings.NewReader(""), &stdout, &stderr)
	assert.Equal(t, exitError, code)
	assert.Equal(t, "lockctl: UNAUTHENTICATED: no identity\n", stderr.String(), "no hint once the bearer token is set")
}
