package tenant

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
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
// when it has one. A certificate whose subject has more than one Common
// Name is refused whole (ErrAmbiguousCN): Go's parser keeps the last, a
// CA's name constraints or a reviewer may look at the first, and no rule
// a CA could be expected to follow says which one names the client.
func CertIdentities(cert *x509.Certificate) ([]string, error) {
	if cert == nil {
		return nil, nil
	}
	if n := commonNames(cert); n > 1 {
		return nil, fmt.Errorf("%w: the subject has %d", ErrAmbiguousCN, n)
	}
	var ids []string
	for _, u := range cert.URIs {
		ids = append(ids, KindURI+u.String())
	}
	if cn := cert.Subject.CommonName; cn != "" {
		ids = append(ids, KindCN+cn)
	}
	return ids, nil
}

// ErrAmbiguousCN refuses a client certificate with several Common Names.
var ErrAmbiguousCN = errors.New("client certificate with more than one Common Name (CN): ambiguous, refused")

// oidCommonName is the X.520 commonName attribute type.
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// commonNames counts the CN attributes of cert's subject.
func commonNames(cert *x509.Certificate) int {
	n := 0
	for _, atv := range cert.Subject.Names {
		if atv.Type.Equal(oidCommonName) {
			n++
		}
	}
	return n
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
		// Not shown: it may be a bearer token ("Bearer <token>") pasted
		// where its SHA-256 belongs.
		return "", fmt.Errorf("identity %s(the rest not shown: %d characters) is of no known kind: want cn:NAME, uri:URI or token-sha256:HEX, the hex SHA-256 of a bearer token, never the token itself", kindOf(s), len(s))
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "", fmt.Errorf("identity %q: control character", s)
		}
	}
	return s, nil
}

// kindOf is what an identity of no known kind may show of itself: its
// kind (`dns:`) when it starts with a short word and a colon, else
// nothing.
func kindOf(s string) string {
	kind, _, ok := strings.Cut(s, ":")
	if !ok || kind == "" || len(kind) > 16 {
		return ""
	}
	for _, r := range kind {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-') {
			return ""
		}
	}
	return fmt.Sprintf("of kind %q ", kind+":")
}
