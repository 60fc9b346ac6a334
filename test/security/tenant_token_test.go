package security

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// tokenTenants is the tenants file of the tests below: payments with its
// own Consul token (the line marked, which a reload removes), orders on
// the broker's, and mallory, whose token may write its keys and session
// records but not renew or make sessions.
const tokenTenants = `tenants:
  - name: payments
    identities: ["cn:payments-api"]
    prefixes: ["payments/"]
    consul_token_file: "payments.token" # payments' own
  - name: orders
    identities: ["cn:orders-api"]
    prefixes: ["orders/"]
  - name: mallory
    identities: ["cn:mallory"]
    prefixes: ["mallory/"]
    consul_token_file: "mallory.token"
`

// twoReplicas is a default-deny Consul, and two broker replicas A and B
// with the shipped broker policy's token, mTLS and tokenTenants.
type twoReplicas struct {
	agent                                   *consultest.Agent
	mgmt                                    *api.Client
	dir, caFile, tenantsFile, paymentsToken string
	a, b                                    *brokerProc
	payments, orders, mallory               *testpki.Pair
	paymentsA, paymentsB, ordersA, malloryA *grpc.ClientConn
	paymentsLocksA, paymentsLocksB          lockbrokerv1.LockServiceClient
}

func startTwoReplicas(t *testing.T) *twoReplicas {
	t.Helper()
	root := brokertest.RepoRoot(t)
	s := &twoReplicas{dir: t.TempDir()}
	s.agent = consultest.StartACL(t)
	var err error
	s.mgmt, err = api.NewClient(s.agent.ManagementConfig())
	require.NoError(t, err)
	policy, err := os.ReadFile(filepath.Join(root, "deploy/consul/broker-policy.hcl"))
	require.NoError(t, err)
	tenantPolicy, err := os.ReadFile(filepath.Join(root, "deploy/consul/tenant-policy.hcl"))
	require.NoError(t, err)
	brokerToken := s.agent.CreateToken(t, "lockbroker", string(policy))
	s.paymentsToken = s.agent.CreateToken(t, "tenant-payments", string(tenantPolicy))
	malloryToken := s.agent.CreateToken(t, "tenant-mallory", `key_prefix "mallory/" { policy = "write" }
key_prefix "lockbroker/sessions/" { policy = "write" }`)
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "payments.token"), []byte(s.paymentsToken), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "mallory.token"), []byte(malloryToken), 0o600))
	s.tenantsFile = filepath.Join(s.dir, "tenants.yaml")
	require.NoError(t, os.WriteFile(s.tenantsFile, []byte(tokenTenants), 0o600))

	ca := testpki.NewCA(t, "tenant token test CA")
	s.caFile = ca.WriteCA(t, s.dir, "ca.pem")
	certFile, keyFile := ca.Server(t, "broker").Write(t, s.dir, "broker")
	s.payments, s.orders, s.mallory = ca.Client(t, "payments-api"), ca.Client(t, "orders-api"), ca.Client(t, "mallory")
	env := []string{"CONSUL_HTTP_ADDR=" + s.agent.HTTPAddr(), "CONSUL_HTTP_TOKEN=" + brokerToken}
	flags := []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", s.caFile, "--tenants", s.tenantsFile}
	s.a = startBroker(t, true, env, flags...)
	s.b = startBroker(t, true, env, flags...)
	s.paymentsA = dial(t, s.a.Addr, s.caFile, s.payments, "")
	s.paymentsB = dial(t, s.b.Addr, s.caFile, s.payments, "")
	s.ordersA = dial(t, s.a.Addr, s.caFile, s.orders, "")
	s.malloryA = dial(t, s.a.Addr, s.caFile, s.mallory, "")
	s.paymentsLocksA = lockbrokerv1.NewLockServiceClient(s.paymentsA)
	s.paymentsLocksB = lockbrokerv1.NewLockServiceClient(s.paymentsB)
	return s
}

// deleteToken deletes a Consul token given its secret.
func (s *twoReplicas) deleteToken(t *testing.T, secret string) {
	t.Helper()
	self, _, err := s.mgmt.ACL().TokenReadSelf(&api.QueryOptions{Token: secret})
	require.NoError(t, err)
	_, err = s.mgmt.ACL().TokenDelete(self.AccessorID, nil)
	require.NoError(t, err)
}

