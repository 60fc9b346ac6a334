// Package security tests lockbroker as a shared service, from outside:
// the broker binary with TLS, client certificates and a tenants file,
// against a real Consul with ACLs on (default deny) and the shipped
// policy, or serving HTTPS only.
package security

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
