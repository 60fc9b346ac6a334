package bench

import (
	"context"
	"flag"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	scale             = flag.Bool("scale", false, "run TestScale (make bench runs it)")
	scaleHolds        = flag.Int("scale.holds", 10000, "concurrent holds, one per top-level prefix t<i>/lock")
	scaleWatchers     = flag.Int("scale.watchers", 1000, "Watch streams, one per watched hold key")
	scaleWindow       = flag.Duration("scale.window", 60*time.Second, "how long the holds are kept once all are acquired")
	scaleAcquireLimit = flag.Duration("scale.acquire-limit", 3*time.Minute, "how long to wait for every hold to be acquired")
	scaleLoss         = flag.Int("scale.loss", 10, "loss-notice samples on holds without a watcher, after the window")
	scaleConns        = flag.Int("scale.conns", 100, "client gRPC connections the holds and watchers are spread over (100 clients of 100 holds and 10 watchers each)")
)

// scaleHold is one hold's stream as its reader goroutine sees it.
type scaleHold struct {
	key    string
	seq    atomic.Pointer[lockbrokerv1.Sequencer]
	victim atomic.Bool    // its session is destroyed on purpose
	done   atomic.Bool    // its reader goroutine has returned
	lostCh chan time.Time // when a victim's `lost` arrived
}

