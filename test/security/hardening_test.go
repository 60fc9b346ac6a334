package security

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// hardeningTenants is the tenants file of TestSharedServiceHardening:
// payments with a max_holds of 3, orders with write and read rates, and
// jobs, whose prefix the broker's shipped ACL policy does not cover.
const hardeningTenants = `# written by the test
tenants:
  - name: payments
    identities: ["cn:payments-api", "%s"]
    prefixes: ["payments/"]
    max_holds: 3
    max_sessions: 10
    consul_token_file: "payments.token"
  - name: orders
    identities: ["uri:spiffe://corp/ns/orders/sa/api"]
    prefixes: ["orders/"]
    write_rate: 5
    write_bytes_rate: 100000
    read_rate: 20
  - name: jobs
    identities: ["cn:jobs-api"]
    prefixes: ["jobs/"]
admins: ["cn:platform-oncall"]
`

// TestSharedServiceHardening proves the fixes of the outside security
// review (issue 42: findings 1, 4, 5, 6, 7, 9) from outside: the broker
// binary with mTLS and a tenants file, on a Consul whose ACLs deny by
// default, with the shipped broker policy's token.
func TestSharedServiceHardening(t *testing.T) {
	s := startSharedWith(t, func(s *shared) string {
		return fmt.Sprintf(hardeningTenants, tenant.TokenIdentity(tokenPayments))
	})
	ctx := timeout(t, 3*time.Minute)
	payments := s.conn(t, s.payments, "")
	orders := s.conn(t, s.orders, "")
	adminConn := s.conn(t, s.admin, "")
	pl, ol := lockbrokerv1.NewLockServiceClient(payments), lockbrokerv1.NewLockServiceClient(orders)
	ps := lockbrokerv1.NewSessionServiceClient(payments)

	t.Run("F1: a request over the API's limits is refused before anything logs it, and no refusal grows the log by more than a few KiB", func(t *testing.T) {
		huge := strings.Repeat("k", 3900<<10) // 3.9 MiB
		long := strings.Repeat("x", 500)      // within the key limit, longer than a logged field
		callers := []struct {
			name string
			conn *grpc.ClientConn
		}{
			{"unknown bearer token", s.conn(t, s.payments, "not-a-known-token")},
			{"unknown certificate", s.conn(t, s.stranger, "")},
			{"tenant outside its prefix", payments},
			{"tenant inside its prefix", payments},
		}
		for i, c := range callers {
			key := "orders/" + huge
			if i == len(callers)-1 {
				key = "payments/" + huge
			}
			lc := lockbrokerv1.NewLockServiceClient(c.conn)
			calls := map[string]func() error{
				"TryAcquire": func() error {
					_, err := lc.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: key, SessionId: "8d3b7a3e-1111-4c4c-9a9a-0123456789ab"})
					return err
				},
				"GetLock": func() error {
					_, err := lc.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
					return err
				},
				"Acquire": func() error {
					st, err := lc.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key})
					if err != nil {
						return err
					}
					_, err = st.Recv()
					return err
				},
				"Watch": func() error {
					st, err := lc.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
					if err != nil {
						return err
					}
					_, err = st.Recv()
					return err
				},
			}
			for name, call := range calls {
				before := s.broker.logSize(t)
				err := call()
				grew := s.broker.logSize(t) - before
				require.Error(t, err, "%s, %s", c.name, name)
				assert.Contains(t, []codes.Code{codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied}, status.Code(err), "%s, %s: %.300v", c.name, name, err)
				if status.Code(err) == codes.InvalidArgument {
					assert.Equal(t, "key", fieldOf(err), "%s, %s", c.name, name)
				}
				assert.Less(t, len(err.Error()), 1024, "%s, %s: the error echoes %d bytes", c.name, name, len(err.Error()))
				assert.Less(t, grew, int64(8<<10), "%s, %s: the log grew by %d bytes", c.name, name, grew)
				t.Logf("%s, %s: %v, the log grew by %d bytes", c.name, name, status.Code(err), grew)
			}
		}

		// A key within the limits, outside the tenant's prefix: refused,
		// echoed and audited clipped.
		_, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/" + long})
		requireStatus(t, err, codes.PermissionDenied, "PERMISSION_DENIED")
		assert.Less(t, len(status.Convert(err).Message()), 400, "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "(507 bytes)")
		var audited bool
		for _, l := range s.broker.logLines(t) {
			if k, ok := l["key"].(string); ok && l["logger"] == "audit" && strings.HasPrefix(k, "orders/xxx") {
				audited = true
				assert.LessOrEqual(t, len(k), 256+len("...(507 bytes)"), k)
				assert.True(t, strings.HasSuffix(k, "...(507 bytes)"), k)
			}
		}
		assert.True(t, audited, "the refusal is audited")
	})

	t.Run("F7: a key with a character Consul refuses is INVALID_ARGUMENT naming key, and nothing reaches Consul", func(t *testing.T) {
		_, kvBefore, _ := s.indexes(t)
		for _, key := range []string{"payments/a\u200bb", "payments/nb\u00a0sp", "payments/sep\u2028x", "payments/bom\ufeff"} {
			_, err := pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
			requireStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			assert.Equal(t, "key", fieldOf(err), "%v", err)
			_, _, err = acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(0)})
			requireStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			st, err := pl.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
			require.NoError(t, err)
			_, err = st.Recv()
			requireStatus(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
		}
		_, kvAfter, _ := s.indexes(t)
		assert.Equal(t, kvBefore, kvAfter, "nothing written to Consul")
		// Printable keys beyond ASCII still work.
		_, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: "payments/é-😀", WaitTimeout: durationpb.New(0)})
		require.NoError(t, err)
		require.NotNil(t, ev.GetAcquired(), "%v", ev)
	})

	t.Run("F7: abandoned watches whose queries Consul refuses (403) stop querying", func(t *testing.T) {
		// Keys under jobs/, which the broker's policy does not cover:
		// Consul filters them out of its listings (the broker's
		// PERMISSION_DENIED).
		mgmt, err := api.NewClient(s.agent.ManagementConfig())
		require.NoError(t, err)
		for i := range 40 {
			_, err := mgmt.KV().Put(&api.KVPair{Key: fmt.Sprintf("jobs/w%d", i), Value: []byte("x")}, nil)
			require.NoError(t, err)
		}
		jobs := lockbrokerv1.NewLockServiceClient(s.conn(t, s.ca.Client(t, "jobs-api"), ""))
		denied := func() float64 {
			return s.broker.metricSum(t, "lockbroker_consul_requests_total", `result="permission_denied"`)
		}
		before := denied()
		for i := range 40 {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			st, err := jobs.Watch(wctx, &lockbrokerv1.WatchRequest{Key: fmt.Sprintf("jobs/w%d", i)})
			require.NoError(t, err)
			_, _ = st.Recv() // an error, or nothing until the timeout
			cancel()
		}
		require.Eventually(t, func() bool { return denied() > before }, 5*time.Second, 50*time.Millisecond, "Consul refuses the watches (403)")
		// Stopped: no refused query in a window a few seconds after the
		// last stream closed (a retrying watch makes four a second).
		var settled float64
		require.Eventually(t, func() bool {
			a := denied()
			time.Sleep(2 * time.Second)
			settled = denied()
			return settled == a
		}, 30*time.Second, 100*time.Millisecond, "the abandoned watches keep querying Consul")
		t.Logf("refused Consul requests: %v before, %v when settled", before, settled)
	})

	admin := lockbrokerv1.NewAdminServiceClient(adminConn)
	paymentsHolds := func(t *testing.T) int {
		resp, err := admin.ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{KeyPrefix: "payments/"})
		require.NoError(t, err)
		return len(resp.GetHolds())
	}

	t.Run("F4: max_holds counts holds on client-owned sessions (TryAcquire, Acquire with session_id then cancel)", func(t *testing.T) {
		base := paymentsHolds(t) // payments/é-😀, when the subtest before ran
		sess, err := ps.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		sid := sess.GetSession().GetId()
		var granted int
		var last error
		for i := range 6 {
			_, err := pl.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: fmt.Sprintf("payments/try%d", i), SessionId: sid})
			if err == nil {
				granted++
			} else {
				last = err
			}
		}
		assert.Equal(t, 3-base, granted, "max_holds 3 with %d held already", base)
		requireQuotaFailure(t, last, "payments", "max_holds")
		_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		require.NoError(t, err)

		sess, err = ps.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		sid = sess.GetSession().GetId()
		t.Cleanup(func() {
			_, _ = ps.DestroySession(context.Background(), &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		})
		granted = 0
		for i := range 4 {
			actx, cancel := context.WithCancel(ctx)
			req := &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("payments/sess%d", i),
				Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}, WaitTimeout: durationpb.New(0)}
			var ev *lockbrokerv1.AcquireResponse
			var err error
			if i == 0 { // the destroyed session's holds are gone by the next count
				_, ev, err = acquireAdmitted(t, actx, payments, req)
			} else {
				_, ev, err = acquire(t, actx, payments, req)
			}
			if err == nil {
				require.NotNil(t, ev.GetAcquired(), "%v", ev)
				granted++
			} else {
				last = err
			}
			cancel() // the stream ends; the hold on the client's session stays
		}
		assert.Equal(t, 3-base, granted, "the streams' holds stay after the streams")
		requireQuotaFailure(t, last, "payments", "max_holds")
		_, err = ps.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		require.NoError(t, err)
	})

	t.Run("F4: max_holds counts the hold of a stream whose connection dropped until it is released", func(t *testing.T) {
		holds := func() int { return paymentsHolds(t) }
		require.Eventually(t, func() bool { return holds() <= 1 }, 5*time.Second, 50*time.Millisecond, "at most payments/é-😀 is held")
		dropped := s.conn(t, s.payments, "")
		for i := range 2 {
			_, ev, err := acquireAdmitted(t, ctx, dropped, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("payments/drop%d", i)})
			require.NoError(t, err)
			require.NotNil(t, ev.GetAcquired(), "%v", ev)
		}
		require.NoError(t, dropped.Close())
		// While the dropped holds linger, no new hold may take their
		// place: at no time more than 3.
		most, grantedNew := 0, 0
		for i := 0; i < 20; i++ {
			_, ev, err := acquire(t, ctx, payments, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("payments/new%d", i), WaitTimeout: durationpb.New(0)})
			if err == nil && ev.GetAcquired() != nil {
				grantedNew++
			} else if err != nil {
				require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			}
			most = max(most, holds())
			time.Sleep(100 * time.Millisecond)
		}
		assert.LessOrEqual(t, most, 3, "holds at once under max_holds 3")
		t.Logf("%d new holds granted in 2 s after the drop; at most %d holds at once", grantedNew, most)
	})

	t.Run("F4: write_rate, write_bytes_rate and read_rate are RESOURCE_EXHAUSTED with QuotaFailure", func(t *testing.T) {
		oss := lockbrokerv1.NewSessionServiceClient(orders)
		sess, err := oss.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		sid := sess.GetSession().GetId()
		t.Cleanup(func() {
			_, _ = oss.DestroySession(context.Background(), &lockbrokerv1.DestroySessionRequest{SessionId: sid})
		})
		_, err = ol.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "orders/w", SessionId: sid})
		require.NoError(t, err)

		var ok int
		var last error
		start := time.Now()
		for range 20 {
			_, err := ol.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "orders/w", SessionId: sid, Value: []byte("v")})
			if err == nil {
				ok++
			} else {
				last = err
			}
		}
		assert.LessOrEqual(t, float64(ok), 5+5*time.Since(start).Seconds()+1, "write_rate 5")
		requireQuotaFailure(t, last, "orders", "write_rate")

		time.Sleep(time.Second)
		big := bytes.Repeat([]byte("b"), 250<<10)
		ok = 0
		for range 4 {
			_, err := ol.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "orders/w", SessionId: sid, Value: big})
			if err == nil {
				ok++
			} else {
				last = err
			}
		}
		assert.Equal(t, 1, ok, "write_bytes_rate 100000: one value of 250 KiB, then none for seconds")
		requireQuotaFailure(t, last, "orders", "write_bytes_rate")

		ok = 0
		start = time.Now()
		for range 60 {
			_, err := ol.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "orders/w"})
			if err == nil {
				ok++
			} else {
				last = err
			}
		}
		assert.LessOrEqual(t, float64(ok), 20+20*time.Since(start).Seconds()+1, "read_rate 20")
		requireQuotaFailure(t, last, "orders", "read_rate")
	})

	t.Run("F9: a certificate with two CNs is refused as ambiguous", func(t *testing.T) {
		cn := asn1.ObjectIdentifier{2, 5, 4, 3}
		two := s.ca.ClientSubject(t, pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: cn, Value: "alpha-api"}, {Type: cn, Value: "platform-oncall"}}})
		conn := s.conn(t, two, "")
		_, err := lockbrokerv1.NewAdminServiceClient(conn).ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
		requireStatus(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
		assert.Contains(t, status.Convert(err).Message(), "more than one Common Name")
		_, err = lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "payments/x"})
		requireStatus(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
	})

	t.Run("F5, F6: a reload with overlapping prefixes or secrets in the wrong place is refused, naming the mistake and not the secret", func(t *testing.T) {
		good, err := os.ReadFile(s.tenantsFile)
		require.NoError(t, err)
		const pasted = "bearer-pasted-by-mistake-3c9a0e"
		files := map[string]struct {
			body string
			want []string
		}{
			"overlap": {strings.Replace(string(good), "admins:", "  - name: pay\n    identities: [cn:pay]\n    prefixes: [\"pay\"]\nadmins:", 1),
				[]string{`tenant "pay"`, `"pay"`, `tenant "payments"`, `"payments/"`}},
			"bearer identity": {strings.Replace(string(good), `"cn:jobs-api"`, `"Bearer `+pasted+`"`, 1), []string{"no known kind"}},
			"token as path":   {strings.Replace(string(good), `"payments.token"`, `"`+s.paymentsToken+`"`, 1), []string{"consul_token_file (path not shown"}},
		}
		for name, f := range files {
			require.NoError(t, os.WriteFile(s.tenantsFile, []byte(f.body), 0o600))
			before := len(s.broker.logLines(t))
			s.broker.hup(t)
			var msg string
			require.Eventually(t, func() bool {
				for _, l := range s.broker.logLines(t)[before:] {
					if l["msg"] == "reload: tenants file refused, the tenants in force stay" {
						msg = fmt.Sprint(l["error"])
						return true
					}
				}
				return false
			}, 10*time.Second, 50*time.Millisecond, name)
			for _, w := range f.want {
				assert.Contains(t, msg, w, name)
			}
			assert.NotContains(t, msg, pasted, name)
			assert.NotContains(t, msg, s.paymentsToken, name)
		}
		require.NoError(t, os.WriteFile(s.tenantsFile, good, 0o600))
		_, err = pl.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "payments/x"})
		require.NoError(t, err, "the tenants in force stay")
		data, err := os.ReadFile(s.broker.LogPath)
		require.NoError(t, err)
		assert.NotContains(t, string(data), pasted)
		assert.NotContains(t, string(data), s.paymentsToken)
	})

	t.Run("F5: a tenants file with overlapping prefixes is refused at start", func(t *testing.T) {
		path := s.dir + "/overlap.yaml"
		require.NoError(t, os.WriteFile(path, []byte("tenants:\n  - name: pay\n    identities: [cn:pay]\n    prefixes: [pay]\n  - name: payroll\n    identities: [cn:payroll]\n    prefixes: [payroll/]\n"), 0o600))
		p := startBroker(t, false, []string{"CONSUL_HTTP_ADDR=" + s.agent.HTTPAddr(), "CONSUL_HTTP_TOKEN=" + s.brokerToken},
			"--tls-cert", s.certFile, "--tls-key", s.keyFile, "--tls-client-ca", s.caFile, "--tenants", path)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the broker did not exit")
		}
		assert.NotEqual(t, 0, p.cmd.ProcessState.ExitCode())
		out := tail(p.LogPath, 20)
		for _, w := range []string{`tenant "payroll"`, `"payroll/"`, `tenant "pay"`, `"pay"`, "overlap.yaml:5:"} {
			assert.Contains(t, out, w)
		}
	})

	t.Run("no log of the run holds more than a bounded echo of a request field, or a token", func(t *testing.T) {
		for name, path := range map[string]string{"broker": s.broker.LogPath, "consul": s.agent.LogPath()} {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.NotContains(t, string(data), strings.Repeat("k", 1024), name)
			for what, secret := range map[string]string{"broker Consul token": s.brokerToken, "payments Consul token": s.paymentsToken, "payments bearer token": tokenPayments} {
				assert.NotContains(t, string(data), secret, "%s log holds the %s", name, what)
			}
			t.Logf("%s log: %d bytes", name, len(data))
		}
	})
}

