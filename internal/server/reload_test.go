package server

import (
	"crypto/tls"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestSetTenants proves that a new tenants file takes effect for new
// calls (a new identity is let in, a removed one refused) while a hold
// made before keeps its stream (no `lost`), and that a single-tenant
// server refuses to become multi-tenant.
func TestSetTenants(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	first := `tenants:
  - name: a
    identities: ["cn:tenant-a"]
    prefixes: ["a/"]
`
	s := startSecure(t, p, consultest.Start(t), parseTenants(t, first), true)
	ctx := ctxTimeout(t, 30*time.Second)
	a, b := s.dial(t, p.a, ""), s.dial(t, p.b, "")
	held, ev, err := acquire(t, ctx, a, &lockbrokerv1.AcquireRequest{Key: "a/keep"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())
	_, err = lockbrokerv1.NewLockServiceClient(b).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "b/x"})
	requireCode(t, err, codes.PermissionDenied, broker.ReasonPermissionDenied)

	// tenant-a moves to a new tenant name "a2" with the same prefix; b
	// arrives.
	second := `tenants:
  - name: a2
    identities: ["uri:spiffe://corp/ns/a/sa/api"]
    prefixes: ["a/"]
  - name: b
    identities: ["cn:tenant-b"]
    prefixes: ["b/"]
`
	require.NoError(t, s.srv.SetTenants(parseTenants(t, second)))
	_, err = lockbrokerv1.NewLockServiceClient(b).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "b/x"})
	require.NoError(t, err)
	_, err = lockbrokerv1.NewLockServiceClient(a).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "a/keep"})
	requireCode(t, err, codes.PermissionDenied, broker.ReasonPermissionDenied)

	// The hold made before is still held: its stream is open and the key
	// is its session's.
	holds, err := s.b.ListHolds(ctx, "a/keep")
	require.NoError(t, err)
	require.Len(t, holds, 1)
	assert.Equal(t, ev.GetAcquired().GetSequencer().GetSessionId(), holds[0].Session)
	assert.Equal(t, "a", holds[0].Tenant, "the record keeps the tenant it was made for")
	recvd := make(chan *lockbrokerv1.AcquireResponse, 1)
	go func() {
		if ev, err := held.Recv(); err == nil {
			recvd <- ev
		}
	}()
	select {
	case ev := <-recvd:
		assert.Nil(t, ev.GetLost(), "the hold survives the reload: %v", ev)
	case <-time.After(300 * time.Millisecond):
	}

	single := startSecure(t, p, s.agent, nil, false)
	assert.Error(t, single.srv.SetTenants(parseTenants(t, second)))
	assert.Nil(t, single.srv.Tenants())
}

// TestTLSReload proves that Reload serves a new certificate to new
// connections while a connection (and its stream) made before keeps
// working, and that a failed reload keeps the certificate in force.
func TestTLSReload(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := startSecure(t, p, consultest.Start(t), nil, false)
	ctx := ctxTimeout(t, 20*time.Second)
	serial := func() string {
		conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: p.ca.Pool(), NextProtos: []string{"h2"}, ServerName: "127.0.0.1"})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	old := serial()
	conn := s.dial(t, nil, "")
	held, ev, err := acquire(t, ctx, conn, &lockbrokerv1.AcquireRequest{Key: "tls/keep"})
	require.NoError(t, err)
	require.NotNil(t, ev.GetAcquired())

	newCert, newKey := p.ca.Server(t, "broker-renewed").Write(t, t.TempDir(), "renewed")
	copyFile(t, newCert, p.certFile)
	copyFile(t, newKey, p.keyFile)
	require.NoError(t, s.tls.Reload())
	renewed := serial()
	assert.NotEqual(t, old, renewed, "new connections get the new certificate")
	_, err = lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "tls/keep"})
	require.NoError(t, err, "the old connection still works")
	st, err := lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "tls/keep"})
	require.NoError(t, err)
	assert.Len(t, st.GetState().GetHolders(), 1, "the hold made before the reload is still held")

	require.NoError(t, os.WriteFile(p.keyFile, []byte("not a key"), 0o600))
	require.Error(t, s.tls.Reload())
	assert.Equal(t, renewed, serial(), "a failed reload keeps the certificate in force")
	_ = held
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, data, 0o600))
}
