package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

const otherSession = "5f0c8a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b"

// acquire opens an Acquire stream and returns it with its first event.
func acquire(t *testing.T, ctx context.Context, conn grpc.ClientConnInterface, req *lockbrokerv1.AcquireRequest) (grpc.ServerStreamingClient[lockbrokerv1.AcquireResponse], *lockbrokerv1.AcquireResponse, error) {
	t.Helper()
	st, err := lockbrokerv1.NewLockServiceClient(conn).Acquire(ctx, req)
	require.NoError(t, err)
	ev, err := st.Recv()
	return st, ev, err
}

// assertNoSecrets checks that no log line of the broker holds a bearer
// token or one of the given values.
func assertNoSecrets(t *testing.T, s *secure, values ...string) {
	t.Helper()
	text := s.allLogText()
	for _, secret := range append([]string{tokenA, tokenB, tokenAdmin}, values...) {
		assert.NotContains(t, text, secret)
	}
}

// TestAccessWithoutIdentity proves, with tenants and TLS but no client
// certificates: health and reflection answer without an identity; every
// LockService, SessionService and AdminService call without one, or with
// a token the file does not know, is UNAUTHENTICATED (ErrorInfo
// UNAUTHENTICATED) and audited; a known token is let in; no log holds a
// token.
func TestAccessWithoutIdentity(t *testing.T) {
	t.Parallel()
	s := startSecure(t, newPKI(t), consultest.Start(t), parseTenants(t, tenantsYAML("")), false)
	ctx := ctxTimeout(t, 20*time.Second)
	anon := s.dial(t, nil, "")

	h, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.GetStatus())
	refl, err := reflectionpb.NewServerReflectionClient(anon).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	rr, err := refl.Recv()
	require.NoError(t, err)
	var names []string
	for _, svc := range rr.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	assert.Contains(t, names, "lockbroker.v1.AdminService")
	require.NoError(t, refl.CloseSend())

	calls := map[string]func(conn *grpc.ClientConn) error{
		"GetLock": func(conn *grpc.ClientConn) error {
			_, err := lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a/x"})
			return err
		},
		"Acquire": func(conn *grpc.ClientConn) error {
			_, _, err := acquire(t, ctx, conn, &lockbrokerv1.AcquireRequest{Key: "a/x"})
			return err
		},
		"CreateSession": func(conn *grpc.ClientConn) error {
			_, err := lockbrokerv1.NewSessionServiceClient(conn).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
			return err
		},
		"ListHolds": func(conn *grpc.ClientConn) error {
			_, err := lockbrokerv1.NewAdminServiceClient(conn).ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
			return err
		},
	}
	bad := s.dial(t, nil, "not-a-token-the-file-knows")
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			requireCode(t, call(anon), codes.Unauthenticated, broker.ReasonUnauthenticated)
			err := call(bad)
			requireCode(t, err, codes.Unauthenticated, broker.ReasonUnauthenticated)
			assert.Contains(t, status.Convert(err).Message(), "not recognised")
		})
	}
	// A malformed request is still UNAUTHENTICATED, and leaves nothing
	// behind in the request codec.
	_, err = lockbrokerv1.NewLockServiceClient(anon).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a//x"})
	requireCode(t, err, codes.Unauthenticated, broker.ReasonUnauthenticated)

	good := s.dial(t, nil, tokenA)
	_, err = lockbrokerv1.NewLockServiceClient(good).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a/x"})
	require.NoError(t, err)

	lines := s.auditLines()
	require.Len(t, lines, 2*len(calls)+1)
	for _, e := range lines {
		assert.Equal(t, "UNAUTHENTICATED", e.ContextMap()["result"])
	}
	assertNoSecrets(t, s, "not-a-token-the-file-knows")
}

