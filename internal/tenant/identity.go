package tenant

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// Identity kinds: the prefixes of an identity string.
const (
	// KindCN names a client certificate by its Subject Common Name.
	KindCN = "cn:"
	// KindURI names a client certificate by one of its URI SANs (a SPIFFE
	// ID, for instance).
	KindURI = "uri:"
	// KindToken names a bearer token by the hex SHA-256 of the token, so
	// the tenants file and the logs never hold a token itself.
	KindToken = "token-sha256:"
)

// TokenIdentity is the identity of a bearer token:
// "token-sha256:<lower-case hex of SHA-256(token)>".
func TokenIdentity(token string) string {
	sum := sha256.Sum256([]byte(token))
	return KindToken + hex.EncodeToString(sum[:])
}

// CertIdentities are the identities of a verified client certificate, most
// specific first: "uri:<SAN>" for each URI SAN, then "cn:<Common Name>"
// when it has one.
func CertIdentities(cert *x509.Certificate) []string {
	if cert == nil {
		return nil
	}
	var ids []string
	for _, u := range cert.URIs {
		ids = append(ids, KindURI+u.String())
	}
	if cn := cert.Subject.CommonName; cn != "" {
		ids = append(ids, KindCN+cn)
	}
	return ids
}

// ParseIdentity checks an identity as written in the tenants file and
// returns it in canonical form (token hashes in lower case).
func ParseIdentity(s string) (string, error) {
	switch {
	case strings.HasPrefix(s, KindCN):
		if len(s) == len(KindCN) {
			return "", fmt.Errorf("identity %q: empty common name", s)
		}
	case strings.HasPrefix(s, KindURI):
		if len(s) == len(KindURI) {
			return "", fmt.Errorf("identity %q: empty URI", s)
		}
	case strings.HasPrefix(s, KindToken):
		h := strings.ToLower(s[len(KindToken):])
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			// Not quoted: a token pasted here by mistake must not reach a log.
			return "", fmt.Errorf("identity %s...: want 64 hex digits (the SHA-256 of the token), got %d characters", KindToken, len(h))
		}
		return KindToken + h, nil
	default:
		return "", fmt.Errorf("identity %q: want cn:NAME, uri:URI or token-sha256:HEX", s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "", fmt.Errorf("identity %q: control character", s)
		}
	}
	return s, nil
}
