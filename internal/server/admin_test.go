package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// TestAdminService proves AdminService with tenants: admins only
// (a tenant's identity and a stranger get PERMISSION_DENIED); ListHolds
// shows each hold with tenant, key, session id and name, token, since and
// replica, and waiters; ListSessions filters by tenant and names it;
// ForceRelease ends the hold and its holder gets `lost` within 1 s; each
// admin call is one audit line with the admin's identity, never a value.
func TestAdminService(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a, b := s.dial(t, p.a, ""), s.dial(t, p.b, "")
	const secretValue = "value-that-must-never-be-logged"
	held, ev, err := acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/adm", Value: []byte(secretValue),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Name: "worker-1"}}})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())
	seq := ev.GetAcquired().GetSequencer()
	_, ev, err = acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/adm"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetQueued())
	waiterSession := ev.GetQueued().GetSessionId()
	_, ev, err = acquire(t, ctx, b, &lockbrokerv1.AcquireRequest{Key: "b/x"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())

	for name, conn := range map[string]*lockbrokerv1.ListHoldsRequest{"tenant": {}, "stranger": {}} {
		c := a
		if name == "stranger" {
			c = s.dial(t, p.strange, "")
		}
		_, err := lockbrokerv1.NewAdminServiceClient(c).ListHolds(ctx, conn)
		requireCode(t, err, codes.PermissionDenied, broker.ReasonPermissionDenied)
	}

	admin := lockbrokerv1.NewAdminServiceClient(s.dial(t, p.admin, ""))
	all, err := admin.ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
	require.NoError(t, err)
	require.Len(t, all.GetHolds(), 3, "%v", all)
	onlyA, err := admin.ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{KeyPrefix: "a/"})
	require.NoError(t, err)
	require.Len(t, onlyA.GetHolds(), 2)
	var hold, waiter *lockbrokerv1.HoldInfo
	for _, h := range onlyA.GetHolds() {
		if h.GetWaiting() {
			waiter = h
		} else {
			hold = h
		}
	}
	require.NotNil(t, hold)
	require.NotNil(t, waiter)
	assert.Equal(t, "a", hold.GetTenant())
	assert.Equal(t, "a/adm", hold.GetKey())
	assert.Equal(t, seq.GetSessionId(), hold.GetSessionId())
	assert.Equal(t, "worker-1", hold.GetSessionName())
	assert.Equal(t, seq.GetToken(), hold.GetToken())
	assert.WithinDuration(t, time.Now(), hold.GetSince().AsTime(), time.Minute)
	assert.NotEmpty(t, hold.GetReplica())
	assert.Equal(t, waiterSession, waiter.GetSessionId())
	assert.Equal(t, "a", waiter.GetTenant())

	sessA, err := admin.ListSessions(ctx, &lockbrokerv1.AdminServiceListSessionsRequest{Tenant: "a"})
	require.NoError(t, err)
	require.NotEmpty(t, sessA.GetSessions())
	for _, x := range sessA.GetSessions() {
		assert.Equal(t, "a", x.GetTenant())
	}

	start := time.Now()
	fr, err := admin.ForceRelease(ctx, &lockbrokerv1.ForceReleaseRequest{Key: "a/adm"})
	require.NoError(t, err)
	assert.EqualValues(t, 1, fr.GetReleased())
	for {
		ev, err := held.Recv()
		require.NoError(t, err)
		if ev.GetKeepalive() != nil {
			continue
		}
		require.NotNil(t, ev.GetLost(), "%v", ev)
		assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RELEASED_BY_OTHER, ev.GetLost().GetReason())
		break
	}
	took := time.Since(start)
	t.Logf("holder told lost %v after ForceRelease was sent", took)
	assert.Less(t, took, time.Second)

	lines := s.auditLines()
	var adminLines int
	for _, e := range lines {
		m := e.ContextMap()
		if m["identity"] == "cn:oncall" {
			adminLines++
			assert.Equal(t, "OK", m["result"])
			assert.Equal(t, true, m["admin"])
		}
	}
	assert.Equal(t, 4, adminLines)
	assert.Equal(t, "a/adm", lines[len(lines)-1].ContextMap()["key"])
	assert.Equal(t, "lockbroker.v1.AdminService/ForceRelease", lines[len(lines)-1].ContextMap()["action"])
	assertNoSecrets(t, s, secretValue)
}

// TestSingleTenant proves that without a tenants file nothing changes
// for callers: no identity is needed (TLS alone), any key may be used,
// AdminService is open, and admin calls are still audited.
func TestSingleTenant(t *testing.T) {
	t.Parallel()
	s := startSecure(t, newPKI(t), consultest.Start(t), nil, false)
	ctx := ctxTimeout(t, 20*time.Second)
	conn := s.dial(t, nil, "")
	_, ev, err := acquire(t, ctx, conn, &lockbrokerv1.AcquireRequest{Key: "any/key", WaitTimeout: durationpb.New(0)})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())
	holds, err := lockbrokerv1.NewAdminServiceClient(conn).ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
	require.NoError(t, err)
	require.Len(t, holds.GetHolds(), 1)
	assert.Empty(t, holds.GetHolds()[0].GetTenant())
	_, err = lockbrokerv1.NewAdminServiceClient(s.dial(t, nil, tokenAdmin)).ListSessions(ctx, &lockbrokerv1.AdminServiceListSessionsRequest{})
	require.NoError(t, err)
	lines := s.auditLines()
	require.Len(t, lines, 2)
	assert.Equal(t, "lockbroker.v1.AdminService/ListHolds", lines[0].ContextMap()["action"])
	assert.Equal(t, "", lines[0].ContextMap()["identity"])
	assert.Equal(t, tenant.TokenIdentity(tokenAdmin), lines[1].ContextMap()["identity"], "the token's identity, never the token")
	assertNoSecrets(t, s)
	assert.InDelta(t, -1, s.tenantMetric(t, "lockbroker_tenant_holds"), 0, "no per-tenant series without tenants")
}
