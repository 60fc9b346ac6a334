package tenant

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"net/url"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/testpki"
)

func testConfig(t *testing.T) *Config {
	t.Helper()
	body := fmt.Sprintf(`
tenants:
  - name: a
    identities: ["cn:a-api", "uri:spiffe://corp/a", "%s"]
    prefixes: ["a/"]
  - name: b
    identities: ["cn:b-api"]
    prefixes: ["b/"]
admins: ["cn:oncall", "uri:spiffe://corp/a", "%s"]
`, TokenIdentity("token-a"), TokenIdentity("token-admin"))
	c, err := Parse("t.yaml", []byte(body), os.ReadFile)
	require.NoError(t, err)
	return c
}

// TestMatchToken: known tokens give their tenant or admin rights; an
// unknown one gives nothing; the identity is always the hash.
func TestMatchToken(t *testing.T) {
	c := testConfig(t)
	got, ok := c.MatchToken("token-a")
	require.True(t, ok)
	assert.Equal(t, "a", got.TenantName())
	assert.False(t, got.Admin)
	assert.Equal(t, TokenIdentity("token-a"), got.Identity)

	got, ok = c.MatchToken("token-admin")
	require.True(t, ok)
	assert.Nil(t, got.Tenant)
	assert.True(t, got.Admin)

	got, ok = c.MatchToken("token-b")
	assert.False(t, ok)
	assert.Nil(t, got.Tenant)
	assert.NotContains(t, got.Identity, "token-b")
}

// TestMatchCert: URI SANs before the CN; admin from any identity.
func TestMatchCert(t *testing.T) {
	c := testConfig(t)
	u, _ := url.Parse("spiffe://corp/a")
	tests := []struct {
		name     string
		cert     *x509.Certificate
		identity string
		tenant   string
		admin    bool
	}{
		{"cn", &x509.Certificate{Subject: pkix.Name{CommonName: "b-api"}}, "cn:b-api", "b", false},
		{"uri before cn", &x509.Certificate{Subject: pkix.Name{CommonName: "b-api"}, URIs: []*url.URL{u}}, "uri:spiffe://corp/a", "a", true},
		{"admin only", &x509.Certificate{Subject: pkix.Name{CommonName: "oncall"}}, "cn:oncall", "", true},
		{"stranger", &x509.Certificate{Subject: pkix.Name{CommonName: "mallory"}}, "cn:mallory", "", false},
		{"no names", &x509.Certificate{}, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, err := CertIdentities(tt.cert)
			require.NoError(t, err)
			got := c.MatchCert(ids)
			assert.Equal(t, tt.identity, got.Identity)
			assert.Equal(t, tt.tenant, got.TenantName())
			assert.Equal(t, tt.admin, got.Admin)
		})
	}
}

// TestCertWithTwoCNs: a subject with two Common Names is refused, whichever
// comes last (Go's parser keeps the last one as CommonName).
func TestCertWithTwoCNs(t *testing.T) {
	ca := testpki.NewCA(t, "test CA")
	cn := asn1.ObjectIdentifier{2, 5, 4, 3}
	p := ca.ClientSubject(t, pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: cn, Value: "alpha-api"}, {Type: cn, Value: "oncall"}}})
	require.Equal(t, "oncall", p.Cert.Subject.CommonName)
	ids, err := CertIdentities(p.Cert)
	require.ErrorIs(t, err, ErrAmbiguousCN)
	assert.Empty(t, ids)
	assert.Contains(t, err.Error(), "has 2")

	one, err := CertIdentities(ca.Client(t, "alpha-api").Cert)
	require.NoError(t, err)
	assert.Equal(t, []string{"cn:alpha-api"}, one)
}