// TestAccessMutualTLS proves, with --tls-client-ca: a connection without
// a client certificate, or with one from another CA, is refused at the
// handshake; cn: and uri: identities find their tenant; a verified
// certificate the file does not know gets PERMISSION_DENIED (it is not a
// tenant), and still reaches health.
func TestAccessMutualTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("")), true)
	ctx := ctxTimeout(t, 20*time.Second)
	health := func(conn *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	getLock := func(conn *grpc.ClientConn, key string) error {
		_, err := lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
		return err
	}

	err := health(s.dial(t, nil, ""))
	// The server's "certificate required" alert, or the connection it
	// closed, depending on who writes first.
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	other := testpki.NewCA(t, "another CA").Client(t, "tenant-a")
	err = health(s.dial(t, other, ""))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	for name, cert := range map[string]*testpki.Pair{"cn": p.a, "uri": p.aURI} {
		conn := s.dial(t, cert, "")
		require.NoError(t, getLock(conn, "a/x"), name)
		requireCode(t, getLock(conn, "b/x"), codes.PermissionDenied, broker.ReasonPermissionDenied)
	}
	stranger := s.dial(t, p.strange, "")
	require.NoError(t, health(stranger))
	err = getLock(stranger, "a/x")
	requireCode(t, err, codes.PermissionDenied, broker.ReasonPermissionDenied)
	assert.Contains(t, status.Convert(err).Message(), "cn:mallory belongs to no tenant")
}

// TestAccessKeysOutsidePrefixes proves that every RPC that names a key
// (Acquire, also through resume; TryAcquire, Release, Watch of a key and
// of a prefix, GetLock, SetValue, CheckSequencer) refuses a key outside
// the caller's prefixes with PERMISSION_DENIED naming the key (message
// and ErrorInfo metadata), before any Consul call (the broker's Consul
// call counters do not move), and audits each refusal; the broker's own
// prefix is refused the same way.
func TestAccessKeysOutsidePrefixes(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	conn := s.dial(t, p.a, "")
	locks := lockbrokerv1.NewLockServiceClient(conn)
	seq := func(key string) *lockbrokerv1.Sequencer {
		return &lockbrokerv1.Sequencer{Key: key, SessionId: otherSession, Token: 7, LockIndex: 1, Kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK}
	}
	stream := func(open func() (interface{ CloseSend() error }, func() error, error)) error {
		_, recv, err := open()
		require.NoError(t, err)
		return recv()
	}
	tests := []struct {
		name, key string
		call      func(key string) error
	}{
		{"Acquire", "b/x", func(key string) error {
			_, _, err := acquire(t, ctx, conn, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(0)})
			return err
		}},
		{"Acquire resume", "b/x", func(key string) error {
			_, _, err := acquire(t, ctx, conn, &lockbrokerv1.AcquireRequest{Key: "a/x", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq(key)}})
			return err
		}},
		{"TryAcquire", "b/x", func(key string) error {
			_, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: key, SessionId: otherSession})
			return err
		}},
		{"Release", "b/x", func(key string) error {
			_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: otherSession})
			return err
		}},
		{"Watch key", "b/x", func(key string) error {
			return stream(func() (interface{ CloseSend() error }, func() error, error) {
				w, err := locks.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
				return w, func() error { _, err := w.Recv(); return err }, err
			})
		}},
		{"Watch prefix", "a", func(key string) error { // covers "a" itself, outside "a/"
			return stream(func() (interface{ CloseSend() error }, func() error, error) {
				w, err := locks.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key, Prefix: true})
				return w, func() error { _, err := w.Recv(); return err }, err
			})
		}},
		{"GetLock", "b/x", func(key string) error {
			_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
			return err
		}},
		{"GetLock broker prefix", "lockbroker/sessions/" + otherSession, func(key string) error {
			_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
			return err
		}},
		{"SetValue", "b/x", func(key string) error {
			_, err := locks.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: key, SessionId: otherSession, Value: []byte("v")})
			return err
		}},
		{"CheckSequencer", "b/x", func(key string) error {
			_, err := locks.CheckSequencer(ctx, &lockbrokerv1.CheckSequencerRequest{Sequencer: seq(key)})
			return err
		}},
	}
	before := s.consulCalls(t, requestOps...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(tt.key)
			requireCode(t, err, codes.PermissionDenied, broker.ReasonPermissionDenied)
			assert.Contains(t, status.Convert(err).Message(), `"`+tt.key+`"`)
			assert.Equal(t, tt.key, errorInfo(t, err).GetMetadata()["key"])
		})
	}
	assert.InDelta(t, before, s.consulCalls(t, requestOps...), 0, "no Consul call for a refused key")
	assert.InDelta(t, float64(len(tests)), s.tenantMetric(t, "lockbroker_tenant_denials_total", "tenant", "a"), 0)

	lines := s.auditLines()
	require.Len(t, lines, len(tests))
	for i, e := range lines {
		m := e.ContextMap()
		assert.Equal(t, "cn:tenant-a", m["identity"])
		assert.Equal(t, "a", m["tenant"])
		assert.Equal(t, "PERMISSION_DENIED", m["result"])
		assert.Equal(t, "PERMISSION_DENIED", m["reason"])
		assert.Equal(t, tests[i].key, m["key"], tests[i].name)
		assert.True(t, strings.HasPrefix(m["action"].(string), "lockbroker.v1.LockService/"))
	}

	// Inside the prefixes the same calls reach the broker.
	_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a/x"})
	require.NoError(t, err)
	assert.Greater(t, s.consulCalls(t, requestOps...), before)
}

