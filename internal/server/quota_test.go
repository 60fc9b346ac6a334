package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// requireQuota checks a RESOURCE_EXHAUSTED answer: ErrorInfo
// QUOTA_EXCEEDED naming tenant and quota, a QuotaFailure for the tenant,
// and a RetryInfo; it returns the retry delay.
func requireQuota(t *testing.T, err error, tenantName, quota string) time.Duration {
	t.Helper()
	requireCode(t, err, codes.ResourceExhausted, broker.ReasonQuotaExceeded)
	info := errorInfo(t, err)
	assert.Equal(t, tenantName, info.GetMetadata()["tenant"])
	assert.Equal(t, quota, info.GetMetadata()["quota"])
	var (
		qf    *errdetails.QuotaFailure
		retry *errdetails.RetryInfo
	)
	for _, d := range status.Convert(err).Details() {
		switch x := d.(type) {
		case *errdetails.QuotaFailure:
			qf = x
		case *errdetails.RetryInfo:
			retry = x
		}
	}
	require.NotNil(t, qf, "QuotaFailure")
	require.Len(t, qf.GetViolations(), 1)
	assert.Equal(t, "tenant:"+tenantName, qf.GetViolations()[0].GetSubject())
	assert.True(t, strings.HasPrefix(qf.GetViolations()[0].GetDescription(), quota+": "), qf.GetViolations()[0].GetDescription())
	require.NotNil(t, retry, "RetryInfo")
	d := retry.GetRetryDelay().AsDuration()
	assert.Positive(t, d)
	return d
}

// TestQuotaMaxHolds proves max_holds: the tenant's holds and its Acquire
// streams waiting on the replica are capped; one more is
// RESOURCE_EXHAUSTED with details and audited; another tenant is not
// affected; a slot comes back when a stream ends. The per-tenant gauges
// follow holds and waiters.
func TestQuotaMaxHolds(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("    max_holds: 2")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a := s.dial(t, p.a, "")

	_, ev, err := acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/q"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired(), "%v", ev)
	wctx, cancelWaiter := context.WithCancel(ctx)
	_, ev, err = acquire(t, wctx, a, &lockbrokerv1.AcquireRequest{Key: "a/q"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetQueued(), "%v", ev)
	assert.InDelta(t, 1, s.tenantMetric(t, "lockbroker_tenant_holds", "tenant", "a"), 0)
	assert.InDelta(t, 1, s.tenantMetric(t, "lockbroker_tenant_waiters", "tenant", "a"), 0)

	// The holder renews and the waiter retries meanwhile: count what a
	// new Acquire does first, creating its session.
	before := s.consulCalls(t, "session_create")
	_, _, err = acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/other"})
	requireQuota(t, err, "a", quotaHolds)
	assert.InDelta(t, before, s.consulCalls(t, "session_create"), 0, "a refused Acquire creates no session")
	assert.InDelta(t, 1, s.tenantMetric(t, "lockbroker_tenant_quota_refusals_total", "tenant", "a", "quota", quotaHolds), 0)
	lines := s.auditLines()
	require.Len(t, lines, 1)
	assert.Equal(t, "RESOURCE_EXHAUSTED", lines[0].ContextMap()["result"])
	assert.Equal(t, quotaHolds, lines[0].ContextMap()["quota"])
	assert.Equal(t, "a/other", lines[0].ContextMap()["key"])

	// Tenant b has its own count.
	_, ev, err = acquire(t, ctx, s.dial(t, p.b, ""), &lockbrokerv1.AcquireRequest{Key: "b/q"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())

	cancelWaiter()
	require.Eventually(t, func() bool { return s.tenantMetric(t, "lockbroker_tenant_waiters", "tenant", "a") == 0 }, 5*time.Second, 10*time.Millisecond)
	_, ev, err = acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/other"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())
	assert.InDelta(t, 2, s.tenantMetric(t, "lockbroker_tenant_holds", "tenant", "a"), 0)
	assert.InDelta(t, 2, s.tenantMetric(t, "lockbroker_tenant_acquires_total", "tenant", "a"), 0)
}

// TestQuotaMaxHoldsClientOwned proves that max_holds counts an Acquire
// on a client-owned session while it waits and the holds of client-owned
// sessions after their calls (TryAcquire), and that a count in Consul
// gives a slot back once such a hold is released.
func TestQuotaMaxHoldsClientOwned(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("    max_holds: 2")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a := s.dial(t, p.a, "")
	locks := lockbrokerv1.NewLockServiceClient(a)
	created, err := lockbrokerv1.NewSessionServiceClient(a).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := created.GetSession().GetId()

	_, ev, err := acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/q"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired(), "%v", ev)
	wctx, cancelWaiter := context.WithCancel(ctx)
	_, ev, err = acquire(t, wctx, a, &lockbrokerv1.AcquireRequest{Key: "a/q", Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}})
	require.NoError(t, err)
	require.NotNil(t, ev.GetQueued(), "%v", ev)
	_, err = locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/t", SessionId: sid})
	requireQuota(t, err, "a", quotaHolds)

	cancelWaiter()
	var seq *lockbrokerv1.Sequencer
	require.Eventually(t, func() bool {
		resp, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/t", SessionId: sid})
		seq = resp.GetSequencer()
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "the waiter's slot comes back")
	// The hold outlives its call: one stream and one client-owned hold.
	_, err = locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/u", SessionId: sid})
	requireQuota(t, err, "a", quotaHolds)
	_, err = locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "a/t", SessionId: sid, Token: seq.GetToken()})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/u", SessionId: sid})
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "a released client-owned hold gives its slot back at the next count")
}

