package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 41 (suspicion: a Go tryResume answered just after its 3 s bound):
// a library that gave up on a resume attempt cancels its stream, and when
// `acquired` was already on its way the replica has resumed the hold. The
// library tries the next replica, still believing it holds the lock
// (until the deadline it was promised): the replica must not release the
// key because of that cancel. It keeps the hold as after a lost
// connection, and the next attempt resumes it. Before, the replica
// released it at once: the key was free while the client still counted on
// it, and the next attempt was refused.
func TestResumeCancelledRightAfterItsGrantKeepsTheHold(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	a := brokertest.Start(t, agent)
	b := brokertest.Start(t, agent)
	key := "resume-late/k"
	holder := acquire(t, a.Locks(t), &lockbrokerv1.AcquireRequest{Key: key})
	seq := holder.acquired(5 * time.Second).GetSequencer()

	// The attempt on B is granted, and cancelled as the library does when
	// the grant comes just after its bound.
	late := acquire(t, b.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
	require.Equal(t, seq.GetToken(), late.acquired(5*time.Second).GetSequencer().GetToken())
	late.cancel()
	require.Error(t, late.end(5*time.Second))

	kv := agent.Client().KV()
	time.Sleep(time.Second) // the release, were there one, is done by now
	pair, _, err := kv.Get(key, nil)
	require.NoError(t, err)
	require.NotNil(t, pair)
	assert.Equal(t, seq.GetSessionId(), pair.Session, "the key is still the session's")

	// The library's next attempt (here, back on A) resumes the same grant.
	next := acquire(t, a.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
	got := next.acquired(5 * time.Second).GetSequencer()
	assert.Equal(t, seq.GetToken(), got.GetToken())
	resp, err := a.Locks(t).Release(context.Background(), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	assert.True(t, resp.GetReleased())
	next.next(5*time.Second, lkIsReleased)
}