// TestAccessSessionsBelongToTenant proves that a session belongs to the
// tenant that made it: another tenant's RenewSession, GetSession,
// DestroySession, Release, SetValue, TryAcquire and Acquire with that id
// get NOT_FOUND, and the owner's session and hold are untouched.
func TestAccessSessionsBelongToTenant(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, tenantsYAML("")), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a, b := s.dial(t, p.a, ""), s.dial(t, p.b, "")
	created, err := lockbrokerv1.NewSessionServiceClient(a).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := created.GetSession().GetId()
	_, err = lockbrokerv1.NewLockServiceClient(a).TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "a/owned", SessionId: sid})
	require.NoError(t, err)

	bs, bl := lockbrokerv1.NewSessionServiceClient(b), lockbrokerv1.NewLockServiceClient(b)
	tests := map[string]func() error{
		"RenewSession": func() error {
			_, err := bs.RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: sid})
			return err
		},
		"GetSession": func() error {
			_, err := bs.GetSession(ctx, &lockbrokerv1.GetSessionRequest{SessionId: sid})
			return err
		},
		"DestroySession": func() error {
			_, err := bs.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sid})
			return err
		},
		"Release": func() error {
			_, err := bl.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "b/x", SessionId: sid})
			return err
		},
		"SetValue": func() error {
			_, err := bl.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: "b/x", SessionId: sid, Value: []byte("v")})
			return err
		},
		"TryAcquire": func() error {
			_, err := bl.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "b/x", SessionId: sid})
			return err
		},
		"Acquire": func() error {
			_, _, err := acquire(t, ctx, b, &lockbrokerv1.AcquireRequest{Key: "b/x", Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: sid}})
			return err
		},
	}
	for name, call := range tests {
		t.Run(name, func(t *testing.T) {
			requireCode(t, call(), codes.NotFound, broker.ReasonSessionNotFound)
		})
	}
	got, err := lockbrokerv1.NewSessionServiceClient(a).GetSession(ctx, &lockbrokerv1.GetSessionRequest{SessionId: sid})
	require.NoError(t, err)
	assert.Equal(t, sid, got.GetSession().GetId())
	st, err := lockbrokerv1.NewLockServiceClient(a).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a/owned"})
	require.NoError(t, err)
	require.Len(t, st.GetState().GetHolders(), 1)
	assert.Equal(t, sid, st.GetState().GetHolders()[0].GetSessionId())
}
