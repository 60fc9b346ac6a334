package security

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/testpki"
)

// TestConsulOverHTTPSOnly proves that the broker reaches a Consul that
// serves its API over HTTPS only and requires client certificates, when
// configured by the standard variables alone (CONSUL_HTTP_ADDR,
// CONSUL_HTTP_SSL, CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY):
// a lock is granted and released. Without the client certificate the
// broker never reports SERVING and a lock is UNAVAILABLE, never INTERNAL.
func TestConsulOverHTTPSOnly(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "consul CA")
	caFile := ca.WriteCA(t, dir, "consul-ca.pem")
	srvCert, srvKey := ca.Server(t, "server.dc1.consul", "server.dc1.consul").Write(t, dir, "consul")
	cliCert, cliKey := ca.Client(t, "lockbroker").Write(t, dir, "broker-client")
	agent := consultest.Start(t, consultest.WithHTTPSOnly(consultest.HTTPS{
		CAFile: caFile, CertFile: srvCert, KeyFile: srvKey, ClientCertFile: cliCert, ClientKeyFile: cliKey,
	}))
	env := []string{
		"CONSUL_HTTP_ADDR=" + agent.HTTPAddr(), "CONSUL_HTTP_SSL=true", "CONSUL_CACERT=" + caFile,
		"CONSUL_CLIENT_CERT=" + cliCert, "CONSUL_CLIENT_KEY=" + cliKey,
	}
	b := startBroker(t, true, env)
	ctx := timeout(t, time.Minute)
	conn, err := grpc.NewClient(b.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	locks := lockbrokerv1.NewLockServiceClient(conn)
	st, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "tls/lock", WaitTimeout: durationpb.New(0)})
	require.NoError(t, err)
	ev, err := st.Recv()
	require.NoError(t, err)
	seq := ev.GetAcquired().GetSequencer()
	require.NotNil(t, seq, "%v", ev)
	rel, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "tls/lock", SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	assert.True(t, rel.GetReleased())

	// The same without the client certificate: Consul refuses the
	// handshake, the broker stays NOT_SERVING and says UNAVAILABLE: its
	// agent does not answer it at all (REPLICA_CUT_OFF; another replica,
	// configured right, would).
	noCert := startBroker(t, false, env[:3])
	nc, err := grpc.NewClient(noCert.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	require.Eventually(t, noCert.answering, 30*time.Second, 50*time.Millisecond, "the broker listens")
	_, err = lockbrokerv1.NewLockServiceClient(nc).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "tls/lock"})
	requireStatus(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
	assert.False(t, noCert.serving())
	t.Logf("without CONSUL_CLIENT_CERT: %v", err)
}
