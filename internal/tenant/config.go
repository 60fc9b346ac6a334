// Package tenant says who may use a shared broker and how much: caller
// identities (client certificates and bearer tokens), tenants with the key
// prefixes and quotas they get, and admins, as the tenants file lists them.
//
// The tenants file (broker --tenants FILE) is YAML:
//
//	tenants:
//	  - name: payments
//	    identities: ["cn:payments-api", "uri:spiffe://corp/ns/payments/sa/api", "token-sha256:<64 hex>"]
//	    prefixes: ["payments/"]
//	    max_holds: 1000
//	    max_sessions: 100
//	    acquire_rate: 200
//	    write_rate: 100
//	    write_bytes_rate: 1048576
//	    read_rate: 500
//	    consul_token_file: ""
//	admins: ["cn:platform-oncall"]
//
// Load checks it whole and names the line of every mistake; a Config is
// immutable, so a reload builds a new one and swaps it in only when it is
// valid.
package tenant

import (
	"fmt"
	"os"
	"strings"
)

// Config is a checked tenants file. It is immutable and safe for
// concurrent use.
type Config struct {
	// Path is the file it was read from.
	Path string
	// Tenants in file order.
	Tenants []*Tenant
	// Admins are the identities allowed to call AdminService.
	Admins []string

	byName map[string]*Tenant
	// exact maps certificate identities (cn:, uri:) to their tenant.
	exact map[string]*Tenant
	// tokens are the token identities, compared in constant time.
	tokens []tokenEntry
	// admins holds every admin identity; adminTokens the token ones again,
	// for constant-time comparison.
	admins      map[string]bool
	adminTokens []tokenEntry
}

// Tenant is one tenant of the file.
type Tenant struct {
	// Name is unique in the file; it is the tenant recorded in Consul and
	// the value of the metrics' tenant label.
	Name string
	// Identities are the callers who act for the tenant (canonical form).
	Identities []string
	// Prefixes are the keys and semaphore prefixes the tenant may use: a
	// key is allowed when it starts with one of them.
	Prefixes []string
	// MaxHolds caps the tenant's holds and waiters, however made: its
	// Acquire streams on one replica (until each hold is released; one
	// with a session id until granted), plus the holds of its
	// client-owned sessions on every replica; 0 means no cap.
	MaxHolds int
	// MaxSessions caps the tenant's client-owned sessions alive at once;
	// 0 means no cap.
	MaxSessions int
	// AcquireRate caps Acquire and TryAcquire calls per second on one
	// replica (a token bucket whose burst is the rate); 0 means no cap.
	AcquireRate float64
	// WriteRate caps the other calls that write to Consul, SetValue and
	// RenewSession, per second on one replica; 0 means no cap.
	WriteRate float64
	// WriteBytesRate caps the value bytes written per second on one
	// replica (SetValue, Acquire, TryAcquire; the burst is at least one
	// value of the largest size); 0 means no cap.
	WriteBytesRate float64
	// ReadRate caps the calls that read from Consul (GetLock,
	// CheckSequencer, GetSession, ListSessions, and Watch streams opened)
	// per second on one replica; 0 means no cap.
	ReadRate float64
	// ConsulTokenFile, when set, holds the tenant's own Consul ACL token
	// (read at load; relative paths are relative to the tenants file).
	ConsulTokenFile string
	// ConsulToken is the token read from ConsulTokenFile.
	ConsulToken Secret
	// Line is where the tenant starts in the file.
	Line int
}

// Allows reports whether the tenant may use key (a lock key, a semaphore
// prefix or a watched prefix: everything a prefix watch covers starts
// with its key).
func (t *Tenant) Allows(key string) bool {
	for _, p := range t.Prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// Tenant returns the tenant called name, or nil.
func (c *Config) Tenant(name string) *Tenant {
	if c == nil {
		return nil
	}
	return c.byName[name]
}

// Names lists the tenants' names in file order.
func (c *Config) Names() []string {
	if c == nil {
		return nil
	}
	out := make([]string, len(c.Tenants))
	for i, t := range c.Tenants {
		out[i] = t.Name
	}
	return out
}

// Load reads and checks the tenants file at path, and the Consul token
// files it names. The error names the file and line of each mistake.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	return Parse(path, data, os.ReadFile)
}

// Secret is a credential. It prints as "[redacted]" whatever the verb, in
// fmt, JSON and text encodings alike; Reveal gives the value.
type Secret string

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// GoString implements fmt.GoStringer.
func (s Secret) GoString() string { return s.String() }

// MarshalText implements encoding.TextMarshaler (JSON, zap, YAML).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
