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
// drops everything (a blackhole): once the replica's probes have gone
// unanswered for reachGrace, a request already on its way fails then, and
// every new request is refused at once (before, each waited for its Consul
// call's 10 s timeout and a probe: 11.0 s). When the link is back, the
// replica serves again. Nothing is left held in Consul.
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

	// The link back: A serves again once a probe of its agent is answered.
	require.NoError(t, link.p.Start())
	requireAdmits(t, a, locks)
	told := a.Broker.CutOffAnswers()

	// A blackhole. From reachGrace after the last answered probe on, A
	// counts as cut off: the request already on its way ends, and every
	// new request is refused at once, before any Consul call.
	link.toxic(t, "timeout", `{"timeout":0}`)
	cut := time.Now()
	inFlight := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "cutoff-req/blackhole", SessionId: sid})
		inFlight <- err
	}()
	require.Eventually(t, func() bool { return a.Broker.Admit() != nil }, 10*time.Second, 10*time.Millisecond, "A counts itself cut off")
	t.Logf("A counts itself cut off %s after the blackhole", time.Since(cut).Round(time.Millisecond))
	assert.Less(t, time.Since(cut), 5*time.Second, "reachGrace (3 s) after the last answered probe, probed every second")
	refused := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"TryAcquire", func(ctx context.Context) error {
			_, err := locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: "cutoff-req/blackhole-2", SessionId: sid})
			return err
		}},
		{"GetLock", func(ctx context.Context) error {
			_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "cutoff-req/blackhole"})
			return err
		}},
		{"Release", func(ctx context.Context) error {
			_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "cutoff-req/blackhole", SessionId: sid})
			return err
		}},
		{"CreateSession", func(ctx context.Context) error {
			_, err := a.Sessions(t).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
			return err
		}},
		{"ListHolds", func(ctx context.Context) error {
			_, err := lockbrokerv1.NewAdminServiceClient(a.Conn(t)).ListHolds(ctx, &lockbrokerv1.ListHoldsRequest{})
			return err
		}},
		{"Acquire", func(ctx context.Context) error {
			return acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "cutoff-req/raw", Session: fast()}).end(10 * time.Second)
		}},
		{"Watch", func(ctx context.Context) error {
			w, err := locks.Watch(ctx, &lockbrokerv1.WatchRequest{Key: "cutoff-req/blackhole"})
			if err == nil {
				_, err = w.Recv()
			}
			return err
		}},
	}
	for _, r := range refused {
		start := time.Now()
		err := r.call(lkCtx(t))
		took := time.Since(start)
		t.Logf("%s on A, cut off: %v after %s", r.name, err, took.Round(time.Microsecond))
		requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
		assert.Less(t, took, time.Second, "%s: at once, not after a Consul call's timeout", r.name)
	}
	start = time.Now()
	lease, err = client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Lock(lkCtx(t), "cutoff-req/lib", client.WithTTL(10*time.Second))
	require.NoError(t, err)
	t.Logf("the library's Lock through A then B: granted on replica %d after %s", lease.Replica(), time.Since(start).Round(time.Microsecond))
	assert.Equal(t, 1, lease.Replica(), "the library took the lock on B")
	assert.Less(t, time.Since(start), time.Second)
	require.NoError(t, lease.Release(lkCtx(t)))

	select {
	case err := <-inFlight:
		t.Logf("the TryAcquire on its way at the cut: %v, %s after it", err, time.Since(cut).Round(time.Millisecond))
		requireReason(t, err, codes.Unavailable, "REPLICA_CUT_OFF")
		assert.Less(t, time.Since(cut), 8*time.Second, "ended with the cut, not at its Consul call's 10 s timeout")
	case <-time.After(20 * time.Second):
		t.Fatal("the TryAcquire on its way at the cut did not end within 20 s")
	}
	assert.Equal(t, told+uint64(len(refused))+2, a.Broker.CutOffAnswers(), "each refused request, the library's first try and the one on its way")

	link.heal()
	requireAdmits(t, a, locks)
	for _, key := range []string{"cutoff-req/try", "cutoff-req/raw", "cutoff-req/blackhole", "cutoff-req/blackhole-2"} {
		free(key)
	}
}

// TestRequestWithoutConsulLeader: when the replica's agent answers but
// Consul cannot serve (a cluster that lost its quorum), a request fails
// CONSUL_UNAVAILABLE, not REPLICA_CUT_OFF: every replica would fail it the
// same way, and the Python and Node libraries do not move on it.
func TestRequestWithoutConsulLeader(t *testing.T) {
	q := startOnFollower(t)
	locks := q.r.Locks(t)
	sess, err := q.r.Sessions(t).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := sess.GetSession().GetId()
	_, err = locks.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "leaderless/warm", SessionId: sid})
	require.NoError(t, err, "A grants while the cluster has a leader")

	q.loseQuorum(t)
	q.awaitNoLeader(t)

	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	_, err = locks.TryAcquire(rctx, &lockbrokerv1.TryAcquireRequest{Key: "leaderless/try", SessionId: sid})
	t.Logf("TryAcquire without a leader: %v after %s", err, time.Since(start).Round(time.Millisecond))
	requireReason(t, err, codes.Unavailable, "CONSUL_UNAVAILABLE")
	assert.Zero(t, q.r.Broker.CutOffAnswers())
}

// onFollower is a replica whose Consul agent is a follower of a
// three-server cluster.
type onFollower struct {
	r       *brokertest.Replica
	cluster *consultest.Cluster
	mine    int // the server r uses
}

// startOnFollower starts the cluster and the replica (skipped with -short).
func startOnFollower(t *testing.T) *onFollower {
	t.Helper()
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
	return &onFollower{r: brokertest.Start(t, nil, brokertest.WithConsulAddress(cluster.HTTPAddr(mine))), cluster: cluster, mine: mine}
}

// loseQuorum stops the two other servers: the replica's server stays up,
// and answers, without a leader.
func (q *onFollower) loseQuorum(t *testing.T) {
	t.Helper()
	for i := range q.cluster.Size() {
		if i != q.mine {
			require.NoError(t, q.cluster.Stop(i))
		}
	}
}

// awaitNoLeader waits until the replica's server says it has no leader.
func (q *onFollower) awaitNoLeader(t *testing.T) {
	t.Helper()
	mc, err := q.cluster.Client(q.mine)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l, err := mc.Status().Leader()
		return err == nil && l == ""
	}, 30*time.Second, 100*time.Millisecond, "the last server answers, without a leader")
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

// requireAdmits waits until replica r serves requests again after a cut:
// it no longer counts itself cut off (a probe of its agent was answered),
// and a read through it succeeds.
func requireAdmits(t *testing.T, r *brokertest.Replica, locks lockbrokerv1.LockServiceClient) {
	t.Helper()
	start := time.Now()
	require.Eventually(t, func() bool { return r.Broker.Admit() == nil }, 10*time.Second, 10*time.Millisecond, "the replica serves again")
	_, err := locks.GetLock(lkCtx(t), &lockbrokerv1.GetLockRequest{Key: "cutoff-req/warm"})
	require.NoError(t, err)
	t.Logf("the replica serves again %s after the link came back", time.Since(start).Round(time.Millisecond))
}
