package security

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/tenant"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// Bearer tokens and a value of the test: none may appear in any log.
const (
	tokenPayments = "bearer-payments-6c1d0e3a9f"
	tokenNopriv   = "bearer-nopriv-1f9a44be07"
	secretValue   = "held-value-that-no-log-may-show"
)

// shared is the shared-service set-up: a default-deny Consul, the broker
// with the shipped policy's token, mTLS and a tenants file.
type shared struct {
	dir                                    string
	agent                                  *consultest.Agent
	ca                                     *testpki.CA
	caFile, certFile, keyFile, tenantsFile string
	payments, orders, admin, stranger      *testpki.Pair
	halfpriv                               *testpki.Pair
	brokerToken, paymentsToken, noprivTok  string
	halfprivTok                            string
	broker                                 *brokerProc
	lockctl                                string
}

const tenantsTemplate = `# written by the test
tenants:
  - name: payments
    identities: ["cn:payments-api", "%s"]
    prefixes: ["payments/"]
    max_holds: 3
    max_sessions: 5
    acquire_rate: 50
    consul_token_file: "payments.token"
  - name: orders
    identities: ["uri:spiffe://corp/ns/orders/sa/api"%s]
    prefixes: ["orders/"]
    acquire_rate: 5
  - name: nopriv
    identities: ["%s"]
    prefixes: ["nopriv/"]
    consul_token_file: "nopriv.token"
  - name: halfpriv
    identities: ["cn:halfpriv"]
    prefixes: ["halfpriv/"]
    consul_token_file: "halfpriv.token"
admins: ["cn:platform-oncall"]
`

func (s *shared) writeTenants(t *testing.T, extraOrders string) {
	t.Helper()
	body := fmt.Sprintf(tenantsTemplate, tenant.TokenIdentity(tokenPayments), extraOrders, tenant.TokenIdentity(tokenNopriv))
	require.NoError(t, os.WriteFile(s.tenantsFile, []byte(body), 0o600))
}

func startShared(t *testing.T) *shared {
	t.Helper()
	return startSharedWith(t, nil)
}

// startSharedWith is startShared with a tenants file of the test's own:
// tenants (unless nil) writes it, once the certificates and token files
// are in s.dir.
func startSharedWith(t *testing.T, tenants func(s *shared) string) *shared {
	t.Helper()
	root := brokertest.RepoRoot(t)
	s := &shared{dir: t.TempDir(), ca: testpki.NewCA(t, "security test CA")}
	s.agent = consultest.StartACL(t, consultest.WithHCL(`log_level = "trace"`)) // the most Consul logs, searched for tokens at the end
	policy, err := os.ReadFile(filepath.Join(root, "deploy/consul/broker-policy.hcl"))
	require.NoError(t, err)
	tenantPolicy, err := os.ReadFile(filepath.Join(root, "deploy/consul/tenant-policy.hcl"))
	require.NoError(t, err)
	s.brokerToken = s.agent.CreateToken(t, "lockbroker", string(policy))
	s.paymentsToken = s.agent.CreateToken(t, "tenant-payments", string(tenantPolicy))
	s.noprivTok = s.agent.CreateToken(t, "tenant-nopriv", "") // no rights at all
	// Sessions and records, but not its own keys.
	s.halfprivTok = s.agent.CreateToken(t, "tenant-halfpriv", `session_prefix "" { policy = "write" }
key_prefix "lockbroker/sessions/" { policy = "write" }`)
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "halfpriv.token"), []byte(s.halfprivTok), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "payments.token"), []byte(s.paymentsToken+"\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, "nopriv.token"), []byte(s.noprivTok), 0o600))

	s.caFile = s.ca.WriteCA(t, s.dir, "ca.pem")
	s.certFile, s.keyFile = s.ca.Server(t, "broker").Write(t, s.dir, "broker")
	s.payments = s.ca.Client(t, "payments-api")
	s.orders = s.ca.Client(t, "orders-svc", "spiffe://corp/ns/orders/sa/api")
	s.admin = s.ca.Client(t, "platform-oncall")
	s.stranger = s.ca.Client(t, "mallory")
	s.halfpriv = s.ca.Client(t, "halfpriv")
	s.tenantsFile = filepath.Join(s.dir, "tenants.yaml")
	s.writeTenants(t, "")
	if tenants != nil {
		require.NoError(t, os.WriteFile(s.tenantsFile, []byte(tenants(s)), 0o600))
	}
	s.broker = startBroker(t, true,
		[]string{"CONSUL_HTTP_ADDR=" + s.agent.HTTPAddr(), "CONSUL_HTTP_TOKEN=" + s.brokerToken},
		"--tls-cert", s.certFile, "--tls-key", s.keyFile, "--tls-client-ca", s.caFile, "--tenants", s.tenantsFile)
	s.lockctl = brokertest.Build(t, "./cmd/lockctl", "lockctl")
	return s
}

