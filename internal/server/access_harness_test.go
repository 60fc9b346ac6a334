package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/tenant"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// Bearer tokens of the tests (test-only values).
const (
	tokenA     = "bearer-token-of-tenant-a-5b1f"
	tokenB     = "bearer-token-of-tenant-b-93c2"
	tokenAdmin = "bearer-token-of-the-admin-77ad"
)

// pki is the certificates of a secure test: a CA, the broker's server
// certificate and clients for two tenants, an admin and a stranger.
type pki struct {
	dir                        string
	ca                         *testpki.CA
	caFile, certFile, keyFile  string
	a, aURI, b, admin, strange *testpki.Pair
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), ca: testpki.NewCA(t, "lockbroker test CA")}
	p.caFile = p.ca.WriteCA(t, p.dir, "ca.pem")
	p.certFile, p.keyFile = p.ca.Server(t, "broker").Write(t, p.dir, "broker")
	p.a = p.ca.Client(t, "tenant-a")
	p.aURI = p.ca.Client(t, "", "spiffe://corp/ns/a/sa/api")
	p.b = p.ca.Client(t, "tenant-b")
	p.admin = p.ca.Client(t, "oncall")
	p.strange = p.ca.Client(t, "mallory")
	return p
}

// tenantsYAML is the tenants file of the tests; quotas are filled in.
func tenantsYAML(aQuotas string) string {
	return `tenants:
  - name: a
    identities: ["cn:tenant-a", "uri:spiffe://corp/ns/a/sa/api", "` + tenant.TokenIdentity(tokenA) + `"]
    prefixes: ["a/"]
` + aQuotas + `
  - name: b
    identities: ["cn:tenant-b", "` + tenant.TokenIdentity(tokenB) + `"]
    prefixes: ["b/"]
admins: ["cn:oncall", "` + tenant.TokenIdentity(tokenAdmin) + `"]
`
}

func parseTenants(t *testing.T, body string) *tenant.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	cfg, err := tenant.Load(path)
	require.NoError(t, err)
	return cfg
}

// secure is one in-process broker serving TLS with tenants, on a real
// Consul agent.
type secure struct {
	pki   *pki
	agent *consultest.Agent
	store *consulstore.Store
	b     *broker.Broker
	srv   *Server
	addr  string
	logs  *observer.ObservedLogs
	tls   *TLS
}

// startSecure starts the broker with tenants (nil: single-tenant); mTLS
// when mutual, else TLS without client certificates (tokens only).
func startSecure(t *testing.T, p *pki, agent *consultest.Agent, cfg *tenant.Config, mutual bool) *secure {
	t.Helper()
	store, err := consulstore.Open(agent.Config(), consulstore.Options{WaitTime: 2 * time.Second})
	require.NoError(t, err)
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	b := broker.New(store, log)
	files := TLSFiles{Cert: p.certFile, Key: p.keyFile}
	if mutual {
		files.ClientCA = p.caFile
	}
	tlsCfg, err := NewTLS(files)
	require.NoError(t, err)
	opts := []Option{WithTransportCredentials(tlsCfg.Credentials())}
	if cfg != nil {
		opts = append(opts, WithTenants(cfg))
	}
	srv, err := New(b, store, log, opts...)
	require.NoError(t, err)
	srv.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.GRPC.Serve(lis) }()
	t.Cleanup(func() {
		b.Close()
		srv.GRPC.Stop()
		<-served
		store.Close()
	})
	return &secure{pki: p, agent: agent, store: store, b: b, srv: srv, addr: lis.Addr().String(), logs: logs, tls: tlsCfg}
}

// dial connects with a client certificate (nil: none) and a bearer token
// ("": none) through the Go client's DialOptions.
func (s *secure) dial(t *testing.T, cert *testpki.Pair, token string) *grpc.ClientConn {
	t.Helper()
	opts := []client.DialOption{client.WithCACert(s.pki.caFile)}
	if cert != nil {
		certFile, keyFile := cert.Write(t, t.TempDir(), "client")
		opts = append(opts, client.WithClientCert(certFile, keyFile))
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	dopts, err := client.DialOptions(opts...)
	require.NoError(t, err)
	conn, err := grpc.NewClient(s.addr, dopts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// requestOps are the Consul operations a request may make: all but
// status_leader, which the replica's probe of its agent makes every
// second whatever the requests.
var requestOps = []string{"session_create", "session_renew", "session_destroy", "session_info", "session_list",
	"kv_list", "kv_watch", "kv_txn_write", "kv_txn_read"}

// consulCalls is how many Consul calls the broker has made (of the given
// ops only, e.g. "session_create"; every op when none is given).
func (s *secure) consulCalls(t *testing.T, ops ...string) float64 {
	t.Helper()
	mfs, err := s.srv.Metrics.Gather()
	require.NoError(t, err)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "lockbroker_consul_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counted := len(ops) == 0
			for _, lp := range m.GetLabel() {
				for _, op := range ops {
					counted = counted || (lp.GetName() == "op" && lp.GetValue() == op)
				}
			}
			if counted {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// tenantMetric reads one of the per-tenant metrics.
func (s *secure) tenantMetric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return metricValue(t, s.srv, name, labels...)
}

// metricValue is the value of the first series of metric name that has
// the given label pairs, from srv's registry; -1 when there is none.
func metricValue(t *testing.T, srv *Server, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := srv.Metrics.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// auditLines are the audit logger's entries.
func (s *secure) auditLines() []observer.LoggedEntry {
	return s.logs.Filter(func(e observer.LoggedEntry) bool { return e.LoggerName == AuditLoggerName }).All()
}

// allLogText is every log entry, message and fields, as text.
func (s *secure) allLogText() string {
	var sb strings.Builder
	for _, e := range s.logs.All() {
		sb.WriteString(e.LoggerName + " " + e.Message)
		for k, v := range e.ContextMap() {
			sb.WriteString(" " + k + "=")
			sb.WriteString(strings.ReplaceAll(fmt.Sprint(v), "\n", " "))
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// errorInfo returns err's ErrorInfo.
func errorInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}

// requireCode checks err's code and ErrorInfo reason.
func requireCode(t *testing.T, err error, c codes.Code, reason broker.Reason) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, c, status.Code(err), "%v", err)
	require.Equal(t, string(reason), errorInfo(t, err).GetReason(), "%v", err)
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