// holder is the session holding key in Consul ("" if none), read with the
// management token.
func (s *twoReplicas) holder(t *testing.T, key string) string {
	t.Helper()
	kv, _, err := s.mgmt.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	if kv == nil {
		return ""
	}
	return kv.Session
}

// reloaded sends SIGHUP to p and waits for the log line that says how the
// reload of the tenants file ended (the n-th such line since start).
func reloaded(t *testing.T, p *brokerProc, n int) string {
	t.Helper()
	p.hup(t)
	var msg string
	require.Eventually(t, func() bool {
		seen := 0
		for _, l := range p.logLines(t) {
			if m, _ := l["msg"].(string); m == "reload: tenants file reloaded" || m == "reload: tenants file refused, the tenants in force stay" {
				if seen++; seen == n {
					msg = m
					return true
				}
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "no reload logged")
	return msg
}

// TestTenantWritesUseTenantToken: every Consul write made for a tenant
// with a consul_token_file goes through that token, on every replica:
// once the operator deleted the tenant's token in Consul, SetValue (on the
// holder's replica and another) and a Release through another replica are
// PERMISSION_DENIED (Consul's 403), and the key stays held. Before, both
// used the broker's token: SetValue wrote and Release released.
//
// Then a reload (issue 42, 10): a tenants file whose token file is gone
// is refused, and the tenant keeps its own token (no fallback to the
// broker's); a tenants file without the tenant's consul_token_file puts
// the tenant on the broker's token, as a tenant that never had one.
func TestTenantWritesUseTenantToken(t *testing.T) {
	s := startTwoReplicas(t)
	ctx := timeout(t, 2*time.Minute)
	la, lb := s.paymentsLocksA, s.paymentsLocksB

	// A hold on A (a broker-owned session, from the tenant's pool) and a
	// grant on a client-owned session.
	held, ev, err := acquire(t, ctx, s.paymentsA, &lockbrokerv1.AcquireRequest{Key: "payments/held", Value: []byte("v0")})
	require.NoError(t, err)
	seq := ev.GetAcquired().GetSequencer()
	require.NotNil(t, seq, "%v", ev)
	evs := events(held)
	created, err := lockbrokerv1.NewSessionServiceClient(s.paymentsA).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	own := created.GetSession().GetId()
	tried, err := la.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "payments/own", SessionId: own})
	require.NoError(t, err)
	ownSeq := tried.GetSequencer()

	// With the token in place, every write works, on either replica.
	_, err = lb.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/held", SessionId: seq.GetSessionId(), Token: seq.GetToken(), Value: []byte("v1")})
	require.NoError(t, err, "SetValue with the tenant's token in place")

	s.deleteToken(t, s.paymentsToken)
	for name, c := range map[string]lockbrokerv1.LockServiceClient{"holder's replica": la, "other replica": lb} {
		_, err = c.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/held", SessionId: seq.GetSessionId(), Token: seq.GetToken(), Value: []byte("v2")})
		requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
		_, err = c.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/own", SessionId: own, Value: []byte("v2")})
		requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
		t.Logf("%s: SetValue refused: %v", name, err)
	}
	_, err = lb.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "payments/held", SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
	_, err = lb.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "payments/own", SessionId: own, Token: ownSeq.GetToken()})
	requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
	assert.Equal(t, seq.GetSessionId(), s.holder(t, "payments/held"), "the hold stays")
	assert.Equal(t, own, s.holder(t, "payments/own"), "the client-owned grant stays")
	kv, _, err := s.mgmt.KV().Get("payments/held", nil)
	require.NoError(t, err)
	assert.Equal(t, "v1", string(kv.Value), "the value written before the token was deleted")
	select {
	case ev := <-evs:
		assert.Nil(t, ev.GetReleased(), "the holder was told released: %v", ev)
	default:
	}

	// The token file gone: the reload is refused, and the tenant's writes
	// still go through its own (deleted) token.
	require.NoError(t, os.Remove(filepath.Join(s.dir, "payments.token")))
	assert.Equal(t, "reload: tenants file refused, the tenants in force stay", reloaded(t, s.a, 1))
	_, err = la.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/held", SessionId: seq.GetSessionId(), Token: seq.GetToken(), Value: []byte("v3")})
	requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
	_, _, err = acquire(t, ctx, s.paymentsA, &lockbrokerv1.AcquireRequest{Key: "payments/new", WaitTimeout: durationpbZero()})
	requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")

	// The tenants file without payments' consul_token_file: payments is on
	// the broker's token from then on, for new holds and its pool alike.
	require.NoError(t, os.WriteFile(s.tenantsFile, []byte(removeLine(t, tokenTenants, `consul_token_file: "payments.token" # payments' own`)), 0o600))
	assert.Equal(t, "reload: tenants file reloaded", reloaded(t, s.a, 2))
	_, ev, err = acquire(t, ctx, s.paymentsA, &lockbrokerv1.AcquireRequest{Key: "payments/new", WaitTimeout: durationpbZero()})
	require.NoError(t, err, "payments on the broker's token")
	require.NotNil(t, ev.GetAcquired(), "%v", ev)
	_, err = la.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/new", SessionId: ev.GetAcquired().GetSequencer().GetSessionId(), Token: ev.GetAcquired().GetSequencer().GetToken(), Value: []byte("v")})
	require.NoError(t, err)
}

