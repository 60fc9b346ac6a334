package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// churnHold is a hold a churn worker has now: what the destroyer needs.
type churnHold struct {
	session string
	lost    chan time.Time // when the worker read `lost`
}

// A session destroyed in Consul is reported `lost` within the bound
// however the holder's key got to it: by its own transaction, a direct
// hand-off from a holder on its replica, after a wait woken by the other
// replica's release, or by a key whose watch was parked and started
// again. Workers on two replicas cycle short holds on a few keys (the
// chaos suite's lock traffic, without its faults) while the session of a
// random holder is destroyed again and again; every loss notice is timed.
func TestLossNoticedUnderChurn(t *testing.T) {
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	sessions := agent.Client().Session()
	keys := []string{"churn/0", "churn/1", "churn/2"}
	const workers, destroys = 12, 40

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	held := map[int]*churnHold{} // worker → its hold now
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		c := replicas[w%len(replicas)].Locks(t)
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			for ctx.Err() == nil {
				key := keys[rng.IntN(len(keys))]
				if err := churnOnce(ctx, c, key, time.Duration(20+rng.IntN(300))*time.Millisecond, func(h *churnHold) {
					mu.Lock()
					defer mu.Unlock()
					if h == nil {
						delete(held, w)
					} else {
						held[w] = h
					}
				}); err != nil && ctx.Err() == nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		})
	}

	var late []time.Duration
	var notices []time.Duration
	rng := rand.New(rand.NewPCG(1, 2))
	for range destroys {
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		mu.Lock()
		var victims []*churnHold
		for _, h := range held {
			victims = append(victims, h)
		}
		mu.Unlock()
		if len(victims) == 0 {
			continue
		}
		v := victims[rng.IntN(len(victims))]
		at := time.Now()
		_, err := sessions.Destroy(v.session, nil)
		require.NoError(t, err)
		select {
		case got := <-v.lost:
			d := max(got.Sub(at), 0)
			notices = append(notices, d)
			if d > lossBound {
				late = append(late, d)
			}
		case <-time.After(5 * time.Second):
			// Released before the destroy landed, or never told: the
			// worker's error says which.
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	stop()
	wg.Wait()
	slices.Sort(notices)
	require.NotEmpty(t, notices, "some destroyed holds were timed")
	t.Logf("%d loss notices: p50 %v, max %v", len(notices), notices[len(notices)/2], notices[len(notices)-1])
	assert.Empty(t, late, "loss notices later than the %v bound", lossBound)
}

// churnOnce takes key, holds it for hold, and releases it; report is told
// of the hold while it is held. A `lost` ends it early (timed on the
// hold's channel). An error is returned only for what must not happen.
func churnOnce(ctx context.Context, c lockbrokerv1.LockServiceClient, key string, hold time.Duration, report func(*churnHold)) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Acquire(sctx, &lockbrokerv1.AcquireRequest{Key: key, Session: fast(), WaitTimeout: dur(30 * time.Second)})
	if err != nil {
		return err
	}
	var seq *lockbrokerv1.Sequencer
	for seq == nil {
		ev, err := st.Recv()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", key, err)
		}
		if a := ev.GetAcquired(); a != nil {
			seq = a.GetSequencer()
		}
	}
	h := &churnHold{session: seq.GetSessionId(), lost: make(chan time.Time, 1)}
	report(h)
	defer report(nil)
	events := make(chan *lockbrokerv1.AcquireResponse, 16)
	go func() {
		defer close(events)
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	timer := time.NewTimer(hold)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("stream of %s ended while held", key)
			}
			if ev.GetLost() != nil {
				h.lost <- time.Now()
				return nil
			}
		case <-timer.C:
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.Release(rctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
			rcancel()
			if err != nil && ctx.Err() == nil {
				// The destroyer may have taken it just now: a `lost`
				// is then on its way.
				for ev := range events {
					if ev.GetLost() != nil {
						h.lost <- time.Now()
						return nil
					}
				}
				return fmt.Errorf("release of %s: %w", key, err)
			}
			return nil
		}
	}
}
