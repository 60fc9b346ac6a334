package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// semGrants records the `acquired` events of many waiting streams, read by
// one goroutine per stream (which report with t.Errorf only).
type semGrants struct {
	t  *testing.T
	wg sync.WaitGroup

	mu   sync.Mutex
	seqs map[string]*lockbrokerv1.Sequencer // by waiter name
	ch   chan string                        // names, in the order seen
}

func newSemGrants(t *testing.T) *semGrants {
	g := &semGrants{t: t, seqs: map[string]*lockbrokerv1.Sequencer{}, ch: make(chan string, 1000)}
	t.Cleanup(g.wg.Wait) // registered first, so it runs after the streams are cancelled
	return g
}

// follow reads the events of waiting stream s until its grant, which it
// records; after that, s's events are the test goroutine's again.
func (g *semGrants) follow(name string, s *stream) {
	g.wg.Go(func() {
		for ev := range s.events {
			if a := ev.GetAcquired(); a != nil {
				g.mu.Lock()
				g.seqs[name] = a.GetSequencer()
				g.mu.Unlock()
				g.ch <- name
				return
			}
			if ev.GetLost() != nil {
				g.t.Errorf("%s: lost while waiting: %v", name, ev.GetLost())
			}
		}
	})
}

// next waits for the next grant.
func (g *semGrants) next(timeout time.Duration) (string, *lockbrokerv1.Sequencer) {
	g.t.Helper()
	select {
	case name := <-g.ch:
		g.mu.Lock()
		defer g.mu.Unlock()
		return name, g.seqs[name]
	case <-time.After(timeout):
		g.t.Fatalf("no grant within %s", timeout)
		return "", nil
	}
}

// byToken returns the granted names in admission (token) order.
func (g *semGrants) byToken() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var names []string
	for n := range g.seqs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return g.seqs[names[i]].GetToken() < g.seqs[names[j]].GetToken() })
	return names
}

// TestSemaphoreFairOldestFirst: with fair waiters, a slot that frees goes
// to the oldest waiter, never to one of the newcomers that keep arriving,
// and the queue is served in arrival order.
func TestSemaphoreFairOldestFirst(t *testing.T) {
	const (
		limit     = 2
		handOffs  = 8 // slots freed one by one
		preQueued = 3 // newcomers queued behind W before the first release
	)
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	semSkipIfFreshPrefixBroken(t, c)
	grants := newSemGrants(t)
	prefix := "fair/sem"
	fairReq := func(name string) *lockbrokerv1.AcquireRequest {
		req := semReq(prefix, limit, name)
		req.Fair = true
		return req
	}

	type holder struct {
		s   *stream
		seq *lockbrokerv1.Sequencer
	}
	var holders []holder // oldest first
	streams := map[string]*stream{}
	for _, name := range []string{"H1", "H2"} {
		s := acquire(t, c, fairReq(name))
		holders = append(holders, holder{s, s.acquired(10 * time.Second).GetSequencer()})
	}
	// W queues first, then newcomers.
	arrival := []string{"W"}
	w, _ := semQueued(t, c, fairReq("W"))
	streams["W"] = w
	grants.follow("W", w)
	newcomer := func() {
		name := fmt.Sprintf("N%02d", len(arrival))
		s, _ := semQueued(t, c, fairReq(name))
		arrival = append(arrival, name)
		streams[name] = s
		grants.follow(name, s)
	}
	for range preQueued {
		newcomer()
	}

	var admitted []string
	for i := range handOffs {
		oldest := holders[0]
		holders = holders[1:]
		semRelease(t, c, oldest.s, oldest.seq)
		newcomer() // one more arrives right as the slot frees
		name, seq := grants.next(10 * time.Second)
		admitted = append(admitted, name)
		require.Equal(t, arrival[i], name, "slot %d went to %s, but %s waited longer (arrival order %v)", i, name, arrival[i], arrival)
		holders = append(holders, holder{streams[name], seq})
	}
	assert.Equal(t, arrival[:handOffs], grants.byToken(), "admission (token) order differs from arrival order")
	t.Logf("arrivals %v, admitted %v", arrival, admitted)
}

// TestSemaphoreHandOffLatency: a waiter is admitted promptly after a
// release. The bound asserted is generous (1 s); the figures are logged.
func TestSemaphoreHandOffLatency(t *testing.T) {
	const (
		limit  = 2
		rounds = 10
	)
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	semSkipIfFreshPrefixBroken(t, c)
	prefix := "latency/sem"

	type holder struct {
		s   *stream
		seq *lockbrokerv1.Sequencer
	}
	var holders []holder
	for i := range limit {
		s, seq := semHold(t, c, prefix, limit, fmt.Sprint("H", i))
		holders = append(holders, holder{s, seq})
	}
	var latencies []time.Duration
	for i := range rounds {
		w, _ := semQueued(t, c, semReq(prefix, limit, fmt.Sprint("W", i)))
		old := holders[0]
		holders = holders[1:]

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: prefix, SessionId: old.seq.GetSessionId(), Token: old.seq.GetToken()})
		cancel()
		require.NoError(t, err)
		seq := w.acquired(5 * time.Second).GetSequencer()
		latency := time.Since(start)
		latencies = append(latencies, latency)
		assert.Less(t, latency, time.Second, "round %d: waiter admitted %s after the release", i, latency)
		old.s.next(5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetReleased() != nil })
		holders = append(holders, holder{w, seq})
	}
	sorted := slices.Clone(latencies)
	slices.Sort(sorted)
	t.Logf("Release -> waiter acquired over %d hand-offs: min %s, median %s, max %s (all: %v)",
		rounds, sorted[0], sorted[len(sorted)/2], sorted[len(sorted)-1], latencies)
}
