package bench

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

var (
	rwMulti        = flag.Bool("rwmulti", false, "run TestBenchRWMulti (make bench runs it)")
	rwMultiCycles  = flag.Int("rwmulti.cycles", 400, "uncontended cycles per implementation in the read-lock and multi-key rows")
	rwMultiBursts  = flag.Int("rwmulti.bursts", 40, "bursts of 16 grants at once per implementation")
	rwMultiPar     = flag.Int("rwmulti.par", 4800, "cycles per implementation in the 16-client throughput row (split among the turns and the clients)")
	rwMultiKeys    = flag.Int("rwmulti.keys", 4, "keys of the multi-key lock (and of the one-by-one locking)")
	rwMultiClients = flag.Int("rwmulti.clients", 16, "readers on one key / lock holders on distinct keys in the at-once rows")
)

// TestBenchRWMulti prints issue 43's rows, the broker binary against
// itself on one agent (the anchors are the broker's own plain locks:
// Consul has neither read-write nor multi-key locks):
//   - a read-lock cycle (Acquire kind READ, Release) against a lock cycle;
//   - 16 readers at once on one read-write key against 16 lock holders on
//     distinct keys: the time until all 16 have `acquired`, and 16
//     clients cycling;
//   - a 4-key multi-lock cycle (AcquireRequest.keys) against a one-key
//     cycle, and against Curator-style locking of the same 4 keys one by
//     one through the same API (each key in sorted order, waiting for its
//     `acquired`, then Release of each in reverse order, as Curator's
//     InterProcessMultiLock does).
//
// Each row measures its implementations in alternating turns (see
// interleaved). It asserts nothing but that the run completed.
//
//	go test -count=1 -run TestBenchRWMulti -v ./test/bench/ -args -rwmulti
func TestBenchRWMulti(t *testing.T) {
	if !*rwMulti {
		t.Skip("run with -rwmulti (make bench)")
	}
	e := newEnv(t)
	var out strings.Builder
	fmt.Fprintf(&out, "# lockbroker read-write and multi-key bench (issue 43) — %s; load average at start %s (the machine is shared)\n",
		time.Now().UTC().Format(time.RFC3339), loadAvg())
	out.WriteString("# reproduce: go test -count=1 -run TestBenchRWMulti -v ./test/bench/ -args -rwmulti   (make bench runs it)\n")
	fmt.Fprintf(&out, "# tree: %s; the broker binary in a process of its own (pid %d) on one consul dev agent, raw stubs over one\n", treeState(t), e.proc.pid)
	out.WriteString("#   connection, default session options; every cycle is Acquire until `acquired`, Release with session + token,\n")
	out.WriteString("#   until `released`.\n")

	d := e.bd
	cycle := func(req func() *lockbrokerv1.AcquireRequest) func(int) error {
		return func(int) error { return d.cycleReq(req()) }
	}
	lockReq := func(key string) func() *lockbrokerv1.AcquireRequest {
		return func() *lockbrokerv1.AcquireRequest { return &lockbrokerv1.AcquireRequest{Key: key} }
	}
	readReq := func(key string) func() *lockbrokerv1.AcquireRequest {
		return func() *lockbrokerv1.AcquireRequest {
			return &lockbrokerv1.AcquireRequest{Key: key, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ}
		}
	}

	// 1. Read-lock cycle against lock cycle.
	rl := interleaved(*rwMultiCycles,
		func(n int) *run { return e.sequential(n, true, cycle(lockReq("bench/rw/cycle/lock"))) },
		func(n int) *run { return e.sequential(n, true, cycle(readReq("bench/rw/cycle/read"))) })
	lockCyc, readCyc := rl[0], rl[1]

	// 2. Many at once: readers on one key, lock holders on distinct keys.
	clients := *rwMultiClients
	bu := interleaved(*rwMultiBursts,
		func(n int) *run {
			return e.bursts(n, clients, func(c int) *lockbrokerv1.AcquireRequest {
				return &lockbrokerv1.AcquireRequest{Key: fmt.Sprintf("bench/rw/burst/lock/%d", c)}
			})
		},
		func(n int) *run {
			return e.bursts(n, clients, func(int) *lockbrokerv1.AcquireRequest { return readReq("bench/rw/burst/read")() })
		})
	lockBurst, readBurst := bu[0], bu[1]
	turn := func(mk func(c int) func() error) func(n int) *run {
		return func(n int) *run {
			return e.parallel(clients, max(n/clients, 1), true, func(c int) (func() error, func()) { return mk(c), func() {} })
		}
	}
	pa := interleaved(*rwMultiPar,
		turn(func(c int) func() error {
			req := lockReq(fmt.Sprintf("bench/rw/par/lock/%d", c))
			return func() error { return d.cycleReq(req()) }
		}),
		turn(func(int) func() error {
			req := readReq("bench/rw/par/read")
			return func() error { return d.cycleReq(req()) }
		}))
	lockPar, readPar := pa[0], pa[1]

	// 3. A multi-key lock against one key and against one key at a time.
	var keys []string
	for i := range *rwMultiKeys {
		keys = append(keys, fmt.Sprintf("bench/multi/k%02d", i))
	}
	mu := interleaved(*rwMultiCycles,
		func(n int) *run { return e.sequential(n, true, cycle(lockReq("bench/multi/one"))) },
		func(n int) *run {
			return e.sequential(n, true, cycle(func() *lockbrokerv1.AcquireRequest {
				return &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:]}
			}))
		},
		func(n int) *run { return e.sequential(n, true, func(int) error { return d.oneByOne(keys) }) })
	oneKey, multi, byOne := mu[0], mu[1], mu[2]

	var tb textTable
	tb.add("figure", "measured", "against", "against is", "ratio", "target (issue 43)")
	vs := func(name string, m, a *latencies, q float64, against, target string) {
		b, c := qOf(m, q), qOf(a, q)
		tb.add(name, fmtMs(b), fmtMs(c), against, ratio(b, c), target)
	}
	vs(fmt.Sprintf("read-lock cycle p50 ms (n=%d)", readCyc.n), &readCyc.lat, &lockCyc.lat, 0.5, "lock cycle", "≤1.1×")
	vs("read-lock cycle p99 ms", &readCyc.lat, &lockCyc.lat, 0.99, "lock cycle", "")
	vs(fmt.Sprintf("%d readers at once on one key: all granted, p50 ms (n=%d bursts)", clients, readBurst.n),
		&readBurst.lat, &lockBurst.lat, 0.5, fmt.Sprintf("%d lock holders, distinct keys", clients), "")
	vs(fmt.Sprintf("%d readers at once on one key: all granted, p99 ms", clients),
		&readBurst.lat, &lockBurst.lat, 0.99, fmt.Sprintf("%d lock holders, distinct keys", clients), "")
	tb.add(fmt.Sprintf("%d clients cycling read locks on one key, cycles/s (n=%d)", clients, readPar.n),
		fmtRate(readPar.rate()), fmtRate(lockPar.rate()), fmt.Sprintf("%d clients, locks on distinct keys", clients),
		ratioF(readPar.rate(), lockPar.rate()), "")
	vs(fmt.Sprintf("%d-key multi-lock cycle p50 ms (n=%d)", len(keys), multi.n), &multi.lat, &oneKey.lat, 0.5, "one-key lock cycle", "≤1.5×")
	vs(fmt.Sprintf("%d-key multi-lock cycle p50 ms", len(keys)), &multi.lat, &byOne.lat, 0.5,
		fmt.Sprintf("the %d keys one by one (n=%d)", len(keys), byOne.n), "")
	vs(fmt.Sprintf("%d-key multi-lock cycle p99 ms", len(keys)), &multi.lat, &oneKey.lat, 0.99, "one-key lock cycle", "")
	vs(fmt.Sprintf("%d-key multi-lock cycle p99 ms", len(keys)), &multi.lat, &byOne.lat, 0.99, fmt.Sprintf("the %d keys one by one", len(keys)), "")
	out.WriteString(tb.String())

	cost := newCostTable("cost per cycle (burst: per burst)")
	cost.row("lock cycle", lockCyc)
	cost.row("read-lock cycle", readCyc)
	cost.row(fmt.Sprintf("burst: %d lock holders, distinct keys", clients), lockBurst)
	cost.row(fmt.Sprintf("burst: %d readers, one key", clients), readBurst)
	cost.row(fmt.Sprintf("%d clients: locks, distinct keys", clients), lockPar)
	cost.row(fmt.Sprintf("%d clients: read locks, one key", clients), readPar)
	cost.row("one-key lock cycle", oneKey)
	cost.row(fmt.Sprintf("%d-key multi-lock cycle", len(keys)), multi)
	cost.row(fmt.Sprintf("%d keys one by one", len(keys)), byOne)
	out.WriteString("#\n")
	out.WriteString(cost.String())
	out.WriteString("# Consul calls: the broker's lockbroker_consul_requests_total (its /metrics). CPU (client): this test process;\n")
	out.WriteString("#   CPU (broker), CPU (agent): /proc/<pid>/stat (10 ms ticks). allocs: this process's and the broker's, per cycle.\n")
	fmt.Fprintf(&out, "# burst: %d streams opened at once (a goroutine each); latency = first Acquire call → the last `acquired`;\n", clients)
	out.WriteString("#   then all release and wait `released` before the next burst.\n")
	fmt.Fprintf(&out, "# one by one: Curator's InterProcessMultiLock through this API: Acquire each of the %d keys in sorted order\n", len(keys))
	out.WriteString("#   until its `acquired`, then Release each in reverse order until its `released`; the multi-lock and it use the\n")
	out.WriteString("#   same keys. The multi-lock releases with its first key's token (Release of any key releases all).\n")
	for _, x := range []struct {
		name string
		r    *run
	}{
		{"lock cycle", lockCyc}, {"read-lock cycle", readCyc}, {"burst locks", lockBurst}, {"burst readers", readBurst},
		{"16 clients locks", lockPar}, {"16 clients read locks", readPar},
		{"one-key cycle", oneKey}, {"multi-lock cycle", multi}, {"one by one", byOne},
	} {
		if x.r.errs.count() > 0 {
			fmt.Fprintf(&out, "# ERRORS %s: %s\n", x.name, x.r.errs.String())
		}
	}
	fmt.Fprintf(&out, "# load average at end %s\n", loadAvg())
	fmt.Print(out.String())
}

