package consultest

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCluster walks a 3-server cluster through the faults the chaos suite
// injects: leader kill, follower stop, restart on the same ports, and a
// restart of every server, with the data surviving all of them.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three Consul servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, ClusterConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	require.Equal(t, 3, c.Size())

	seen := map[string]bool{}
	for i := range c.Size() {
		require.True(t, c.Running(i))
		require.NotZero(t, c.Pid(i))
		for _, a := range []string{c.HTTPAddr(i), c.ServerAddr(i)} {
			require.False(t, seen[a], "address %s used twice", a)
			seen[a] = true
		}
	}
	cl, err := c.Client(0)
	require.NoError(t, err)
	_, err = cl.KV().Put(&api.KVPair{Key: "cluster/a", Value: []byte("1")}, nil)
	require.NoError(t, err)
	for i := range c.Size() { // replicated: a consistent read on every server
		ci, err := c.Client(i)
		require.NoError(t, err)
		pair, _, err := ci.KV().Get("cluster/a", &api.QueryOptions{RequireConsistent: true})
		require.NoError(t, err)
		require.NotNil(t, pair)
	}

	old, err := c.KillLeader(ctx)
	require.NoError(t, err)
	require.False(t, c.Running(old))
	leader, err := c.WaitLeader(ctx)
	require.NoError(t, err)
	require.NotEqual(t, old, leader, "a killed leader cannot lead")
	require.NoError(t, c.Restart(ctx, old))
	_, err = c.WaitLeader(ctx)
	require.NoError(t, err)

	follower := (leader + 1) % c.Size()
	require.NoError(t, c.Stop(follower))
	require.NoError(t, c.Stop(follower), "idempotent")
	_, err = c.WaitLeader(ctx)
	require.NoError(t, err, "two of three keep a quorum")
	require.NoError(t, c.Restart(ctx, follower))

	// Whole-cluster restart: Raft state is on disk, so the data survives.
	for i := range c.Size() {
		require.NoError(t, c.Stop(i))
	}
	_, err = c.Leader(ctx)
	require.Error(t, err, "no server runs")
	for i := range c.Size() {
		require.NoError(t, c.Restart(ctx, i))
	}
	leader, err = c.WaitLeader(ctx)
	require.NoError(t, err)
	cl, err = c.Client(leader)
	require.NoError(t, err)
	pair, _, err := cl.KV().Get("cluster/a", &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	require.NotNil(t, pair, "data survives a whole-cluster restart")
	require.Equal(t, "1", string(pair.Value))
}
