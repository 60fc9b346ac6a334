package e2e

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 41, finding 2: a Consul snapshot restore takes the cluster's index
// back and removes the keys and sessions made since the snapshot. The
// broker treats the lower index as a new history (DESIGN.md, "Restores and
// going back in time"): a holder whose key vanished is told lost within
// 2 s, a waiter is not left behind the vanished holder, a new Acquire gets
// the key at once, and tokens keep growing. Before, every watch dropped
// the listings below the last index it had seen: the holder heard
// keepalives until its renewal failed (13-20 s) and a new Acquire queued
// behind a session that no longer existed.
func TestRestoreTellsVanishedHoldersLost(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks := r.Locks(t)
	snapshots := agent.Client().Snapshot()

	// One key held from before the snapshot, to watch a change the
	// restore does not make.
	before := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "restore/before", Session: fast()})
	before.acquired(5 * time.Second)
	saved, _, err := snapshots.Save(nil)
	require.NoError(t, err)
	snap, err := io.ReadAll(saved)
	require.NoError(t, err)
	require.NoError(t, saved.Close())

	key := "restore/after"
	holder := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	held := holder.acquired(5 * time.Second).GetSequencer()
	holder.next(5*time.Second, lkIsKeepalive) // an older hold: its watch runs
	waiter := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	waiter.next(5*time.Second, isQueued)

	require.NoError(t, snapshots.Restore(nil, bytes.NewReader(snap)))
	restored := time.Now()

	ev := holder.next(2*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return isLost(r) || lkIsReleased(r) })
	t.Logf("the holder heard %v %s after the restore", ev, time.Since(restored).Round(time.Millisecond))
	require.NotNil(t, ev.GetLost(), "the holder's key vanished: lost, not released")
	assert.Contains(t, []lockbrokerv1.LostReason{lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER}, ev.GetLost().GetReason())

	// The waiter's session was made after the snapshot too: it is either
	// granted the free key or told its session is gone, soon; never left
	// queued behind a holder that no longer exists.
	select {
	case how := <-waiterSettled(waiter):
		t.Logf("the waiter %s %s after the restore", how, time.Since(restored).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter is still queued 5 s after the restore")
	}

	newcomer := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: key, Session: fast(), WaitTimeout: dur(3 * time.Second)})
	got := newcomer.acquired(5 * time.Second).GetSequencer()
	assert.Greater(t, got.GetToken(), held.GetToken(), "tokens stay monotonic across the restore")
	ev = before.next(5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return isLost(r) || lkIsKeepalive(r) })
	assert.Nil(t, ev.GetLost(), "a hold the restore kept is kept")
	t.Logf("a new Acquire got the key with token %d (before the restore: %d) %s after the restore", got.GetToken(), held.GetToken(), time.Since(restored).Round(time.Millisecond))
}

// waiterSettled says how the waiter's wait ended: granted, or the stream's
// end.
func waiterSettled(s *stream) <-chan string {
	done := make(chan string, 1)
	go func() {
		for ev := range s.events {
			if ev.GetAcquired() != nil {
				done <- "was granted"
				return
			}
		}
		err := <-s.done
		s.done <- err
		done <- fmt.Sprintf("ended: %v", err)
	}()
	return done
}
