package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// The session pool (issue 12): an Acquire with default options takes a
// ready session, and a clean end gives it back instead of destroying it.
// Reuse must never let a stale Release touch a later grant, and a session
// that was lost must never come back.
func TestSessionPoolReuseIsSafe(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent, brokertest.WithBrokerOptions(broker.WithSessionPool()))
	c := r.Locks(t)
	poolFilled(t, agent)

	// Many cycles over a few keys: every stream ends `released`, and
	// sessions are reused (far fewer sessions than cycles).
	seen := map[string]bool{}
	var seqs []*lockbrokerv1.Sequencer
	for i := range 200 {
		req := &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("pool/%d", i%4)}
		require.True(t, releaseCycleSeq(t, c, req, func(s *lockbrokerv1.Sequencer) { seqs = append(seqs, s) }))
	}
	for _, s := range seqs {
		seen[s.GetSessionId()] = true
	}
	t.Logf("200 cycles used %d sessions", len(seen))
	// A session goes back to the pool when its stream ends, just after the
	// client has `released`; the next cycle often starts before that, so
	// each session serves about two cycles here.
	assert.Less(t, len(seen), 150, "sessions are reused")

	// A hot key reuses sessions too: a session may be given a key it held
	// before. A stale Release of the earlier grant never ends the new one:
	// with the earlier token it is a retry after success (OK, nothing
	// released); without a token it is INVALID_ARGUMENT naming `token`
	// (SetValue too), as for every broker-owned session
	// (TestReleaseTokenRule).
	old, now, cur := reusedGrant(t, c, "pool/hot")
	rel, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: old.GetKey(), SessionId: old.GetSessionId(), Token: old.GetToken()})
	require.NoError(t, err, "a retry of the earlier grant's release")
	assert.False(t, rel.GetReleased(), "a retry releases nothing")
	_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: old.GetKey(), SessionId: old.GetSessionId()})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "no token on a reused grant: %v", err)
	assert.Contains(t, fmt.Sprint(err), "token", "the error names the field")
	_, err = c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: old.GetKey(), SessionId: old.GetSessionId(), Value: []byte("x")})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "no token on a reused grant: %v", err)
	resp, err := c.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: now})
	require.NoError(t, err)
	assert.True(t, resp.GetCurrent(), "the current grant survives stale releases")
	_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: now.GetKey(), SessionId: now.GetSessionId(), Token: now.GetToken()})
	require.NoError(t, err, "with its token the grant is released")
	cur.next(5*time.Second, lkIsReleased)

	// A session whose hold was lost (destroyed in Consul) never returns to
	// the pool: the next grants never use it.
	lost := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "pool/lost"})
	ls := lost.acquired(5 * time.Second).GetSequencer()
	_, err = agent.Client().Session().Destroy(ls.GetSessionId(), nil)
	require.NoError(t, err)
	lost.next(5*time.Second, isLost)
	for i := range 50 {
		var got *lockbrokerv1.Sequencer
		require.True(t, releaseCycleSeq(t, c, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("pool/after/%d", i)}, func(s *lockbrokerv1.Sequencer) { got = s }))
		assert.NotEqual(t, ls.GetSessionId(), got.GetSessionId(), "a lost session came back")
	}
}

// releaseCycleSeq is releaseCycle that also reports the grant.
func releaseCycleSeq(t *testing.T, c lockbrokerv1.LockServiceClient, req *lockbrokerv1.AcquireRequest, got func(*lockbrokerv1.Sequencer)) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Acquire(ctx, req)
	require.NoError(t, err)
	var seq *lockbrokerv1.Sequencer
	for seq == nil {
		resp, err := st.Recv()
		require.NoError(t, err)
		seq = resp.GetAcquired().GetSequencer()
	}
	got(seq)
	_, err = c.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	for {
		resp, err := st.Recv()
		require.NoError(t, err)
		if resp.GetReleased() != nil {
			return true
		}
		if resp.GetLost() != nil {
			t.Errorf("lost instead of released: %v", resp.GetLost())
			return false
		}
	}
}

// reusedGrant cycles key until a grant comes on a session that held key
// before, and returns the earlier grant, the new one and its stream (held).
func reusedGrant(t *testing.T, c lockbrokerv1.LockServiceClient, key string) (old, now *lockbrokerv1.Sequencer, cur *stream) {
	t.Helper()
	earlier := map[string]*lockbrokerv1.Sequencer{}
	for range 300 {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key})
		seq := s.acquired(5 * time.Second).GetSequencer()
		if prev := earlier[seq.GetSessionId()]; prev != nil {
			assert.Greater(t, seq.GetToken(), prev.GetToken())
			return prev, seq, s
		}
		earlier[seq.GetSessionId()] = seq
		_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
		require.NoError(t, err)
		s.next(5*time.Second, lkIsReleased)
		time.Sleep(5 * time.Millisecond) // the session goes back to the pool after `released`
	}
	t.Fatalf("no session was given %s twice in 300 cycles", key)
	return nil, nil, nil
}