// TestResumeOfForeignSessionWritesNothing: a tenant that asks to resume
// another tenant's session (a resume names a session, which is easy to
// learn) is told NOT_FOUND before the broker writes anything to Consul
// for it, and the refusal is audited. Before, the broker renewed the
// session first (keeping another tenant's crashed client's lock alive for
// as long as the request was repeated), then answered NOT_FOUND. The
// renewal shows with mallory, whose token may not renew sessions: the
// answer was CONSUL_PERMISSION_DENIED ("session renew"), not NOT_FOUND.
// A DestroySession of a session made outside the broker is audited as
// such a refusal too.
func TestResumeOfForeignSessionWritesNothing(t *testing.T) {
	s := startTwoReplicas(t)
	ctx := timeout(t, time.Minute)
	_, ev, err := acquire(t, ctx, s.paymentsA, &lockbrokerv1.AcquireRequest{Key: "payments/r"})
	require.NoError(t, err)
	seq := ev.GetAcquired().GetSequencer()
	require.NotNil(t, seq, "%v", ev)

	for _, tt := range []struct {
		name string
		conn *grpc.ClientConn
		key  string
	}{
		{"mallory (own token, no session rights)", s.malloryA, "mallory/r"},
		{"orders (the broker's token)", s.ordersA, "orders/r"},
	} {
		resume := &lockbrokerv1.Sequencer{Key: tt.key, SessionId: seq.GetSessionId(), LockIndex: seq.GetLockIndex(), Token: seq.GetToken(), Kind: seq.GetKind()}
		_, _, err := acquire(t, ctx, tt.conn, &lockbrokerv1.AcquireRequest{Key: tt.key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: resume}})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		t.Logf("%s: %v", tt.name, err)
	}
	// A session made outside the broker is no tenant's: destroying it is
	// refused, and audited, too.
	outside, _, err := s.mgmt.Session().Create(&api.SessionEntry{TTL: "30s"}, nil)
	require.NoError(t, err)
	_, err = lockbrokerv1.NewSessionServiceClient(s.ordersA).DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: outside})
	requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")

	require.Eventually(t, func() bool {
		n, m := 0, 0
		for _, l := range s.a.logLines(t) {
			if l["logger"] != "audit" || l["result"] != "NOT_FOUND" || l["foreign_session"] != true {
				continue
			}
			switch l["session"] {
			case seq.GetSessionId():
				n++
			case outside:
				m++
			}
		}
		return n == 2 && m == 1
	}, 5*time.Second, 50*time.Millisecond, "the three refusals audited")
}

func durationpbZero() *durationpb.Duration { return durationpb.New(0) }

// removeLine is text without the line that contains what (which must be
// there).
func removeLine(t *testing.T, text, what string) string {
	t.Helper()
	var out []string
	found := false
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, what) {
			found = true
			continue
		}
		out = append(out, l)
	}
	require.True(t, found, "%q not in the text", what)
	return strings.Join(out, "\n")
}
