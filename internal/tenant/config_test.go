package tenant

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const goodFile = `
tenants:
  - name: payments
    identities: ["cn:payments-api", "uri:spiffe://corp/ns/payments/sa/api", "token-sha256:%s"]
    prefixes: ["payments/"]
    max_holds: 1000
    max_sessions: 100
    acquire_rate: 200
    consul_token_file: "payments.token"
  - name: orders
    identities:
      - cn:orders
    prefixes: ["orders/", "shared/"]
admins: ["cn:platform-oncall", "token-sha256:%s"]
`

// TestParseGood reads a complete file: every field, token identities in
// canonical form, the token file relative to the tenants file.
func TestParseGood(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "payments.token"), []byte("consul-secret-1\n"), 0o600))
	path := filepath.Join(dir, "tenants.yaml")
	payTok, adminTok := TokenIdentity("pay-bearer"), TokenIdentity("admin-bearer")
	body := fmt.Sprintf(goodFile, strings.ToUpper(strings.TrimPrefix(payTok, KindToken)), strings.TrimPrefix(adminTok, KindToken))
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))

	c, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, []string{"payments", "orders"}, c.Names())
	pay := c.Tenant("payments")
	require.NotNil(t, pay)
	assert.Equal(t, []string{"cn:payments-api", "uri:spiffe://corp/ns/payments/sa/api", payTok}, pay.Identities)
	assert.Equal(t, 1000, pay.MaxHolds)
	assert.Equal(t, 100, pay.MaxSessions)
	assert.InDelta(t, 200, pay.AcquireRate, 0)
	assert.Equal(t, "consul-secret-1", pay.ConsulToken.Reveal())
	assert.Equal(t, 3, pay.Line)
	assert.Equal(t, []string{"orders/", "shared/"}, c.Tenant("orders").Prefixes)
	assert.Empty(t, c.Tenant("orders").ConsulToken)
	assert.Equal(t, []string{"cn:platform-oncall", adminTok}, c.Admins)

	// The token never prints.
	for _, s := range []string{fmt.Sprint(pay), fmt.Sprintf("%+v", *pay), fmt.Sprintf("%#v", *pay)} {
		assert.NotContains(t, s, "consul-secret-1")
	}
}