// cycleReq is one uncontended cycle of req: Acquire until `acquired`,
// Release with the token, wait for `released`.
func (d brokerDriver) cycleReq(req *lockbrokerv1.AcquireRequest) error {
	h, err := d.acquireReq(req)
	if err != nil {
		return err
	}
	return d.releaseAndWait(h)
}

// oneByOne takes keys as Curator's InterProcessMultiLock does, through
// this API: one Acquire per key in sorted order, each until `acquired`,
// then Release of each in reverse order until its `released`.
func (d brokerDriver) oneByOne(keys []string) error {
	sorted := slices.Sorted(slices.Values(keys))
	var held []*brokerHold
	defer func() {
		for _, h := range held {
			h.cancel()
		}
	}()
	for _, k := range sorted {
		h, err := d.acquire(k, 0)
		if err != nil {
			return err
		}
		held = append(held, h)
	}
	var first error
	for i := len(held) - 1; i >= 0; i-- {
		if err := d.releaseAndWait(held[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// bursts runs n bursts: clients Acquire streams opened at once, req(c)
// each, timed from the first call to the last `acquired`; then every
// hold is released (until `released`) before the next. A burst with an
// error counts no latency.
func (e *env) bursts(n, clients int, req func(c int) *lockbrokerv1.AcquireRequest) *run {
	r := &run{}
	d := e.bd
	burst := func() (time.Duration, error) {
		holds := make([]*brokerHold, clients)
		errs := make([]error, clients)
		var last time.Time
		var mu sync.Mutex
		var wg sync.WaitGroup
		t0 := time.Now()
		for c := range clients {
			wg.Go(func() {
				h, err := d.acquireReq(req(c))
				now := time.Now()
				holds[c], errs[c] = h, err
				mu.Lock()
				if now.After(last) {
					last = now
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		took := last.Sub(t0)
		for c := range clients {
			if holds[c] == nil {
				continue
			}
			wg.Go(func() {
				if err := d.releaseAndWait(holds[c]); err != nil {
					mu.Lock()
					errs[c] = err
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return 0, err
			}
		}
		return took, nil
	}
	for range 2 { // warm-up
		_, _ = burst()
	}
	e.measure(r, true, func() {
		for range n {
			if r.failed() {
				return
			}
			took, err := burst()
			if err != nil {
				r.errs.add(err)
				continue
			}
			r.lat.add(took)
			r.n++
		}
	})
	return r
}
