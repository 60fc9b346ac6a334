package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// TestHoldMovesOffCutOffReplica: a hold whose replica is cut off from its
// Consul agent is not lost with its renewals. Once the replica counts as
// cut off (3 s without an answer), its held streams of broker-owned
// sessions get `lost: REPLICA_CUT_OFF` with what is left of their
// guarantee, the Go library resumes the hold on the next replica, which
// renews the session, and the hold outlives the session's TTL counted from
// the cut. Before, a raw stream heard nothing more (keepalives come with
// renewals) and was told RENEWAL_FAILED 9 s after the cut; the library
// moved only by its silence rule, 0.6 of the last guarantee after the last
// keepalive (3.2 to 5.4 s after the cut). When the link is back, the
// cut-off replica touches nothing of the hold that moved.
func TestHoldMovesOffCutOffReplica(t *testing.T) {
	agent, link, a, b := replicasOneBehindLink(t)
	kv := agent.Client().KV()
	const ttl = 10 * time.Second
	key := "cutoff-hold/lib"
	lease, err := client.New(a.Conn(t), client.WithReplicas(b.Conn(t))).Lock(lkCtx(t), key, client.WithTTL(ttl), client.WithLockDelay(0))
	require.NoError(t, err)
	require.Equal(t, 0, lease.Replica(), "held through A")
	seq := lease.Sequencer()
	raw := acquire(t, a.Locks(t), &lockbrokerv1.AcquireRequest{Key: "cutoff-hold/raw", Session: fast()})
	raw.acquired(5 * time.Second)

	link.p.Stop() // A's agent refuses from now on
	cut := time.Now()

	// The raw stream is told to go, with the rest of its guarantee.
	lost := raw.next(10*time.Second, isLost).GetLost()
	t.Logf("the raw hold on A: lost %s %s after the cut, guaranteed for %s more: %s", lost.GetReason(), time.Since(cut).Round(time.Millisecond),
		lost.GetGuaranteedFor().AsDuration().Round(time.Millisecond), lost.GetDetail())
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF, lost.GetReason())
	assert.Positive(t, lost.GetGuaranteedFor().AsDuration(), "the session was renewed less than a TTL ago")
	assert.Less(t, time.Since(cut), 6*time.Second)

	// The library's lease moves to B, with its grant.
	require.Eventually(t, func() bool { return lease.Replica() == 1 }, 10*time.Second, 10*time.Millisecond, "the lease resumed on B")
	t.Logf("the lease resumed on B %s after the cut", time.Since(cut).Round(time.Millisecond))
	assert.NoError(t, lease.Err())
	assert.Equal(t, seq.GetToken(), lease.Sequencer().GetToken(), "the same grant")

	// B renews the session: the hold outlives the TTL counted from the cut
	// (and from A's last renewal before it).
	heldBy := func() string {
		t.Helper()
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		if e == nil {
			return ""
		}
		return e.Session
	}
	select {
	case <-lease.Lost():
		t.Fatalf("the lease was lost %s after the cut: %v", time.Since(cut).Round(time.Millisecond), lease.Err())
	case <-time.After(time.Until(cut.Add(ttl + 2*time.Second))):
	}
	assert.Equal(t, seq.GetSessionId(), heldBy(), "the session still holds the key, a TTL after the cut")

	// The link back: A, whose copy of the hold was fenced by the resume,
	// leaves it alone.
	require.NoError(t, link.p.Start())
	requireAdmits(t, a, a.Locks(t))
	time.Sleep(2 * time.Second)
	assert.NoError(t, lease.Err())
	assert.Equal(t, seq.GetSessionId(), heldBy(), "still held after A is back")

	require.NoError(t, lease.Release(lkCtx(t)))
	assert.Empty(t, heldBy(), "released through B")
}

// TestHoldOnCutOffReplicaWithNowhereToGo: with a single replica, a hold
// told to move off its cut-off replica cannot: the library's resume is
// refused (REPLICA_CUT_OFF) until the guarantee runs out, and the lease
// ends lost before Consul may give the key to anyone else, as before.
func TestHoldOnCutOffReplicaWithNowhereToGo(t *testing.T) {
	agent, link, a, _ := replicasOneBehindLink(t)
	const ttl = 10 * time.Second
	lease, err := client.New(a.Conn(t)).Lock(lkCtx(t), "cutoff-hold/alone", client.WithTTL(ttl), client.WithLockDelay(0))
	require.NoError(t, err)
	link.p.Stop()
	cut := time.Now()
	select {
	case <-lease.Lost():
		t.Logf("lost %s after the cut: %v", time.Since(cut).Round(time.Millisecond), lease.Err())
		var le *client.LostError
		require.ErrorAs(t, lease.Err(), &le)
		assert.Less(t, time.Since(cut), ttl, "before the session's TTL from the cut")
	case <-time.After(2 * ttl):
		t.Fatal("the lease was not lost within two TTLs of the cut")
	}
	// Consul frees the key once the session's TTL runs out (A could not
	// renew it): nobody held it past the lease.
	require.NoError(t, link.p.Start())
	require.Eventually(t, func() bool {
		e, _, err := agent.Client().KV().Get("cutoff-hold/alone", &api.QueryOptions{RequireConsistent: true})
		return err == nil && (e == nil || e.Session == "")
	}, 3*ttl, 100*time.Millisecond)
}