// acquireAdmitted is acquire, tried again for up to 5 s while the answer
// is RESOURCE_EXHAUSTED (a max_holds count trusted for a second).
func acquireAdmitted(t *testing.T, ctx context.Context, conn *grpc.ClientConn, req *lockbrokerv1.AcquireRequest) (acquireStream, *lockbrokerv1.AcquireResponse, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, ev, err := acquire(t, ctx, conn, req)
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			return st, ev, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logSize is the size of the broker's log so far.
func (p *brokerProc) logSize(t *testing.T) int64 {
	t.Helper()
	fi, err := os.Stat(p.LogPath)
	require.NoError(t, err)
	return fi.Size()
}

// metricSum sums the broker's /metrics series of name whose labels hold
// match.
func (p *brokerProc) metricSum(t *testing.T, name, match string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	var sum float64
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`\{([^}]*)\} (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		if strings.Contains(m[1], match) {
			v, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

// fieldOf is the field of err's first BadRequest violation.
func fieldOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// requireQuotaFailure checks a RESOURCE_EXHAUSTED answer with a
// QuotaFailure naming the tenant and quota, and a RetryInfo.
func requireQuotaFailure(t *testing.T, err error, tenantName, quota string) {
	t.Helper()
	requireStatus(t, err, codes.ResourceExhausted, "QUOTA_EXCEEDED")
	var qf *errdetails.QuotaFailure
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		switch x := d.(type) {
		case *errdetails.QuotaFailure:
			qf = x
		case *errdetails.RetryInfo:
			ri = x
		}
	}
	require.NotNil(t, qf, "%v", err)
	assert.Equal(t, "tenant:"+tenantName, qf.GetViolations()[0].GetSubject())
	assert.True(t, strings.HasPrefix(qf.GetViolations()[0].GetDescription(), quota+": "), qf.GetViolations()[0].GetDescription())
	require.NotNil(t, ri, "%v", err)
	assert.Positive(t, ri.GetRetryDelay().AsDuration())
}
