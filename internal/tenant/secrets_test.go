package tenant

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseErrorsNeverShowSecrets goes through every error path of the
// tenants file with a bearer token and a Consul token in the places an
// operator may paste them by mistake (an identity written as the token or
// as "Bearer <token>", a token where a consul_token_file path belongs, a
// token file with junk around the token) or rightly (the token files):
// each file is refused and no error shows either token.
func TestParseErrorsNeverShowSecrets(t *testing.T) {
	const (
		bearer = "s3cret-bearer-5f0e9d1c7a2b"
		consul = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
	)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ok.token"), []byte(consul+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.token"), []byte("token: "+consul+"\n"+bearer+"\n"), 0o600))
	hash := TokenIdentity(bearer)
	// good is a tenant that needs the token file; the cases add to it.
	good := "tenants:\n  - name: good\n    identities: [\"" + hash + "\"]\n    prefixes: [good/]\n    consul_token_file: ok.token\n"
	tests := []struct{ name, body string }{
		{"identity is Bearer token", good + "  - name: a\n    identities: [\"Bearer " + bearer + "\"]\n    prefixes: [a/]\n"},
		{"identity is the token", good + "  - name: a\n    identities: [\"" + bearer + "\"]\n    prefixes: [a/]\n"},
		{"identity is the consul token", good + "  - name: a\n    identities: [\"" + consul + "\"]\n    prefixes: [a/]\n"},
		{"token-sha256 of the token itself", good + "  - name: a\n    identities: [\"token-sha256:" + bearer + "\"]\n    prefixes: [a/]\n"},
		{"identity with a colon", good + "  - name: a\n    identities: [\"" + bearer + ":x\"]\n    prefixes: [a/]\n"},
		{"empty cn", good + "  - name: a\n    identities: [\"cn:\"]\n    prefixes: [a/]\n"},
		{"empty uri", good + "  - name: a\n    identities: [\"uri:\"]\n    prefixes: [a/]\n"},
		{"control character", good + "  - name: a\n    identities: [\"cn:a\\tb\"]\n    prefixes: [a/]\n"},
		{"identity not a string", good + "  - name: a\n    identities: [[x]]\n    prefixes: [a/]\n"},
		{"admin is Bearer token", good + "admins: [\"Bearer " + bearer + "\"]\n"},
		{"admin is the token", good + "admins: [\"" + bearer + "\"]\n"},
		{"admin is token-sha256 of the token", good + "admins: [\"token-sha256:" + bearer + "\"]\n"},
		{"admin twice", good + "admins: [\"" + hash + "\", \"" + hash + "\"]\n"},
		{"token file path is the token", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: \"" + consul + "\"\n"},
		{"token file path is the bearer token", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: \"" + bearer + "\"\n"},
		{"token file path is an absolute token", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: \"/" + consul + "\"\n"},
		{"token file with junk", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: junk.token\n"},
		{"token file not a string", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    consul_token_file: [ok.token]\n"},
		{"identity in two tenants", good + "  - name: a\n    identities: [\"" + hash + "\"]\n    prefixes: [a/]\n"},
		{"overlapping prefixes", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [goo]\n"},
		{"duplicate tenant", good + "  - name: good\n    identities: [cn:a]\n    prefixes: [a/]\n"},
		{"no name", good + "  - identities: [cn:a]\n    prefixes: [a/]\n"},
		{"bad name", good + "  - name: 'a b'\n    identities: [cn:a]\n    prefixes: [a/]\n"},
		{"no identities", good + "  - name: a\n    identities: []\n    prefixes: [a/]\n"},
		{"no prefixes", good + "  - name: a\n    identities: [cn:a]\n"},
		{"bad prefix", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [lockbroker/x]\n"},
		{"bad quota", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    max_holds: -1\n"},
		{"bad rate", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    acquire_rate: fast\n"},
		{"unknown key", good + "  - name: a\n    identities: [cn:a]\n    prefixes: [a/]\n    token: x\n"},
		{"key twice", good + "  - name: a\n    identities: [cn:a]\n    identities: [cn:b]\n    prefixes: [a/]\n"},
		{"tenant not a mapping", good + "  - x\n"},
		{"tenants not a list", "tenants: x\nadmins: [\"Bearer " + bearer + "\"]\n"},
		{"yaml syntax on the token's line", good + "admins: [\"" + bearer + "\"\n  - 'x\n"},
		{"yaml syntax, unquoted Bearer", "tenants:\n  - name: a\n    identities: Bearer: " + bearer + "\n"},
		{"empty", ""},
		{"nothing", "tenants: []\nadmins: []\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(filepath.Join(dir, "t.yaml"), []byte(tt.body), os.ReadFile)
			require.Error(t, err)
			msg := err.Error()
			assert.NotContains(t, msg, bearer)
			assert.NotContains(t, msg, consul)
			// Nor a recognisable part of either.
			assert.NotContains(t, msg, bearer[:12])
			assert.NotContains(t, msg, consul[:13])
			assert.False(t, strings.Contains(msg, "\n\n"), msg)
		})
	}
}
