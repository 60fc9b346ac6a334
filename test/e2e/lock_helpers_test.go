package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Helpers of the lock_*_test.go files. Their names start with lk so that
// they do not collide with helpers other files of this package add.

// lkSnapshot is everything Consul stores that a broker could write: the
// whole KV store and every session.
type lkSnapshot struct {
	KV       api.KVPairs
	Sessions []*api.SessionEntry
}

// lkConsulState reads Consul's KV store and session list consistently.
func lkConsulState(t testing.TB, c *api.Client) lkSnapshot {
	t.Helper()
	q := &api.QueryOptions{RequireConsistent: true}
	kv, _, err := c.KV().List("", q)
	require.NoError(t, err)
	sessions, _, err := c.Session().List(q)
	require.NoError(t, err)
	sort.Slice(kv, func(i, j int) bool { return kv[i].Key < kv[j].Key })
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].ID < sessions[j].ID })
	return lkSnapshot{KV: kv, Sessions: sessions}
}

// lkDial opens a connection to addr that only the test closes (a
// Replica.Conn is closed by Replica.Stop before the broker shuts down,
// which would end its holds as a client disconnect does).
func lkDial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// lkSession is a new broker-owned session with the given TTL and
// lock-delay.
func lkSession(ttl, lockDelay time.Duration) *lockbrokerv1.AcquireRequest_NewSession {
	return &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: dur(ttl), LockDelay: dur(lockDelay)}}
}

// lkHolder is the only holder of a lock state (fails if there is not
// exactly one).
func lkHolder(t testing.TB, st *lockbrokerv1.LockState) *lockbrokerv1.Holder {
	t.Helper()
	require.Len(t, st.GetHolders(), 1, "holders of %q", st.GetKey())
	return st.GetHolders()[0]
}

// lkGetLock reads a key's state through a broker.
func lkGetLock(t testing.TB, c lockbrokerv1.LockServiceClient, key string) *lockbrokerv1.LockState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
	require.NoError(t, err)
	return resp.GetState()
}

// lkCtx is a context for one unary call.
func lkCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func lkIsReleased(r *lockbrokerv1.AcquireResponse) bool  { return r.GetReleased() != nil }
func lkIsKeepalive(r *lockbrokerv1.AcquireResponse) bool { return r.GetKeepalive() != nil }
