package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

func TestLockQueueAndHandOff(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)

	a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "jobs/a", Value: []byte("A"), Session: fast()})
	seqA := a.acquired(5 * time.Second).GetSequencer()
	require.NotZero(t, seqA.GetToken())

	b := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "jobs/a", Value: []byte("B"), Session: fast()})
	q := b.next(5*time.Second, isQueued).GetQueued()
	require.Len(t, q.GetState().GetHolders(), 1)
	assert.Equal(t, seqA.GetSessionId(), q.GetState().GetHolders()[0].GetSessionId())
	assert.Equal(t, []byte("A"), q.GetState().GetHolders()[0].GetValue())

	_, err := c.Release(context.Background(), &lockbrokerv1.ReleaseRequest{Key: "jobs/a", SessionId: seqA.GetSessionId(), Token: seqA.GetToken()})
	require.NoError(t, err)
	a.next(5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetReleased() != nil })
	seqB := b.acquired(5 * time.Second).GetSequencer()
	assert.Greater(t, seqB.GetToken(), seqA.GetToken())

	// try-once on the busy key: ABORTED naming the holder.
	try := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "jobs/a", WaitTimeout: dur(0), Session: fast()})
	err = try.end(5 * time.Second)
	assert.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), seqB.GetSessionId())

	// bounded wait: DEADLINE_EXCEEDED naming the holder.
	w := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "jobs/a", WaitTimeout: dur(300 * time.Millisecond), Session: fast()})
	err = w.end(5 * time.Second)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), seqB.GetSessionId())

	// closing the holder's stream releases the key and destroys the session.
	b.cancel()
	require.Eventually(t, func() bool {
		kv, _, err := agent.Client().KV().Get("jobs/a", nil)
		return err == nil && kv != nil && kv.Session == ""
	}, 5*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		s, _, err := agent.Client().Session().Info(seqB.GetSessionId(), nil)
		return err == nil && s == nil
	}, 5*time.Second, 20*time.Millisecond)
}

func TestLostWhenSessionDestroyed(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "k", Session: fast()})
	seq := a.acquired(5 * time.Second).GetSequencer()
	start := time.Now()
	_, err := agent.Client().Session().Destroy(seq.GetSessionId(), nil)
	require.NoError(t, err)
	lost := a.next(2*time.Second, isLost).GetLost()
	assert.Less(t, time.Since(start), time.Second)
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason())
}
