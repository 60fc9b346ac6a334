package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 10, item 4: after a resume on replica B, the old replica A can do
// nothing to the hold: not when its stream is cancelled after the resume,
// and not when A was paused (SIGSTOP) across the resume and continues.
func TestResumeFencesTheOldReplica(t *testing.T) {
	agent := consultest.Start(t)
	a := brokertest.StartProcess(t, agent)
	b := brokertest.StartProcess(t, agent)
	ca := lockbrokerv1.NewLockServiceClient(lkDial(t, a.Addr))
	cb := lockbrokerv1.NewLockServiceClient(lkDial(t, b.Addr))

	check := func(t *testing.T, key string, seq *lockbrokerv1.Sequencer) {
		t.Helper()
		// The hold survives on B with the same token...
		resp, err := cb.CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
		require.NoError(t, err)
		assert.True(t, resp.GetCurrent(), "the resumed hold is still current: %v", resp.GetState())
		h := lkHolder(t, lkGetLock(t, cb, key))
		assert.Equal(t, seq.GetSessionId(), h.GetSessionId())
		assert.Equal(t, seq.GetToken(), h.GetToken())
		// ...and a third party cannot take it.
		third := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(0), Session: fast()})
		assert.Equal(t, codes.Aborted, status.Code(third.end(5*time.Second)))
	}

	t.Run("old stream open, then cancelled", func(t *testing.T) {
		key := "fence/open"
		old := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		seq := old.acquired(5 * time.Second).GetSequencer()
		res := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
		got := res.acquired(5 * time.Second)
		assert.True(t, got.GetResumed())
		assert.Equal(t, seq.GetToken(), got.GetSequencer().GetToken())
		// A learns it lost the session and ends its stream without touching it.
		ev := old.next(5*time.Second, isLost)
		assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RESUMED_ELSEWHERE, ev.GetLost().GetReason(), "%v", ev)
		old.cancel()
		time.Sleep(time.Second) // give A every chance to (wrongly) release
		check(t, key, seq)
	})

	t.Run("old replica paused across the resume", func(t *testing.T) {
		key := "fence/paused"
		old := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		seq := old.acquired(5 * time.Second).GetSequencer()
		a.Stop() // SIGSTOP
		res := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
		got := res.acquired(5 * time.Second)
		assert.Equal(t, seq.GetToken(), got.GetSequencer().GetToken())
		old.cancel() // the client gives the old stream up while A is stopped
		time.Sleep(500 * time.Millisecond)
		a.Cont() // SIGCONT: A sees the cancel and its renewals, and must do nothing
		time.Sleep(2 * time.Second)
		check(t, key, seq)
		res.cancel()
	})

	t.Run("client-owned sessions are not resumed", func(t *testing.T) {
		sess, err := lockbrokerv1.NewSessionServiceClient(lkDial(t, a.Addr)).CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
		require.NoError(t, err)
		own := &lockbrokerv1.AcquireRequest_SessionId{SessionId: sess.GetSession().GetId()}
		first := acquire(t, ca, &lockbrokerv1.AcquireRequest{Key: "fence/client", Session: own})
		seq := first.acquired(5 * time.Second).GetSequencer()
		res := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: "fence/client", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
		err = res.end(5 * time.Second)
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	})
}
