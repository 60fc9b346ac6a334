package consulstore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// connsTo counts the established TCP connections whose remote end is the
// loopback address addr ("127.0.0.1:port"), as the kernel lists them: the
// connections Consul's per-client limit counts.
func connsTo(t *testing.T, addr string) int {
	t.Helper()
	_, portStr, _ := strings.Cut(addr, ":")
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	want := fmt.Sprintf("0100007F:%04X", port)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && fields[2] == want && fields[3] == "01" {
			n++
		}
	}
	require.NoError(t, sc.Err())
	return n
}

// TestWatchRespectsMaxBlocking proves the blocking-query cap: with N+k
// watches running, N are in flight at Consul and k wait for a slot;
// while every slot is taken, renewals and transactions still complete at
// once on their own connections; the connections to the agent never exceed
// MaxBlocking + MaxConns; waiting watches run as slots free.
func TestWatchRespectsMaxBlocking(t *testing.T) {
	t.Parallel()
	const maxBlocking, maxConns, extra = 3, 4, 5
	agent := consultest.Start(t)
	s := open(t, agent, Options{MaxBlocking: maxBlocking, MaxConns: maxConns, WaitTime: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Each watched prefix holds an entry: a listing of an empty prefix has
	// the index of the whole KV table, so any write anywhere would end it.
	idx := make([]uint64, maxBlocking+extra)
	for i := range idx {
		set(t, s, fmt.Sprintf("w/%d/k", i), "v")
	}
	for i := range idx {
		var err error
		_, idx[i], err = s.List(ctx, fmt.Sprintf("w/%d/", i), false)
		require.NoError(t, err)
	}

	var peak atomic.Int64
	sampleDone := make(chan struct{})
	go func() { // bounded by ctx: samples the in-flight count
		defer close(sampleDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if n := s.OpenBlockingQueries(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	type result struct {
		prefix string
		err    error
	}
	results := make(chan result, maxBlocking+extra)
	for i := range maxBlocking + extra {
		prefix := fmt.Sprintf("w/%d/", i)
		go func() {
			_, _, err := s.Watch(ctx, prefix, idx[i])
			results <- result{prefix, err}
		}()
	}
	require.Eventually(t, func() bool {
		return s.OpenBlockingQueries() == maxBlocking && s.QueuedBlockingQueries() == extra
	}, 5*time.Second, time.Millisecond)

	// Every slot is busy: renewals and writes still go through at once.
	id := session(t, s, broker.SessionSpec{Name: "renewer"})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			start := time.Now()
			if _, err := s.RenewSession(ctx, id); err != nil {
				t.Errorf("renew: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("renewal took %v while watches were waiting", d)
			}
		})
	}
	for i := range 50 {
		wg.Go(func() {
			_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpSet, Key: fmt.Sprintf("other/%d", i), Value: []byte("v")}})
			if err != nil {
				t.Errorf("txn: %v", err)
			}
		})
	}
	maxSeen := 0
	for range 20 {
		maxSeen = max(maxSeen, connsTo(t, agent.HTTPAddr()))
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	maxSeen = max(maxSeen, connsTo(t, agent.HTTPAddr()))
	t.Logf("at most %d connections to the agent", maxSeen)
	assert.LessOrEqual(t, maxSeen, maxBlocking+maxConns)
	assert.Equal(t, int64(maxBlocking), s.OpenBlockingQueries(), "writes elsewhere leave the watches blocked")

	// Changes end the watches in flight; each freed slot goes to a
	// waiting watch, which sees its change at once: all return.
	for i := range idx {
		set(t, s, fmt.Sprintf("w/%d/k", i), "v2")
	}
	seen := map[string]bool{}
	for range maxBlocking + extra {
		select {
		case r := <-results:
			assert.NoError(t, r.err, r.prefix)
			seen[r.prefix] = true
		case <-time.After(5 * time.Second):
			t.Fatal("a watch did not return after its change")
		}
	}
	assert.Len(t, seen, maxBlocking+extra)
	cancel()
	<-sampleDone
	assert.Equal(t, int64(maxBlocking), peak.Load(), "never more than MaxBlocking in flight")
	assert.Zero(t, s.OpenBlockingQueries())
}

// TestWatchReturnsChangesAndTimesOut proves the Watch contract on a real
// agent: it returns after WaitTime with the same index when nothing
// changed, and with the new entries once the index passed waitIndex (the
// wake-up of a blocked watch is in TestWatchRespectsMaxBlocking).
func TestWatchReturnsChangesAndTimesOut(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	s := open(t, agent, Options{WaitTime: 200 * time.Millisecond})
	ctx := t.Context()
	set(t, s, "wt/a", "1")
	entries, idx, err := s.List(ctx, "wt/", true)
	require.NoError(t, err)
	require.Len(t, entries, 1)

	start := time.Now()
	_, same, err := s.Watch(ctx, "wt/", idx)
	require.NoError(t, err)
	assert.Equal(t, idx, same, "no change: same index")
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	set(t, s, "wt/b", "2")
	got, next, err := s.Watch(ctx, "wt/", idx)
	require.NoError(t, err)
	assert.Greater(t, next, idx)
	assert.Len(t, got, 2)
}