func (s *shared) conn(t *testing.T, cert *testpki.Pair, token string) *grpc.ClientConn {
	t.Helper()
	return dial(t, s.broker.Addr, s.caFile, cert, token)
}

// runLockctl runs lockctl as cert against the broker.
func (s *shared) runLockctl(t *testing.T, cert *testpki.Pair, args ...string) (string, error) {
	t.Helper()
	certFile, keyFile := cert.Write(t, t.TempDir(), "lockctl")
	cmd := exec.Command(s.lockctl, args...)
	cmd.Env = append(cleanEnv(), "LOCKBROKER_ADDR="+s.broker.Addr, "LOCKBROKER_CACERT="+s.caFile,
		"LOCKBROKER_CERT="+certFile, "LOCKBROKER_CERT_KEY="+keyFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// indexes are Consul's Raft index and the indexes of its KV and session
// tables, read with the management token.
func (s *shared) indexes(t *testing.T) (raft, kv, sessions uint64) {
	t.Helper()
	c, err := api.NewClient(s.agent.ManagementConfig())
	require.NoError(t, err)
	self, err := c.Agent().Self()
	require.NoError(t, err)
	raftStats, _ := self["Stats"]["raft"].(map[string]any)
	raft, err = strconv.ParseUint(fmt.Sprint(raftStats["last_log_index"]), 10, 64)
	require.NoError(t, err)
	_, meta, err := c.KV().List("", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	_, smeta, err := c.Session().List(&api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	return raft, meta.LastIndex, smeta.LastIndex
}

type acquireStream = grpc.ServerStreamingClient[lockbrokerv1.AcquireResponse]

func acquire(t *testing.T, ctx context.Context, conn *grpc.ClientConn, req *lockbrokerv1.AcquireRequest) (acquireStream, *lockbrokerv1.AcquireResponse, error) {
	t.Helper()
	st, err := lockbrokerv1.NewLockServiceClient(conn).Acquire(ctx, req)
	require.NoError(t, err)
	ev, err := st.Recv()
	return st, ev, err
}

// events reads a stream's events into a channel until it ends.
func events(st acquireStream) <-chan *lockbrokerv1.AcquireResponse {
	ch := make(chan *lockbrokerv1.AcquireResponse, 64)
	go func() {
		defer close(ch)
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			ch <- ev
		}
	}()
	return ch
}

// TestSharedService proves the shared service end to end, from outside:
// the broker binary with mTLS and a tenants file, on a Consul whose ACLs
// deny by default, with a token made from deploy/consul/broker-policy.hcl
// as shipped and a tenant token from deploy/consul/tenant-policy.hcl.
// Each subtest names what it proves; the last searches every log of the
// run (the broker's, at debug level, and Consul's) for the Consul tokens
// and the bearer tokens.
func TestSharedService(t *testing.T) {
	s := startShared(t)
	ctx := timeout(t, 3*time.Minute)
	payments := s.conn(t, s.payments, "")
	orders := s.conn(t, s.orders, "")
	adminConn := s.conn(t, s.admin, "")
	pl, ol := lockbrokerv1.NewLockServiceClient(payments), lockbrokerv1.NewLockServiceClient(orders)

	var held acquireStream
	var heldSeq *lockbrokerv1.Sequencer
	t.Run("tenant locks a key under its prefix with its own Consul token", func(t *testing.T) {
		st, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/x", Value: []byte(secretValue)})
		require.NoError(t, err)
		require.NotNil(t, ev.GetAcquired(), "%v", ev)
		held, heldSeq = st, ev.GetAcquired().GetSequencer()
		got, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "payments/x"})
		require.NoError(t, err)
		require.Len(t, got.GetState().GetHolders(), 1)
	})

	t.Run("another tenant's key is PERMISSION_DENIED and Consul's raft index does not move", func(t *testing.T) {
		var raft0, kv0, sess0, raft1, kv1, sess1 uint64
		for attempt := range 3 { // a Raft write of Consul's own (anti-entropy) may land in between: try again
			raft0, kv0, sess0 = s.indexes(t)
			_, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/x"})
			requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			assert.Contains(t, status.Convert(err).Message(), `"orders/x"`)
			_, _, err = acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "orders/x"})
			requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			assert.Equal(t, "orders/x", errorInfo(err).GetMetadata()["key"])
			_, err = pl.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "orders/x", SessionId: heldSeq.GetSessionId(), Token: heldSeq.GetToken()})
			requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			raft1, kv1, sess1 = s.indexes(t)
			if raft1 == raft0 {
				break
			}
			t.Logf("attempt %d: raft index moved %d -> %d (kv %d -> %d, sessions %d -> %d)", attempt, raft0, raft1, kv0, kv1, sess0, sess1)
		}
		assert.Equal(t, raft0, raft1, "raft index")
		assert.Equal(t, kv0, kv1, "KV index")
		assert.Equal(t, sess0, sess1, "session index")
	})

	t.Run("multi-key lock: every key must be the tenant's, checked before any Consul call", func(t *testing.T) {
		var raft0, raft1 uint64
		for attempt := range 3 { // a Raft write of Consul's own may land in between: try again
			raft0, _, _ = s.indexes(t)
			_, _, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/m1", Keys: []string{"payments/m2", "orders/x", "payments/m3"}})
			requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			assert.Equal(t, "orders/x", errorInfo(err).GetMetadata()["key"], "the refused key is named")
			assert.Contains(t, status.Convert(err).Message(), `"orders/x"`)
			raft1, _, _ = s.indexes(t)
			if raft1 == raft0 {
				break
			}
			t.Logf("attempt %d: raft index moved %d -> %d", attempt, raft0, raft1)
		}
		assert.Equal(t, raft0, raft1, "raft index")
		// Its own keys, with its own Consul token: granted, and released
		// through any key.
		st, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/m1", Keys: []string{"payments/m2", "payments/m3"}})
		require.NoError(t, err)
		a := ev.GetAcquired()
		require.NotNil(t, a, "%v", ev)
		require.Len(t, a.GetSequencers(), 3)
		s2 := a.GetSequencers()[1]
		_, err = pl.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: s2.GetKey(), SessionId: s2.GetSessionId(), Token: s2.GetToken()})
		require.NoError(t, err)
		ev, err = st.Recv()
		require.NoError(t, err)
		require.Len(t, ev.GetReleased().GetSequencers(), 3, "%v", ev)
		// Another tenant cannot release it through a key of its own prefix
		// either: the keys are not its.
		_, err = ol.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "payments/m1", SessionId: s2.GetSessionId(), Token: s2.GetToken()})
		requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
	})

	t.Run("no client certificate: the handshake is refused", func(t *testing.T) {
		conn := dial(t, s.broker.Addr, s.caFile, nil, "")
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		// The server's "certificate required" alert, or the connection it
		// closed, depending on who writes first.
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		t.Logf("without a client certificate: %v", err)
		other := testpki.NewCA(t, "rogue CA").Client(t, "payments-api")
		_, err = healthpb.NewHealthClient(dial(t, s.broker.Addr, s.caFile, other, "")).Check(ctx, &healthpb.HealthCheckRequest{})
		require.Equal(t, codes.Unavailable, status.Code(err), "a certificate of another CA: %v", err)
		// A verified certificate of no tenant reaches health and nothing else.
		stranger := s.conn(t, s.stranger, "")
		_, err = healthpb.NewHealthClient(stranger).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = lockbrokerv1.NewLockServiceClient(stranger).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/x"})
		requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
	})

	t.Run("a tenant's session used by another tenant is NOT_FOUND", func(t *testing.T) {
		created, err := lockbrokerv1.NewSessionServiceClient(payments).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		sid := created.GetSession().GetId()
		os := lockbrokerv1.NewSessionServiceClient(orders)
		_, err = os.RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: sid})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		_, err = os.GetSession(ctx, &lockbrokerv1.GetSessionRequest{SessionId: sid})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		_, err = os.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		_, _, err = acquire(t, ctx, orders, &lockbrokerv1.AcquireRequest{Key: "orders/s", Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		_, err = ol.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "orders/s", SessionId: heldSeq.GetSessionId(), Token: heldSeq.GetToken()})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		_, err = lockbrokerv1.NewSessionServiceClient(payments).DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		require.NoError(t, err, "the owner still can")
	})

	t.Run("DestroySession: a session made outside the broker is no tenant's; a retry and one after a half-done destroy succeed", func(t *testing.T) {
		mgmt, err := api.NewClient(s.agent.ManagementConfig())
		require.NoError(t, err)
		ps := lockbrokerv1.NewSessionServiceClient(payments)
		recordOf := func(sid string) *api.KVPair {
			e, _, err := mgmt.KV().Get("lockbroker/sessions/"+sid, &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			return e
		}

		// An api.Lock user's hold on the tenant's own prefix: the tenant
		// sees the session's id, and still cannot end it.
		lk, err := mgmt.LockKey("payments/outside")
		require.NoError(t, err)
		_, err = lk.Lock(nil)
		require.NoError(t, err)
		defer func() { _ = lk.Unlock() }()
		got, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "payments/outside"})
		require.NoError(t, err)
		require.Len(t, got.GetState().GetHolders(), 1)
		outside := got.GetState().GetHolders()[0].GetSessionId()
		_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: outside})
		requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
		se, _, err := mgmt.Session().Info(outside, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		require.NotNil(t, se, "the outside session still lives")
		e, _, err := mgmt.KV().Get("payments/outside", &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		assert.Equal(t, outside, e.Session, "and still holds its key")

		// The tenant's own session, destroyed and destroyed again (a retry).
		created, err := ps.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		sid := created.GetSession().GetId()
		require.NotNil(t, recordOf(sid))
		_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		require.NoError(t, err)
		_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		require.NoError(t, err, "a retry succeeds")
		assert.Nil(t, recordOf(sid), "no record is left")

		// A destroy cut off after the session ended and before its record
		// was deleted: Consul released the record, which names its tenant.
		// The broker's janitor (every 15 s) deletes such a record too: an
		// attempt it ran in the middle of proves nothing, and is made again.
		for attempt := 1; ; attempt++ {
			require.LessOrEqual(t, attempt, 3, "every attempt ended with the record gone before its check: the janitor each time, or the owner's retry is refused (NOT_FOUND) after deleting it")
			created, err = ps.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
			require.NoError(t, err)
			sid = created.GetSession().GetId()
			_, err = mgmt.Session().Destroy(sid, nil)
			require.NoError(t, err)
			dead := recordOf(sid)
			if dead == nil {
				t.Logf("attempt %d: the janitor deleted the dead record at once; again", attempt)
				continue
			}
			require.Empty(t, dead.Session)
			_, err = lockbrokerv1.NewSessionServiceClient(orders).DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
			requireStatus(t, err, codes.NotFound, "SESSION_NOT_FOUND")
			_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
			if status.Code(err) == codes.NotFound && recordOf(sid) == nil {
				t.Logf("attempt %d: the janitor deleted the dead record before the owner's retry; again", attempt)
				continue
			}
			require.NoError(t, err, "the owner's retry succeeds")
			assert.Nil(t, recordOf(sid), "and deletes the dead record")
			break
		}
	})

	t.Run("over max_holds is RESOURCE_EXHAUSTED with QuotaFailure and RetryInfo", func(t *testing.T) {
		qctx, cancel := context.WithCancel(ctx)
		for _, k := range []string{"payments/q1", "payments/q2"} {
			_, ev, err := acquire(t, qctx, payments, &lockbrokerv1.AcquireRequest{Key: k})
			require.NoError(t, err)
			require.NotNil(t, ev.GetAcquired())
		}
		_, _, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/q3"})
		requireQuotaFailure(t, err, "payments", "max_holds")
		cancel()
		require.Eventually(t, func() bool {
			_, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/q3", WaitTimeout: durationpb.New(0)})
			return err == nil && ev.GetAcquired() != nil
		}, 10*time.Second, 100*time.Millisecond, "slots come back when streams end")
	})

	t.Run("acquire_rate is enforced", func(t *testing.T) {
		created, err := lockbrokerv1.NewSessionServiceClient(orders).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		start := time.Now()
		var ok, refused int
		for i := range 15 {
			_, err := ol.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: fmt.Sprintf("orders/rate/%d", i), SessionId: created.GetSession().GetId()})
			if status.Code(err) == codes.ResourceExhausted {
				requireStatus(t, err, codes.ResourceExhausted, "QUOTA_EXCEEDED")
				refused++
				continue
			}
			require.NoError(t, err)
			ok++
		}
		elapsed := time.Since(start)
		t.Logf("15 TryAcquire in %v at acquire_rate 5: %d admitted, %d refused", elapsed.Round(time.Millisecond), ok, refused)
		assert.Positive(t, refused)
		assert.LessOrEqual(t, float64(ok), 5+5*elapsed.Seconds()+1)
	})

	t.Run("the shipped policy serves every call end to end", func(t *testing.T) {
		// Semaphore slots with the tenant's own token.
		for range 2 {
			_, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/sem", Limit: 2, WaitTimeout: durationpb.New(0)})
			require.NoError(t, err)
			require.NotNil(t, ev.GetAcquired(), "%v", ev)
			break // max_holds 3: one slot is enough here; the second is taken by orders below
		}
		w, err := pl.Watch(ctx, &lockbrokerv1.WatchRequest{Key: "payments", Prefix: true})
		require.NoError(t, err)
		_, err = w.Recv()
		requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED") // "payments" itself is outside "payments/"
		w, err = pl.Watch(ctx, &lockbrokerv1.WatchRequest{Key: "payments/x"})
		require.NoError(t, err)
		first, err := w.Recv()
		require.NoError(t, err)
		assert.Len(t, first.GetState().GetHolders(), 1)
		sv, err := pl.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "payments/x", SessionId: heldSeq.GetSessionId(), Value: []byte(secretValue + "-2"), Token: heldSeq.GetToken()})
		require.NoError(t, err)
		assert.Equal(t, heldSeq.GetToken(), sv.GetSequencer().GetToken())
		cs, err := pl.CheckSequencer(ctx, &lockbrokerv1.CheckSequencerRequest{Sequencer: heldSeq})
		require.NoError(t, err)
		assert.True(t, cs.GetCurrent())
		// A client-owned hold with the broker's own token (orders has none).
		created, err := lockbrokerv1.NewSessionServiceClient(orders).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		time.Sleep(250 * time.Millisecond) // acquire_rate 5/s: the bucket refills from the last subtest
		seq, err := ol.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "orders/job", SessionId: created.GetSession().GetId()})
		require.NoError(t, err)
		rel, err := ol.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "orders/job", SessionId: created.GetSession().GetId(), Token: seq.GetSequencer().GetToken()})
		require.NoError(t, err)
		assert.True(t, rel.GetReleased())
	})

	t.Run("a tenant token without rights is PERMISSION_DENIED naming the Consul operation", func(t *testing.T) {
		nopriv := s.conn(t, s.stranger, tokenNopriv) // the token names the caller, not the certificate
		_, _, err := acquire(t, ctx, nopriv, &lockbrokerv1.AcquireRequest{Key: "nopriv/x"})
		requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
		assert.Contains(t, status.Convert(err).Message(), "session create")
		assert.Equal(t, "session create", errorInfo(err).GetMetadata()["consulOperation"])
		_, err = lockbrokerv1.NewSessionServiceClient(nopriv).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")

		// A token that may make sessions but not write its keys: the grant's
		// transaction is rolled back by Consul's ACLs.
		half := s.conn(t, s.halfpriv, "")
		_, _, err = acquire(t, ctx, half, &lockbrokerv1.AcquireRequest{Key: "halfpriv/x", WaitTimeout: durationpb.New(0)})
		requireStatus(t, err, codes.PermissionDenied, "CONSUL_PERMISSION_DENIED")
		t.Logf("halfpriv: %v", err)
		assert.NotEmpty(t, errorInfo(err).GetMetadata()["consulOperation"])
	})

	t.Run("admin lists holds (lockctl), force-releases, and the holder is told lost within 1s", func(t *testing.T) {
		out, err := s.runLockctl(t, s.admin, "admin", "list-holds", "payments/")
		require.NoError(t, err, out)
		assert.Contains(t, out, `"payments/x" held token=`)
		assert.Contains(t, out, `tenant="payments"`)
		assert.Contains(t, out, heldSeq.GetSessionId())
		out, err = s.runLockctl(t, s.admin, "admin", "list-sessions", "--tenant", "payments")
		require.NoError(t, err, out)
		assert.Contains(t, out, heldSeq.GetSessionId())
		assert.NotContains(t, out, `tenant="orders"`)

		evs := events(held)
		start := time.Now()
		fr, err := lockbrokerv1.NewAdminServiceClient(adminConn).ForceRelease(ctx, &lockbrokerv1.ForceReleaseRequest{Key: "payments/x"})
		require.NoError(t, err)
		assert.EqualValues(t, 1, fr.GetReleased())
		var lost *lockbrokerv1.AcquireLost
		for lost == nil {
			select {
			case ev, ok := <-evs:
				require.True(t, ok, "stream ended without lost")
				lost = ev.GetLost()
			case <-time.After(5 * time.Second):
				t.Fatal("no lost within 5s")
			}
		}
		took := time.Since(start)
		t.Logf("holder told lost %v after ForceRelease was sent", took.Round(time.Millisecond))
		assert.Less(t, took, time.Second)
		assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RELEASED_BY_OTHER, lost.GetReason())

		out, err = s.runLockctl(t, s.admin, "admin", "force-release", "payments/q3")
		require.NoError(t, err, out)
		assert.Contains(t, out, "1 hold(s) ended")
	})

	t.Run("AdminService is PERMISSION_DENIED to tenants and strangers", func(t *testing.T) {
		for name, cert := range map[string]*testpki.Pair{"tenant": s.payments, "stranger": s.stranger} {
			_, err := lockbrokerv1.NewAdminServiceClient(s.conn(t, cert, "")).ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
			requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
			out, err := s.runLockctl(t, cert, "admin", "list-holds")
			require.Error(t, err, name)
			assert.Contains(t, out, "PERMISSION_DENIED", name)
		}
	})

	t.Run("SIGHUP reloads tenants and certificate without dropping a hold; a bad file keeps what is in force", func(t *testing.T) {
		st, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/hup"})
		require.NoError(t, err)
		require.NotNil(t, ev.GetAcquired())
		hupSession := ev.GetAcquired().GetSequencer().GetSessionId()
		evs := events(st)
		stranger := lockbrokerv1.NewLockServiceClient(s.conn(t, s.stranger, ""))
		_, err = stranger.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/x"})
		requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		oldSerial := s.serverSerial(t)

		s.writeTenants(t, `, "cn:mallory"`)
		newCert, newKey := s.ca.Server(t, "broker-rotated").Write(t, t.TempDir(), "rotated")
		copyFile(t, newCert, s.certFile)
		copyFile(t, newKey, s.keyFile)
		s.broker.hup(t)
		require.Eventually(t, func() bool {
			_, err := stranger.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/x"})
			return err == nil
		}, 10*time.Second, 50*time.Millisecond, "the new tenants file takes effect")
		assert.NotEqual(t, oldSerial, s.serverSerial(t), "new connections get the new certificate")

		require.NoError(t, os.WriteFile(s.tenantsFile, []byte("tenants:\n  - name: payments\n    identities: [cn:payments-api]\n    prefixes: [lockbroker/]\n"), 0o600))
		s.broker.hup(t)
		require.Eventually(t, func() bool {
			for _, l := range s.broker.logLines(t) {
				if l["msg"] == "reload: tenants file refused, the tenants in force stay" {
					assert.Contains(t, l["error"], "tenants.yaml:4:")
					return true
				}
			}
			return false
		}, 10*time.Second, 50*time.Millisecond)
		_, err = stranger.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/x"})
		require.NoError(t, err, "the tenants in force stay")

		// The hold made before both reloads was never lost.
		got, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "payments/hup"})
		require.NoError(t, err)
		require.Len(t, got.GetState().GetHolders(), 1)
		assert.Equal(t, hupSession, got.GetState().GetHolders()[0].GetSessionId())
		for drained := false; !drained; {
			select {
			case ev := <-evs:
				require.Nil(t, ev.GetLost(), "%v", ev)
			default:
				drained = true
			}
		}
	})

	t.Run("audit log and per-tenant metrics", func(t *testing.T) {
		var admin, denied, exhausted int
		for _, l := range s.broker.logLines(t) {
			if l["logger"] != "audit" {
				continue
			}
			line := fmt.Sprint(l)
			assert.NotContains(t, line, secretValue)
			switch {
			case strings.HasPrefix(fmt.Sprint(l["action"]), "lockbroker.v1.AdminService/") && l["identity"] == "cn:platform-oncall":
				admin++
			case l["result"] == "PERMISSION_DENIED":
				denied++
				assert.NotEmpty(t, l["identity"])
			case l["result"] == "RESOURCE_EXHAUSTED":
				exhausted++
				assert.NotEmpty(t, l["quota"])
			}
		}
		assert.Equal(t, 4, admin, "list-holds, list-sessions and two force-releases")
		assert.GreaterOrEqual(t, denied, 5)
		assert.GreaterOrEqual(t, exhausted, 2)

		resp, err := http.Get("http://" + s.broker.HTTPAddr + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		labels := regexp.MustCompile(`lockbroker_tenant_[a-z_]+\{[^}]*tenant="([^"]*)"`).FindAllStringSubmatch(string(body), -1)
		require.NotEmpty(t, labels)
		for _, m := range labels {
			assert.Contains(t, []string{"payments", "orders", "nopriv", "halfpriv", ""}, m[1])
		}
		value := func(series string) float64 {
			m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(string(body))
			if m == nil {
				t.Errorf("/metrics has no %s", series)
				return -1
			}
			v, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			return v
		}
		assert.GreaterOrEqual(t, value(`lockbroker_tenant_quota_refusals_total{quota="max_holds",tenant="payments"}`), 1.0)
		assert.GreaterOrEqual(t, value(`lockbroker_tenant_quota_refusals_total{quota="acquire_rate",tenant="orders"}`), 1.0)
		assert.InDelta(t, 2, value(`lockbroker_tenant_holds{tenant="payments"}`), 0, "payments/hup and the semaphore slot")
		assert.InDelta(t, 0, value(`lockbroker_tenant_waiters{tenant="payments"}`), 0)
		assert.InDelta(t, 2, value(`lockbroker_tenant_denials_total{tenant="nopriv"}`), 0, "Consul's two denials")
	})

	t.Run("no log of the run holds a Consul token or a bearer token", func(t *testing.T) {
		logs := map[string]string{"broker": s.broker.LogPath, "consul": s.agent.LogPath()}
		secrets := map[string]string{
			"broker Consul token": s.brokerToken, "payments Consul token": s.paymentsToken, "nopriv Consul token": s.noprivTok,
			"management token": consultest.ManagementToken, "payments bearer token": tokenPayments, "nopriv bearer token": tokenNopriv,
			"halfpriv Consul token": s.halfprivTok,
		}
		for name, path := range logs {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NotEmpty(t, data, name)
			for what, secret := range secrets {
				assert.NotContains(t, string(data), secret, "%s log holds the %s", name, what)
			}
			t.Logf("%s log: %d bytes, %d lines searched", name, len(data), bytes.Count(data, []byte("\n")))
		}
	})
}

// serverSerial is the serial number of the certificate the broker serves
// to a new connection.
func (s *shared) serverSerial(t *testing.T) string {
	t.Helper()
	pair := s.payments.TLS(t)
	conn, err := tls.Dial("tcp", s.broker.Addr, &tls.Config{RootCAs: s.ca.Pool(), Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}, ServerName: "127.0.0.1"})
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, data, 0o600))
}
