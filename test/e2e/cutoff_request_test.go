package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestRequestOnCutOffReplica: a request arriving at a replica cut off from
// its Consul agent fails UNAVAILABLE with REPLICA_CUT_OFF, on which every
// library goes to another replica (with CONSUL_UNAVAILABLE, Python and Node
// gave up: another replica fails alike when Consul itself is down). First
// the link refuses (the agent stopped): the answer comes at once. Then it
// drops everything (a blackhole): after the Consul call's timeout. Nothing
// is left held in Consul.
func TestRequestOnCutOffReplica(t *testing.T) {
	agent, link, a, b := replicasOneBehindLink(t)
	locks := a.Locks(t)
	kv := agent.Client().KV()
	free := func(key string) {
		t.Helper()
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		if e != nil {
			assert.Empty(t, e.Session, "%s is held", key)
		}
	}
	_, err := locks.GetLock(lkCtx(t), &lockbrokerv1.GetLockRequest{Key: "cutoff-req/warm"})
	require.NoError(t, err, "A answers while its link is up")
	sess, err := b.Sessions(t).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := sess.GetSession().GetId()

	link.p.Stop() // refused
	start := time.Now()
	_, err = locks.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "cutoff-req/try", SessionId: sid})
	t.Logf("TryAcquire on A, link refused: %v after %s", err, time.Since(start).Round(time.Millisecond))
	requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
	assert.Less(t, time.Since(start), 3*time.Second)
	_, err = locks.GetLock(lkCtx(t), &lockbrokerv1.GetLockRequest{Key: "cutoff-req/try"})
	requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
	_, err = a.Sessions(t).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
	raw := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "cutoff-req/raw", Session: fast()})
	requireReason(t, raw.end(10*time.Second), codes.Unavailable, "REPLICA_CUT_OFF")
	assert.Equal(t, uint64(4), a.Broker.CutOffAnswers(), "lockbroker_replica_cut_off_total")

	lease, err := client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Lock(lkCtx(t), "cutoff-req/lib", client.WithTTL(10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 1, lease.Replica(), "the library took the lock on B")
	require.NoError(t, lease.Release(lkCtx(t)))

	require.NoError(t, link.p.Start())
	link.toxic(t, "timeout", `{"timeout":0}`) // a blackhole
	start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "cutoff-req/blackhole", SessionId: sid})
	t.Logf("TryAcquire on A, link a blackhole: %v after %s", err, time.Since(start).Round(time.Millisecond))
	requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
	assert.Equal(t, uint64(6), a.Broker.CutOffAnswers(), "and the library's Lock, and this one")
	link.heal()

	for _, key := range []string{"cutoff-req/try", "cutoff-req/raw", "cutoff-req/blackhole"} {
		free(key)
	}
}

// TestRequestWithoutConsulLeader: when the replica's agent answers but
// Consul cannot serve (a cluster that lost its quorum), a request fails
// CONSUL_UNAVAILABLE, not REPLICA_CUT_OFF: every replica would fail it the
// same way, and the Python and Node libraries do not move on it.
func TestRequestWithoutConsulLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three Consul servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := consultest.StartCluster(ctx, consultest.ClusterConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	leader, err := cluster.WaitLeader(ctx)
	require.NoError(t, err)
	mine := (leader + 1) % cluster.Size()
	a := brokertest.Start(t, nil, brokertest.WithConsulAddress(cluster.HTTPAddr(mine)))
	locks := a.Locks(t)
	sess, err := a.Sessions(t).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := sess.GetSession().GetId()
	_, err = locks.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "leaderless/warm", SessionId: sid})
	require.NoError(t, err, "A grants while the cluster has a leader")

	for i := range cluster.Size() {
		if i != mine {
			require.NoError(t, cluster.Stop(i))
		}
	}
	mc, err := cluster.Client(mine)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := mc.Status().Leader()
		return err == nil && l == ""
	}, 30*time.Second, 100*time.Millisecond, "the last server answers, without a leader")

	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	_, err = locks.TryAcquire(rctx, &lockbrokerv1.TryAcquireRequest{Key: "leaderless/try", SessionId: sid})
	t.Logf("TryAcquire without a leader: %v after %s", err, time.Since(start).Round(time.Millisecond))
	requireReason(t, err, codes.Unavailable, "CONSUL_UNAVAILABLE")
	assert.Zero(t, a.Broker.CutOffAnswers())
}

// requireReason: err is a status of code with an ErrorInfo of reason.
func requireReason(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, status.Code(err), "%v", err)
	require.Equal(t, reason, reasonOf(err), "%v", err)
}

// reasonOf is the ErrorInfo reason of a status error ("" without one).
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