// TestParseErrors proves that each mistake is refused with the line it is
// on.
func TestParseErrors(t *testing.T) {
	tok := strings.TrimPrefix(TokenIdentity("x"), KindToken)
	tests := []struct {
		name, body string
		line       int
		want       string
	}{
		{"empty", "", 1, "empty file"},
		{"syntax", "admins: [cn:a]\ntenants: 'x\n", 2, "yaml"},
		{"unknown top key", "tenant:\n  - name: a\n", 1, `unknown key "tenant"`},
		{"unknown tenant key", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    max_hold: 3\n", 5, `unknown key "max_hold"`},
		{"no name", "tenants:\n  - identities: [cn:a]\n    prefixes: [a/]\n", 2, "without a name"},
		{"bad name", "tenants:\n  - name: 'a b'\n    identities: [cn:a]\n    prefixes: [a/]\n", 2, "tenant name"},
		{"duplicate name", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n  - name: a\n    identities: [cn:b]\n    prefixes: [b/]\n", 5, "already defined on line 2"},
		{"no identities", "tenants:\n  - name: a\n    identities: []\n    prefixes: [a/]\n", 3, "no identities"},
		{"bad identity", "tenants:\n  - name: a\n    identities:\n      - cn:a\n      - dns:a\n    prefixes: [a/]\n", 5, `of kind "dns:"`},
		{"short token hash", "tenants:\n  - name: a\n    identities: ['token-sha256:abc']\n    prefixes: [a/]\n", 3, "64 hex digits"},
		{"identity in two tenants", "tenants:\n  - name: a\n    identities: [cn:x]\n    prefixes: [a/]\n  - name: b\n    identities: [cn:x]\n    prefixes: [b/]\n", 5, `already belongs to tenant "a" (line 2)`},
		{"token in two tenants", fmt.Sprintf("tenants:\n  - name: a\n    identities: [token-sha256:%s]\n    prefixes: [a/]\n  - name: b\n    identities: [token-sha256:%s]\n    prefixes: [b/]\n", tok, strings.ToUpper(tok)), 5, "already belongs"},
		{"no prefixes", "tenants:\n  - name: a\n    identities: [cn:a]\n", 2, "no prefixes"},
		{"broker prefix", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/, lockbroker/sessions/]\n", 4, "broker's own prefix"},
		{"prefix covering the broker's", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes:\n      - lock\n", 5, "broker's own prefix"},
		{"empty prefix", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: ['']\n", 4, "every key"},
		{"leading slash", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [/a]\n", 4, `starts with "/"`},
		{"negative quota", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    max_sessions: -1\n", 5, "max_sessions"},
		{"quota not a number", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    max_holds: many\n", 5, "max_holds"},
		{"rate not a number", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    acquire_rate: fast\n", 5, "acquire_rate"},
		{"missing token file", "tenants:\n  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: nope.token\n", 5, "consul_token_file"},
		{"tenants not a list", "tenants: a\n", 1, "want a list"},
		{"admin identity", "admins: [root]\n", 1, "no known kind"},
		{"admin twice", "admins: [cn:a, cn:a]\n", 1, "already listed"},
		{"nothing", "tenants: []\nadmins: []\n", 1, "no tenants and no admins"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.body), os.ReadFile)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			var le *LineError
			if errors.As(err, &le) {
				assert.Equal(t, tt.line, le.Line, err.Error())
				assert.Contains(t, err.Error(), fmt.Sprintf("t.yaml:%d: ", tt.line))
			} else {
				assert.Contains(t, err.Error(), fmt.Sprintf("line %d", tt.line))
			}
		})
	}
}

// TestParseReportsEveryMistake: one run names all the bad lines.
func TestParseReportsEveryMistake(t *testing.T) {
	_, err := Parse("t.yaml", []byte("tenants:\n  - name: a\n    identities: [x]\n    prefixes: [lockbroker/]\n    max_holds: -3\n"), os.ReadFile)
	require.Error(t, err)
	for _, line := range []string{"t.yaml:3:", "t.yaml:4:", "t.yaml:5:"} {
		assert.Contains(t, err.Error(), line)
	}
}

// TestTokenFileNeverQuoted: a token file with junk is refused without
// printing it, and a token pasted into the file as a hash is not quoted.
func TestTokenFileNeverQuoted(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.token"), []byte("secret-a\nsecret-b\n"), 0o600))
	path := filepath.Join(dir, "t.yaml")
	_, err := Parse(path, []byte("tenants:\n  - name: a\n    identities: ['token-sha256:my-bearer-secret']\n    prefixes: [a/]\n    consul_token_file: bad.token\n"), os.ReadFile)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "secret-a")
	assert.NotContains(t, err.Error(), "my-bearer-secret")
	assert.Contains(t, err.Error(), "t.yaml:3:")
	assert.Contains(t, err.Error(), "t.yaml:5:")
}

// TestAllows: a key is allowed when it starts with one of the prefixes.
func TestAllows(t *testing.T) {
	tn := &Tenant{Prefixes: []string{"payments/", "jobs"}}
	for key, want := range map[string]bool{
		"payments/x": true, "payments/": true, "payments": false, "orders/x": false,
		"jobs": true, "jobs/a": true, "jobsx": true, "lockbroker/sessions/x": false,
	} {
		assert.Equal(t, want, tn.Allows(key), key)
	}
}

// TestOverlappingPrefixes: prefixes of two tenants that overlap ("pay"
// would let its tenant take "payroll/" keys) are refused, naming both
// tenants and both prefixes; one tenant's own prefixes may overlap.
func TestOverlappingPrefixes(t *testing.T) {
	tests := []struct {
		name, a, b string
	}{
		{"shorter first", "pay", "payroll/"},
		{"longer first", "payroll/", "pay"},
		{"equal", "jobs/", "jobs/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := fmt.Sprintf("tenants:\n  - name: one\n    identities: [cn:one]\n    prefixes: [x/, %q]\n  - name: two\n    identities: [cn:two]\n    prefixes: [%q]\n", tt.a, tt.b)
			_, err := Parse("t.yaml", []byte(body), os.ReadFile)
			require.Error(t, err)
			for _, want := range []string{"t.yaml:5:", `tenant "two"`, `tenant "one"`, fmt.Sprintf("%q", tt.a), fmt.Sprintf("%q", tt.b), "(line 2)"} {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
	_, err := Parse("t.yaml", []byte("tenants:\n  - name: one\n    identities: [cn:one]\n    prefixes: [pay, payroll/]\n  - name: two\n    identities: [cn:two]\n    prefixes: [pa/]\n"), os.ReadFile)
	require.NoError(t, err, "one tenant's own prefixes may overlap; pa/ and pay do not")
}
