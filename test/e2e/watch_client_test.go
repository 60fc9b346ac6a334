package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// The Go client's Watch: states on a channel, the first one the state now;
// when its broker replica goes away it carries on from another replica
// (starting with the state now); a refused request fails at once; ending
// ctx closes the channel and Err says why.
func TestWatchGoClientFollowsAcrossReplicas(t *testing.T) {
	agent := consultest.Start(t)
	first, second := brokertest.Start(t, agent), brokertest.Start(t, agent)
	dial := func(addr string) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	c := client.New(dial(first.Addr), client.WithReplicas(dial(second.Addr)))
	const key = "client/leader"

	_, err := c.Watch(context.Background(), "/bad")
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "a bad key fails at once: %v", err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx, key)
	require.NoError(t, err)
	next := func(what string, want func(*lockbrokerv1.LockState) bool) *lockbrokerv1.WatchResponse {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case resp, ok := <-w.C:
				require.True(t, ok, "the watch ended before %s: %v", what, w.Err())
				if want(resp.GetState()) {
					return resp
				}
			case <-deadline:
				t.Fatalf("no %s within 10s", what)
			}
		}
	}
	resp := next("the state now", func(*lockbrokerv1.LockState) bool { return true })
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_NONE, resp.GetState().GetKind())

	holder := acquire(t, second.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("A"), Session: fast()})
	seq := holder.acquired(5 * time.Second).GetSequencer()
	next("A holding", wtHeldBy(seq.GetSessionId()))

	// The watch's replica shuts down: the watch goes on from the other.
	first.Stop()
	resp = next("the state from the other replica", func(*lockbrokerv1.LockState) bool { return true })
	assert.True(t, wtHeldBy(seq.GetSessionId())(resp.GetState()), "starts again with the state now: %s", wtState(resp.GetState()))
	_, err = second.Locks(t).Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	next("A's resignation", wtFree)

	cancel()
	select {
	case <-w.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end with its context")
	}
	for range w.C { // closed
	}
	assert.ErrorIs(t, w.Err(), context.Canceled)
}
