package bench

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

var (
	scaleWaiters    = flag.Int("scale.waiters", 2000, "Acquire requests queued behind held keys after the window (two per key), 0 for none")
	scaleWaitWindow = flag.Duration("scale.wait-window", 10*time.Second, "how long the waiters are measured once all are queued")
)

// waitFigures are the figures of TestScale's waiting phase.
type waitFigures struct {
	n, keys           int
	queued            atomic.Int64  // waiters that heard `queued`
	queuedIn          time.Duration // until the last first `queued`
	beatsPerSec       float64       // `queued` heard per waiter per second in the window
	cpuBroker         float64       // % of one core in the window
	cpuAgent          float64
	goroutinesPer     float64      // broker goroutines added per waiter
	rssAdded          float64      // MiB
	heapAdded         float64      // MiB
	allocRate         float64      // bytes/s
	blocking, pending float64      // open / queued blocking queries (Store) mid-window
	sessionRenews     float64      // Consul session renewals per second in the window
	acquired, ended   atomic.Int64 // neither should happen: the holders hold
	errs              errorLog
}

// scaleWaiting queues *scaleWaiters Acquire requests, two per key, behind
// holds that are still held, leaves them waiting for *scaleWaitWindow and
// measures what waiting costs: the broker sends each a `queued` heartbeat
// every broker.QueuedHeartbeat, and each has a session of its own. The
// waiters are cancelled before it returns.
func scaleWaiting(ctx context.Context, bp *brokerProcess, agentPid int, clients []lockbrokerv1.LockServiceClient, holds []*scaleHold) *waitFigures {
	f := &waitFigures{}
	var keys []string
	for _, h := range holds {
		if len(keys)*2 >= *scaleWaiters {
			break
		}
		if h.seq.Load() != nil && !h.done.Load() && !h.victim.Load() {
			keys = append(keys, h.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	f.keys, f.n = len(keys), 2*len(keys)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()

	m0 := scrape(bp.httpAddr)
	rss0, _ := rssKiB(bp.pid)
	var beats, lastQueued atomic.Int64
	var wg sync.WaitGroup
	allQueued := make(chan struct{})
	start := time.Now()
	for i := range f.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := clients[i%len(clients)].Acquire(wctx, &lockbrokerv1.AcquireRequest{Key: keys[i/2]})
			if err != nil {
				f.errs.add(err)
				return
			}
			first := true
			for {
				resp, err := st.Recv()
				switch {
				case err != nil:
					if wctx.Err() == nil {
						f.ended.Add(1)
						f.errs.add(fmt.Errorf("waiter on %s ended: %w", keys[i/2], err))
					}
					return
				case resp.GetQueued() != nil:
					beats.Add(1)
					if first {
						first = false
						lastQueued.Store(time.Now().UnixNano())
						if f.queued.Add(1) == int64(f.n) {
							close(allQueued)
						}
					}
				case resp.GetAcquired() != nil:
					f.acquired.Add(1)
					f.errs.add(fmt.Errorf("waiter on %s acquired a key its holder holds", keys[i/2]))
				}
			}
		}()
	}
	select {
	case <-allQueued:
	case <-time.After(time.Minute):
		f.errs.add(fmt.Errorf("%d of %d waiters queued within 1m", f.queued.Load(), f.n))
	}
	if n := lastQueued.Load(); n != 0 {
		f.queuedIn = time.Unix(0, n).Sub(start)
	}

	// Let the first heartbeats spread out, then measure a window.
	time.Sleep(2 * time.Second)
	m1 := scrape(bp.httpAddr)
	ops0 := bp.OpCounts()
	_, cpuB0 := statOf(bp.pid)
	_, cpuA0 := statOf(agentPid)
	b0, t0 := beats.Load(), time.Now()
	time.Sleep(*scaleWaitWindow / 2)
	mid := scrape(bp.httpAddr)
	time.Sleep(time.Until(t0.Add(*scaleWaitWindow)))
	b1, span := beats.Load(), time.Since(t0)
	_, cpuB1 := statOf(bp.pid)
	_, cpuA1 := statOf(agentPid)
	m2 := scrape(bp.httpAddr)
	ops1 := bp.OpCounts()
	rss, _ := rssKiB(bp.pid)

	f.beatsPerSec = float64(b1-b0) / float64(f.n) / span.Seconds()
	f.cpuBroker = 100 * float64(cpuB1-cpuB0) / float64(span)
	f.cpuAgent = 100 * float64(cpuA1-cpuA0) / float64(span)
	f.goroutinesPer = (mid["go_goroutines"] - m0["go_goroutines"]) / float64(f.n)
	f.rssAdded = float64(rss-rss0) / 1024
	f.heapAdded = (mid["go_memstats_heap_inuse_bytes"] - m0["go_memstats_heap_inuse_bytes"]) / (1 << 20)
	f.allocRate = (m2["go_memstats_alloc_bytes_total"] - m1["go_memstats_alloc_bytes_total"]) / span.Seconds()
	f.blocking, f.pending = mid["lockbroker_consul_blocking_queries"], mid["lockbroker_consul_blocking_queries_queued"]
	f.sessionRenews = float64(ops1["session_renew"]-ops0["session_renew"]) / span.Seconds()

	cancel()
	if !waitGroupWithin(&wg, 30*time.Second) {
		f.errs.add(fmt.Errorf("waiters not all ended within 30s of their cancel"))
	}
	return f
}

// rows adds the waiting phase's rows to tb; holdingCPU is the broker's CPU
// while only holding (% of one core), for comparison.
func (f *waitFigures) rows(tb *textTable, holdingCPU float64) {
	if f == nil {
		return
	}
	tb.add(fmt.Sprintf("waiters: Acquire queued behind held keys (2 per key, %d keys), all `queued` in", f.keys),
		fmt.Sprintf("%d / %d, %s", f.queued.Load(), f.n, f.queuedIn.Round(time.Millisecond)), "")
	tb.add(fmt.Sprintf("waiters: `queued` heartbeats per waiter per second (%s window)", *scaleWaitWindow),
		fmt.Sprintf("%.2f", f.beatsPerSec), "")
	tb.add("waiters: CPU with the waiters added: broker / agent, % of one core",
		fmt.Sprintf("%.0f%% / %.0f%% (broker holding alone: %.0f%%)", f.cpuBroker, f.cpuAgent, holdingCPU), "")
	tb.add("waiters: Consul session renewals per second (the waiters' sessions too)", fmt.Sprintf("%.0f", f.sessionRenews), "")
	tb.add("waiters: broker goroutines per waiter / RSS added / heap in use added (garbage not yet collected too)",
		fmt.Sprintf("%.2f / %.0f MiB / %.0f MiB", f.goroutinesPer, f.rssAdded, f.heapAdded), "")
	tb.add("waiters: broker allocation / open and queued blocking queries mid-window",
		fmt.Sprintf("%.0f MB/s / %.0f and %.0f", f.allocRate/1e6, f.blocking, f.pending), "")
	tb.add("waiters that acquired / whose stream ended (neither should)", fmt.Sprintf("%d / %d", f.acquired.Load(), f.ended.Load()), "0 / 0")
}

// errLog is the phase's errors (none when the phase did not run).
func (f *waitFigures) errLog() *errorLog {
	if f == nil {
		return &errorLog{}
	}
	return &f.errs
}