// TestQuotaAcquireRate proves acquire_rate: a burst of calls gets at most
// the burst (the rate) plus what the bucket earns while they run; the
// others are RESOURCE_EXHAUSTED with a RetryInfo no longer than one
// token's time.
func TestQuotaAcquireRate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("    acquire_rate: 2")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a := s.dial(t, p.a, "")
	created, err := lockbrokerv1.NewSessionServiceClient(a).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	locks := lockbrokerv1.NewLockServiceClient(a)

	const calls = 10
	start := time.Now()
	var ok, refused int
	for i := range calls {
		var err error
		if i%2 == 0 {
			_, err = locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/rate/" + string(rune('a'+i)), SessionId: created.GetSession().GetId()})
		} else {
			_, _, err = acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/rate/" + string(rune('a'+i)), WaitTimeout: durationpb.New(0),
				Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: created.GetSession().GetId()}})
		}
		if status.Code(err) == codes.ResourceExhausted {
			refused++
			assert.LessOrEqual(t, requireQuota(t, err, "a", quotaRate), 500*time.Millisecond)
			continue
		}
		require.NoError(t, err)
		ok++
	}
	elapsed := time.Since(start)
	t.Logf("%d calls in %v: %d admitted, %d refused", calls, elapsed, ok, refused)
	assert.Positive(t, refused)
	assert.LessOrEqual(t, float64(ok), 2+2*elapsed.Seconds()+1)
	assert.InDelta(t, float64(refused), s.tenantMetric(t, "lockbroker_tenant_quota_refusals_total", "tenant", "a", "quota", quotaRate), 0)
}

// TestQuotaMaxSessions proves max_sessions: the tenant's client-owned
// sessions alive in Consul are capped; one more is RESOURCE_EXHAUSTED;
// after one is destroyed a new one is allowed (within the recount
// interval); broker-owned sessions (Acquire streams) do not count.
func TestQuotaMaxSessions(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("    max_sessions: 2")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a := s.dial(t, p.a, "")
	sessions := lockbrokerv1.NewSessionServiceClient(a)
	var ids []string
	for range 2 {
		c, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		ids = append(ids, c.GetSession().GetId())
	}
	_, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	requireQuota(t, err, "a", quotaSessions)

	_, ev, err := acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/s"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired(), "a broker-owned session is not a client-owned one")

	_, err = sessions.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: ids[0]})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
		return err == nil
	}, 5*time.Second, 100*time.Millisecond)
	_, err = sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	requireQuota(t, err, "a", quotaSessions)
}