// TestScale is issue 10 item 1 / issue 12's scale row: one replica holds
// 10,000 locks on 10,000 distinct top-level prefixes (t<i>/lock) and serves
// 1,000 watchers of some of those keys, against an agent that enforces
// http_max_conns_per_client = 200. The replica is the broker binary in a
// process of its own, as it is deployed, so that its RSS, goroutines and
// Consul connections are its own (read from /proc and its /metrics). It
// prints figures; it asserts only that the run completed.
func TestScale(t *testing.T) {
	if !*scale {
		t.Skip("run with -scale (make bench)")
	}
	agent := consultest.Start(t, consultest.WithHCL(`limits { http_max_conns_per_client = 200 }`))
	_, portStr, _ := net.SplitHostPort(agent.HTTPAddr())
	port, _ := strconv.Atoi(portStr)
	bp := brokertest.StartProcess(t, agent)
	pid := bp.Pid()
	waitPool(t, agent)
	clients := make([]lockbrokerv1.LockServiceClient, max(*scaleConns, 1))
	for i := range clients {
		clients[i] = lockbrokerv1.NewLockServiceClient(dial(t, bp.Addr))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nHolds, nWatchers := *scaleHolds, min(*scaleWatchers, *scaleHolds)
	watchEvery := max(nHolds/max(nWatchers, 1), 1) // watcher w watches hold w*watchEvery

	load0 := loadAvg()
	m0 := scrape(bp.HTTPAddr)
	rss0, _ := rssKiB(pid)

	// Sample connections to the agent and blocking queries all along.
	var maxConns, maxBlocking, maxQueued atomic.Int64
	monStop := make(chan struct{})
	monDone := make(chan struct{})
	sample := func() {
		setMax(&maxConns, int64(consulConns(pid, port)))
		m := scrape(bp.HTTPAddr)
		setMax(&maxBlocking, int64(m["lockbroker_consul_blocking_queries"]))
		setMax(&maxQueued, int64(m["lockbroker_consul_blocking_queries_queued"]))
	}
	go func() {
		defer close(monDone)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-monStop:
				return
			case <-tick.C:
			}
		}
	}()
	stopMonitor := sync.OnceFunc(func() { close(monStop); <-monDone })
	defer stopMonitor()

	// Watchers first, so they see the holds arrive.
	var watchReady sync.WaitGroup
	var watchEvents, watchEnded, watchSeeHolder atomic.Int64
	var watchErrs errorLog
	for w := range nWatchers {
		watchReady.Add(1)
		go func() {
			ready := sync.OnceFunc(watchReady.Done)
			defer ready()
			st, err := clients[w%len(clients)].Watch(ctx, &lockbrokerv1.WatchRequest{Key: fmt.Sprintf("t%d/lock", w*watchEvery)})
			if err != nil {
				watchErrs.add(err)
				return
			}
			if _, err := st.Recv(); err != nil {
				watchErrs.add(err)
				return
			}
			ready()
			seen := false
			for {
				resp, err := st.Recv()
				if err != nil {
					if ctx.Err() == nil {
						watchEnded.Add(1)
						watchErrs.add(err)
					}
					return
				}
				watchEvents.Add(1)
				if !seen && len(resp.GetState().GetHolders()) > 0 {
					seen = true
					watchSeeHolder.Add(1)
				}
			}
		}()
	}
	t0 := time.Now()
	if !waitGroupWithin(&watchReady, time.Minute) {
		watchErrs.add(fmt.Errorf("watchers not all ready within 1m"))
	}
	watchersReady := time.Since(t0)

	// Holds: every Acquire at once, default session options.
	holds := make([]*scaleHold, nHolds)
	var acquired, lost, ended atomic.Int64
	var acqErrs, lossErrs errorLog
	allAcquired := make(chan struct{})
	var lastAcquired atomic.Int64 // unix nanos
	start := time.Now()
	for i := range holds {
		h := &scaleHold{key: fmt.Sprintf("t%d/lock", i), lostCh: make(chan time.Time, 1)}
		c := clients[i%len(clients)]
		holds[i] = h
		go func() {
			defer h.done.Store(true)
			st, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: h.key})
			if err != nil {
				acqErrs.add(err)
				return
			}
			for {
				resp, err := st.Recv()
				switch {
				case err != nil:
					if ctx.Err() == nil {
						if h.seq.Load() == nil {
							acqErrs.add(err)
						} else if !h.victim.Load() {
							ended.Add(1)
							lossErrs.add(fmt.Errorf("%s ended: %w", h.key, err))
						}
					}
					return
				case resp.GetAcquired() != nil:
					h.seq.Store(resp.GetAcquired().GetSequencer())
					lastAcquired.Store(time.Now().UnixNano())
					if acquired.Add(1) == int64(nHolds) {
						close(allAcquired)
					}
				case resp.GetLost() != nil:
					if h.victim.Load() {
						h.lostCh <- time.Now()
						return
					}
					lost.Add(1)
					lossErrs.add(fmt.Errorf("%s lost: %s %s", h.key, resp.GetLost().GetReason(), resp.GetLost().GetDetail()))
				}
			}
		}()
	}
	select {
	case <-allAcquired:
	case <-time.After(*scaleAcquireLimit):
	}
	acquireAll := time.Duration(0)
	if n := lastAcquired.Load(); n != 0 {
		acquireAll = time.Unix(0, n).Sub(start)
	}
	nAcquired := acquired.Load()

	// Every watcher sees its key's holder before the window starts.
	t2 := time.Now()
	for watchSeeHolder.Load() < int64(nWatchers) && time.Since(t2) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	watchersSaw, watchersSeeing := time.Since(t2), watchSeeHolder.Load()

	// The window: hold everything; read the gauges half way through, so
	// that any stall the reading causes would show as losses in the window.
	lostBefore, endedBefore, watchBefore := lost.Load(), ended.Load(), watchEvents.Load()
	mStart := scrape(bp.HTTPAddr)
	windowStart := time.Now()
	agentPid := agentPID(port)
	_, cpuB0 := statOf(pid)
	_, cpuA0 := statOf(agentPid)
	time.Sleep(*scaleWindow / 2)
	mDuring := scrape(bp.HTTPAddr)
	_, cpuB1 := statOf(pid)
	_, cpuA1 := statOf(agentPid)
	half := time.Since(windowStart)
	allocRate := (mDuring["go_memstats_alloc_bytes_total"] - mStart["go_memstats_alloc_bytes_total"]) / half.Seconds()
	rss, hwm := rssKiB(pid)
	blockingNow := int64(mDuring["lockbroker_consul_blocking_queries"])
	time.Sleep(time.Until(windowStart.Add(*scaleWindow)))
	lostWindow, endedWindow := lost.Load()-lostBefore, ended.Load()-endedBefore
	watchWindow := watchEvents.Load() - watchBefore

	// Loss notice for holds without a dedicated watch (no watcher on the
	// key): destroy their sessions in Consul, time `lost`.
	var loss latencies
	var lossSampleErrs errorLog
	admin := agent.Client()
	for i, n := len(holds)-1, 0; i >= 0 && n < *scaleLoss; i-- {
		h := holds[i]
		seq := h.seq.Load()
		if i%watchEvery == 0 || seq == nil || h.done.Load() {
			continue
		}
		n++
		h.victim.Store(true)
		t1 := time.Now()
		if _, err := admin.Session().Destroy(seq.GetSessionId(), nil); err != nil {
			lossSampleErrs.add(err)
			continue
		}
		select {
		case at := <-h.lostCh:
			loss.add(at.Sub(t1))
		case <-time.After(10 * time.Second):
			lossSampleErrs.add(fmt.Errorf("%s: no lost within 10s", h.key))
		}
	}
	stopMonitor()

	// Waiting: what Acquire requests queued behind these holds cost.
	waiting := scaleWaiting(ctx, &brokerProcess{httpAddr: bp.HTTPAddr, pid: pid}, agentPid, clients, holds)

	g0, gDuring := m0["go_goroutines"], mDuring["go_goroutines"]
	goroutinesPerHold := (gDuring - g0) / float64(max(nAcquired, 1))
	holdingCPU := 100 * float64(cpuB1-cpuB0) / float64(half)
	var tb textTable
	tb.add("scale figure", "value", "target (issues 10, 12)")
	tb.add("holds acquired (t<i>/lock, one top-level prefix each)", fmt.Sprintf("%d / %d", nAcquired, nHolds), "all")
	tb.add("time until all acquired (last `acquired` − first Acquire)", fmtDur(acquireAll, nAcquired == int64(nHolds)), "≤ 10 s")
	tb.add("watchers (Watch streams, one per watched key)", fmt.Sprintf("%d, ready in %s", nWatchers, watchersReady.Round(time.Millisecond)), "1,000")
	tb.add(fmt.Sprintf("holds lost during the %s window", *scaleWindow), strconv.FormatInt(lostWindow, 10), "0")
	tb.add("holds whose stream ended otherwise during the window", strconv.FormatInt(endedWindow, 10), "0")
	tb.add("holds lost / ended before the window (while acquiring)", fmt.Sprintf("%d / %d", lostBefore, endedBefore), "0")
	tb.add("watchers that saw their key's new holder / time after all acquired", fmt.Sprintf("%d / %s", watchersSeeing, watchersSaw.Round(time.Millisecond)), "all")
	tb.add("watch events during the window (no holder changed)", strconv.FormatInt(watchWindow, 10), "0")
	tb.add("max TCP connections to the agent's HTTP port (whole run)", strconv.FormatInt(maxConns.Load(), 10), "≤ 180")
	tb.add("max / mid-window open blocking queries (Store)", fmt.Sprintf("%d / %d", maxBlocking.Load(), blockingNow), "capped")
	tb.add("max blocking queries queued for a slot", strconv.FormatInt(maxQueued.Load(), 10), "")
	tb.add("broker RSS mid-window / peak (its process, /proc/<pid>/status)", fmt.Sprintf("%.0f / %.0f MiB (%.0f MiB before the holds)", float64(rss)/1024, float64(hwm)/1024, float64(rss0)/1024), "≤ 512 MiB")
	tb.add("broker Go heap / goroutine stacks in use mid-window (/metrics), stack per goroutine",
		fmt.Sprintf("%.0f / %.0f MiB, %.1f KiB", mDuring["go_memstats_heap_inuse_bytes"]/(1<<20), mDuring["go_memstats_stack_inuse_bytes"]/(1<<20),
			mDuring["go_memstats_stack_inuse_bytes"]/max(gDuring, 1)/1024), "")
	tb.add("CPU while holding (first half of the window): broker / agent, % of one core",
		fmt.Sprintf("%.0f%% / %.0f%%", holdingCPU, 100*float64(cpuA1-cpuA0)/float64(half)), "")
	tb.add("broker allocation while holding (/metrics)", fmt.Sprintf("%.0f MB/s", allocRate/1e6), "")
	tb.add("broker goroutines per hold ((mid-window − before)/holds)", fmt.Sprintf("%.2f", goroutinesPerHold), "≤ 3")
	tb.add("broker goroutines: before → mid-window", fmt.Sprintf("%.0f → %.0f", g0, gDuring), "")
	tb.add(fmt.Sprintf("loss notice, unwatched hold, p50 / max (n=%d)", loss.len()),
		fmt.Sprintf("%s / %s ms", fmtMs(loss.p50()), fmtMs(loss.quantile(1))), "≤ 1000 ms")
	waiting.rows(&tb, holdingCPU)

	var out strings.Builder
	fmt.Fprintf(&out, "# scale run (issue 10 item 1, issue 12) — reproduce: %s\n", reproduce)
	fmt.Fprintf(&out, "# GOMAXPROCS=%d cpu %q, load average at start %s, at end %s; tree: %s\n", runtime.GOMAXPROCS(0), cpuModel(), load0, loadAvg(), treeState(t))
	fmt.Fprintf(&out, "# one replica (the broker binary, its own process, default flags), %d gRPC connection(s) carrying %d Acquire\n", len(clients), nHolds)
	fmt.Fprintf(&out, "#   + %d Watch streams, default session options; agent started with limits { http_max_conns_per_client = 200 }.\n", nWatchers)
	if waiting != nil {
		fmt.Fprintf(&out, "# after the window and the loss samples: %d Acquire requests (default session options) queued behind %d of the holds, measured over %s.\n", waiting.n, waiting.keys, *scaleWaitWindow)
	}
	out.WriteString(tb.String())
	for _, x := range []struct {
		name string
		e    *errorLog
	}{{"acquire", &acqErrs}, {"holds lost/ended", &lossErrs}, {"watchers", &watchErrs}, {"loss samples", &lossSampleErrs}, {"waiters", waiting.errLog()}} {
		if x.e.count() > 0 {
			fmt.Fprintf(&out, "# ERRORS %s: %s\n", x.name, x.e.String())
		}
	}
	fmt.Fprintf(&out, "SCALE holds=%d acquired=%d watchers=%d acquire_all=%s lost_window=%d ended_window=%d max_consul_conns=%d max_blocking=%d rss_mib=%.0f broker_goroutines_per_hold=%.2f loss_p50_ms=%.1f\n",
		nHolds, nAcquired, nWatchers, acquireAll.Round(time.Millisecond), lostWindow, endedWindow, maxConns.Load(), maxBlocking.Load(),
		float64(rss)/1024, goroutinesPerHold, msOf(loss.p50()))
	fmt.Print(out.String())
	cancel()
}

func setMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// waitGroupWithin waits for wg at most d, and says whether it finished.
func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func fmtDur(d time.Duration, complete bool) string {
	s := d.Round(time.Millisecond).String()
	if !complete {
		s += " (incomplete)"
	}
	return s
}
