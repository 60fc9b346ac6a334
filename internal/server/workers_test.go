package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// TestCallsBeyondStreamWorkers: every stream worker is kept by an open
// hold, and more holds and unary calls still run (on goroutines of their
// own), and release.
func TestCallsBeyondStreamWorkers(t *testing.T) {
	_, conn := startPlain(t, zap.NewNop())
	locks := lockbrokerv1.NewLockServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	n := int(streamWorkers()) + 16
	streams := make([]lockbrokerv1.LockService_AcquireClient, n)
	seqs := make([]*lockbrokerv1.Sequencer, n)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			s, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("workers/%d", i)})
			if err != nil {
				return err
			}
			resp, err := s.Recv()
			if err != nil {
				return fmt.Errorf("hold %d: %w", i, err)
			}
			if resp.GetAcquired() == nil {
				return fmt.Errorf("hold %d: first event %v, want acquired", i, resp)
			}
			streams[i], seqs[i] = s, resp.GetAcquired().GetSequencer()
			return nil
		})
	}
	require.NoError(t, g.Wait(), "a hold beyond the stream workers was not served")

	// Every worker is busy: unary calls still answer.
	st, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "workers/0"})
	require.NoError(t, err)
	require.Equal(t, seqs[0].GetSessionId(), st.GetState().GetHolders()[0].GetSessionId())
	for _, i := range []int{0, n - 1} {
		rel, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: seqs[i].GetKey(), SessionId: seqs[i].GetSessionId(), Token: seqs[i].GetToken()})
		require.NoError(t, err)
		require.True(t, rel.GetReleased(), "hold %d", i)
		resp, err := streams[i].Recv()
		for err == nil && resp.GetKeepalive() != nil {
			resp, err = streams[i].Recv()
		}
		require.NoError(t, err)
		require.NotNil(t, resp.GetReleased(), "hold %d: got %v after Release, want released", i, resp)
	}
}
