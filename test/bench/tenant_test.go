package bench

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// tableTenant adds the uncontended cycle of a shared broker's tenant to
// the table: a second broker binary with a tenants file, called with a
// tenant's bearer token.
var tableTenant = flag.Bool("table.tenant", true, "add the uncontended cycle of a tenant of a shared broker (a second broker binary with --tenants, called with a bearer token)")

// tenantEnv is e with its broker swapped for a second broker binary, on
// the same agent, that serves one tenant "bench" (prefix bench/) from a
// tenants file; its client calls as that tenant. The rows it measures
// read that broker's Consul calls, allocations and CPU.
func (e *env) tenantEnv() *env {
	e.t.Helper()
	const token = "bench-tenant-token"
	path := filepath.Join(e.t.TempDir(), "tenants.yaml")
	body := fmt.Sprintf("tenants:\n  - name: bench\n    identities: [%q]\n    prefixes: [\"bench/\"]\n", tenant.TokenIdentity(token))
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		e.t.Fatal(err)
	}
	te := &env{t: e.t, agent: e.agent, ac: e.ac, counter: e.counter, anchorTr: e.anchorTr, pid: e.pid,
		streamErrs: &run{}, lossReasons: map[string]int{}}
	// The token goes with every call over plaintext loopback, as the
	// broker allows and the Go client library sends it.
	te.bd, te.proc = startProcess(e.t, e.agent, []string{"--tenants", path}, client.WithToken(token), client.WithTokenOverPlaintext())
	te.store = te.proc
	return te
}
