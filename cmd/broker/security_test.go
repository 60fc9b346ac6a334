package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockbroker/lockbroker/internal/testpki"
)

// TestSecurityFlags checks the TLS and tenants flags and how they go
// together.
func TestSecurityFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"tls", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}, ""},
		{"mtls", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"}, ""},
		{"cert without key", []string{"--tls-cert", "c.pem"}, "go together"},
		{"key without cert", []string{"--tls-key", "k.pem"}, "go together"},
		{"client CA without TLS", []string{"--tls-client-ca", "ca.pem"}, "needs --tls-cert"},
		{"tenants", []string{"--tenants", "t.yaml"}, ""},
		{"tenant conns", []string{"--tenant-consul-max-conns", "0"}, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

// TestSecurityStart checks that a bad tenants file or TLS file stops the
// broker with the file's line, and the start warnings.
func TestSecurityStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [lockbroker/]\n"), 0o600))
	c, err := parseFlags([]string{"--tenants", bad}, io.Discard)
	require.NoError(t, err)
	_, err = newSecurity(c, api.DefaultConfig(), zap.NewNop())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.yaml:4:")

	c, err = parseFlags([]string{"--tls-cert", filepath.Join(dir, "none.pem"), "--tls-key", filepath.Join(dir, "none-key.pem")}, io.Discard)
	require.NoError(t, err)
	_, err = newSecurity(c, api.DefaultConfig(), zap.NewNop())
	require.Error(t, err)

	ca := testpki.NewCA(t, "ca")
	certFile, keyFile := ca.Server(t, "broker").Write(t, dir, "broker")
	tests := []struct {
		name, listen string
		args         []string
		warn         string
	}{
		{"plaintext single-tenant on all interfaces", "0.0.0.0:8700", nil, "without TLS and without --tenants"},
		{"plaintext single-tenant on loopback", "127.0.0.1:8700", nil, ""},
		{"plaintext on localhost", "localhost:8700", nil, ""},
		{"TLS single-tenant without client CA", ":8700", []string{"--tls-cert", certFile, "--tls-key", keyFile}, "without --tls-client-ca or --tenants"},
		{"mTLS", "10.0.0.1:8700", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", ca.WriteCA(t, dir, "ca.pem")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
			require.NoError(t, err)
			core, logs := observer.New(zapcore.WarnLevel)
			s, err := newSecurity(c, api.DefaultConfig(), zap.New(core))
			require.NoError(t, err)
			s.warn(tt.listen)
			if tt.warn == "" {
				assert.Zero(t, logs.Len(), "%v", logs.All())
				return
			}
			require.Equal(t, 1, logs.Len())
			assert.Contains(t, logs.All()[0].Message, tt.warn)
		})
	}
}
