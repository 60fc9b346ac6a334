package consultest

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"
)

// Option customizes an Agent started by Start.
type Option func(*ProcessConfig)

// WithBinary runs the consul binary at path instead of the one Binary finds.
func WithBinary(path string) Option {
	return func(c *ProcessConfig) { c.Binary = path }
}

// WithHCL adds an agent configuration fragment, applied after the harness's
// own, e.g. WithHCL(`session_ttl_min = "1s"`).
func WithHCL(fragment string) Option {
	return func(c *ProcessConfig) { c.HCL = append(c.HCL, fragment) }
}

// Agent is a real Consul dev agent owned by one test. Its methods other than
// Client and Config must be called from the test's goroutine.
type Agent struct {
	t         testing.TB
	addr      string
	logPath   string
	transport *http.Transport // shared by every Client, closed on Stop
	scheme    string          // "http", or "https" for an HTTPS-only agent
	token     string          // the management token of an agent with ACLs

	mu       sync.Mutex
	proc     *Process // current incarnation; replaced by Restart
	reported *Process // last incarnation whose Stop error was reported
}

// Start starts a Consul dev agent for t (see StartProcess for how it is
// configured and when it counts as ready), with its data directory and its
// output log (consul.log) in t.TempDir(). t.Cleanup stops it; if the test
// failed, the cleanup also logs the agent's last output lines. If no consul
// binary is found or the agent does not become ready, Start calls t.Fatal.
func Start(t testing.TB, opts ...Option) *Agent {
	t.Helper()
	var cfg ProcessConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Binary == "" {
		bin, err := Binary()
		if err != nil {
			t.Fatalf("consultest: cannot run a real Consul agent: %v", err)
		}
		cfg.Binary = bin
	}
	dir := t.TempDir()
	a := &Agent{t: t, logPath: filepath.Join(dir, "consul.log"), transport: newTransport(), scheme: "http", token: cfg.Token}
	if cfg.HTTPS != nil {
		a.transport, a.scheme = cfg.HTTPS.transport(), "https"
	}
	log, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatalf("consultest: agent log: %v", err)
	}
	cfg.DataDir, cfg.LogWriter = filepath.Join(dir, "data"), log
	t.Cleanup(func() {
		a.Stop()
		log.Close()
		if p := a.current(); t.Failed() && p != nil {
			t.Logf("consultest: last output of consul agent %s (full log %s):\n%s",
				a.addr, a.logPath, p.tail.lastLines(tailLines))
		}
	})
	p, err := StartProcess(t.Context(), cfg)
	if err != nil {
		t.Fatalf("%v\n(full log: %s)", err, a.logPath)
	}
	a.proc, a.addr = p, p.HTTPAddr()
	return a
}

// StartClient starts a client agent (not a server) of server, the way
// Start starts a dev agent: it joins server's LAN pool and is ready once it
// reaches the leader through it. Its node is its own: sessions made
// through it belong to that node (a graceful stop, which leaves the
// cluster by default, deregisters the node and invalidates them).
func StartClient(t testing.TB, server *Agent, opts ...Option) *Agent {
	t.Helper()
	return Start(t, append([]Option{func(c *ProcessConfig) { c.Server = server.current() }}, opts...)...)
}

// current returns the agent's current process.
func (a *Agent) current() *Process {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc
}

// firstReport reports whether p's Stop error has not been reported yet.
func (a *Agent) firstReport(p *Process) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := a.reported != p
	a.reported = p
	return first
}

// HTTPAddr returns the agent's HTTP API address, "127.0.0.1:NNNN". It stays
// the same across Restart.
func (a *Agent) HTTPAddr() string { return a.addr }

// Config returns a new client configuration for the agent. Its address,
// scheme and transport are fixed, so CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL,
// CONSUL_CACERT and the like cannot redirect it (api.NewClient still applies
// CONSUL_HTTP_TOKEN, which a dev agent without ACLs ignores). An HTTPS-only
// agent's configuration speaks HTTPS and trusts its CA. It carries no
// token; see ManagementConfig for an agent with ACLs.
func (a *Agent) Config() *api.Config {
	return &api.Config{Address: a.addr, Scheme: a.scheme, Transport: a.transport}
}

// Client returns a new API client for the agent; it keeps working (against
// the new incarnation) after Restart.
func (a *Agent) Client() *api.Client {
	c, err := api.NewClient(a.Config())
	if err != nil {
		a.t.Fatalf("consultest: api client: %v", err)
	}
	return c
}

// Running reports whether the agent process is up and not stopped.
func (a *Agent) Running() bool {
	p := a.current()
	return p != nil && p.running()
}

// Stop stops the agent and waits for it to exit; its ports stay assigned to
// the Agent for Restart. Calling Stop again does nothing.
func (a *Agent) Stop() {
	if p := a.current(); p != nil {
		if err := p.Stop(); err != nil && a.firstReport(p) {
			a.t.Errorf("consultest: stop consul agent %s: %v", a.addr, err)
		}
	}
	a.transport.CloseIdleConnections()
}

// Restart stops the agent if it is running and starts it again on the same
// ports and data directory, waiting until it is ready. Dev mode keeps its
// state in memory, so the new incarnation starts empty. It calls t.Fatal if
// the agent does not come back.
func (a *Agent) Restart() {
	a.t.Helper()
	a.Stop()
	old := a.current()
	fmt.Fprintf(old.cfg.LogWriter, "==> consultest: restarting agent on %s\n", a.addr)
	p, err := old.restart(a.t.Context())
	if err != nil {
		a.t.Fatalf("consultest: restart: %v\n(full log: %s)", err, a.logPath)
	}
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
}
