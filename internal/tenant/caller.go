package tenant

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"
)

// Caller is who made a call, as the tenants file knows them.
type Caller struct {
	// Identity is the identity the caller is known by: the one that names
	// its tenant, else an admin identity, else the first it presented.
	// Never a token: a bearer token appears as token-sha256:<hex>.
	Identity string
	// Tenant is the caller's tenant; nil when none of its identities
	// belongs to one.
	Tenant *Tenant
	// Admin: one of the caller's identities is listed in admins.
	Admin bool
}

// TenantName is the caller's tenant's name, "" without one.
func (c Caller) TenantName() string {
	if c.Tenant == nil {
		return ""
	}
	return c.Tenant.Name
}

// tokenEntry is a token identity, kept as the raw hash for constant-time
// comparison.
type tokenEntry struct {
	hash   [sha256.Size]byte
	id     string
	tenant *Tenant // nil for an admin-only token
}

func newTokenEntry(id string, t *Tenant) tokenEntry {
	e := tokenEntry{id: id, tenant: t}
	_, _ = hex.Decode(e.hash[:], []byte(strings.TrimPrefix(id, KindToken))) // checked by ParseIdentity
	return e
}

// owner returns the tenant an identity belongs to, or nil.
func (c *Config) owner(id string) *Tenant {
	if t := c.exact[id]; t != nil {
		return t
	}
	for _, e := range c.tokens {
		if e.id == id {
			return e.tenant
		}
	}
	return nil
}

// MatchToken looks a bearer token up: its hash is compared with every
// token identity of the file (tenants' and admins') in constant time,
// all of them every time, so the time taken says nothing about which
// entry, or how much of one, matched. It returns the caller and whether
// the token is known.
func (c *Config) MatchToken(token string) (Caller, bool) {
	sum := sha256.Sum256([]byte(token))
	id := KindToken + hex.EncodeToString(sum[:])
	var (
		found  int
		tenant *Tenant
	)
	for i := range c.tokens {
		eq := subtle.ConstantTimeCompare(sum[:], c.tokens[i].hash[:])
		if eq == 1 {
			tenant = c.tokens[i].tenant
		}
		found |= eq
	}
	// Admin token identities are compared the same way.
	admin := 0
	for i := range c.adminTokens {
		admin |= subtle.ConstantTimeCompare(sum[:], c.adminTokens[i].hash[:])
	}
	if found|admin == 0 {
		return Caller{Identity: id}, false
	}
	return Caller{Identity: id, Tenant: tenant, Admin: admin == 1}, true
}

// MatchCert looks up the identities of a verified client certificate (see
// CertIdentities, most specific first). The tenant comes from the first
// identity that belongs to one; the caller is an admin when any identity
// is. A certificate the file does not know still gives a Caller (with its
// first identity), which may do nothing.
func (c *Config) MatchCert(ids []string) Caller {
	var out Caller
	for _, id := range ids {
		if t := c.exact[id]; t != nil && out.Tenant == nil {
			out.Tenant, out.Identity = t, id
		}
		if c.admins[id] {
			if !out.Admin && out.Tenant == nil {
				out.Identity = id
			}
			out.Admin = true
		}
	}
	if out.Identity == "" && len(ids) > 0 {
		out.Identity = ids[0]
	}
	return out
}
