package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// lkInterval is one hold as its client believed it: from Lock's return to
// just before Release.
type lkInterval struct {
	who        string
	start, end time.Time
	token      uint64
	lockIndex  uint64
}

// lkExclusionChecker records the hold intervals of many clients of one key.
type lkExclusionChecker struct {
	mu        sync.Mutex
	intervals []lkInterval
	// inside counts the clients that believe they hold the key right now;
	// it must never exceed 1.
	inside atomic.Int32
}

func (c *lkExclusionChecker) add(iv lkInterval) {
	c.mu.Lock()
	c.intervals = append(c.intervals, iv)
	c.mu.Unlock()
}

// check sorts the intervals by start and fails on any overlap and on a
// token that does not strictly increase in grant order.
func (c *lkExclusionChecker) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	ivs := append([]lkInterval(nil), c.intervals...)
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
	overlaps, backwards := 0, 0
	for i := 1; i < len(ivs); i++ {
		prev, cur := ivs[i-1], ivs[i]
		if cur.start.Before(prev.end) {
			overlaps++
			if overlaps <= 5 {
				t.Errorf("overlap: %s held from %s to %s (token %d) while %s held from %s (token %d)",
					prev.who, prev.start.Format(time.StampMicro), prev.end.Format(time.StampMicro), prev.token,
					cur.who, cur.start.Format(time.StampMicro), cur.token)
			}
		}
		if cur.token <= prev.token {
			backwards++
			if backwards <= 5 {
				t.Errorf("token did not increase: grant %d (%s) has token %d after token %d (%s)", i, cur.who, cur.token, prev.token, prev.who)
			}
		}
	}
	assert.Zero(t, overlaps, "overlapping holds")
	assert.Zero(t, backwards, "tokens out of grant order")
}

// TestLockMutualExclusion runs 20 contenders x 100 acquisitions of one key
// through the Go client, over two replicas, and checks that no two holds
// overlap and that tokens strictly increase in grant order. On 2 cores it
// takes about 25s; under the race detector (about three times slower) it
// runs 20 x 50 to stay within a minute.
func TestLockMutualExclusion(t *testing.T) {
	const (
		contenders = 20
		key        = "exclusion/one"
	)
	rounds := 100
	if lkRace {
		rounds = 50
	}
	agent := consultest.Start(t)
	r1 := brokertest.Start(t, agent)
	r2 := brokertest.Start(t, agent)
	c1, c2 := r1.Conn(t), r2.Conn(t)
	clients := []*client.Client{
		client.New(c1, client.WithReplicas(c2)),
		client.New(c2, client.WithReplicas(c1)),
	}
	chk := &lkExclusionChecker{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	start := time.Now()
	var wg sync.WaitGroup
	for i := range contenders {
		c := clients[i%2]
		who := fmt.Sprintf("c%02d", i)
		wg.Go(func() {
			for j := range rounds {
				lease, err := c.Lock(ctx, key, client.WithLockDelay(0), client.WithTTL(10*time.Second), client.WithValue([]byte(who)))
				if err != nil {
					t.Errorf("%s round %d: Lock: %v", who, j, err)
					return
				}
				held := time.Now()
				if n := chk.inside.Add(1); n != 1 {
					t.Errorf("%s round %d: %d clients hold the key at once", who, j, n)
				}
				seq := lease.Sequencer()
				select {
				case <-lease.Lost():
					t.Errorf("%s round %d: lease ended while held: %v", who, j, lease.Err())
				default:
				}
				chk.inside.Add(-1)
				chk.add(lkInterval{who: who, start: held, end: time.Now(), token: seq.GetToken(), lockIndex: seq.GetLockIndex()})
				if err := lease.Release(ctx); err != nil {
					t.Errorf("%s round %d: Release: %v", who, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d acquisitions by %d contenders over 2 replicas in %s (%s per hand-off)",
		contenders*rounds, contenders, elapsed.Round(time.Millisecond), (elapsed / time.Duration(contenders*rounds)).Round(time.Microsecond))

	require.Len(t, chk.intervals, contenders*rounds)
	chk.check(t)
}
