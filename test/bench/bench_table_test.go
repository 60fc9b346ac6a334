package bench

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	table          = flag.Bool("table", false, "run TestBenchTable (make bench runs it)")
	tableCycles    = flag.Int("table.cycles", 500, "uncontended cycles per implementation")
	tableHandoffs  = flag.Int("table.handoffs", 600, "hand-offs per implementation")
	tableSemCycles = flag.Int("table.sem", 360, "semaphore cycles per implementation")
	tableReleases  = flag.Int("table.releases", 200, "stream-less TryAcquire + Release samples")
	tableLoss      = flag.Int("table.loss", 30, "loss-notice samples per implementation")
	lossOnly       = flag.Bool("loss", false, "run TestBenchLossNotice (the table's loss-notice rows alone)")
	// handoffSettle is how long a hand-off waiter is left queued before the
	// holder releases, for the broker and api.Lock alike (api.Lock cannot
	// say when it is waiting). The processes are idle that long: each
	// hand-off starts cold.
	handoffSettle = flag.Duration("table.settle", 20*time.Millisecond, "how long a hand-off waiter is left queued before the release")
)

// tableParCycles: the parallel rows run long enough for a replica to reach
// its steady state (tens of thousands of releases, tens of seconds): at
// 3,840 cycles they missed a per-Release cost that grew with the releases
// of the last minute (fixed in dcfa51c).
var tableParCycles = flag.Int("table.par", 24000, "cycles per implementation in each parallel row (split among the turns and the clients)")

// reproduce is the command make bench runs.
const reproduce = `go test -count=1 -timeout 30m -run 'TestBenchTable|TestBenchQueue|TestBenchRWMulti|TestBenchLossNotice|TestScale' -v ./test/bench/ -args -table -queue -rwmulti -loss -scale`

// lossAge is how old a hold is in the second loss-notice rows (its watch
// runs by then).
const lossAge = 500 * time.Millisecond

// maxRowErrors ends a row early: a broken path should not take the run's
// whole time budget.
const maxRowErrors = 10

// TestBenchTable prints issue 12's side-by-side table from one run: every
// figure of the broker next to Consul's own api.Lock / api.Semaphore and
// the raw floor, against one Consul agent. The anchors run in this
// process; the broker runs as the broker binary in a process of its own,
// as it is deployed (-table.inprocess runs it in this process instead,
// which spares it the cross-process hops to its client). It asserts
// nothing but that the run completed.
func TestBenchTable(t *testing.T) {
	if !*table {
		t.Skip("run with -table (make bench)")
	}
	e := newEnv(t)
	var out strings.Builder
	e.header(&out)

	// Uncontended cycles on one key each.
	fl := e.newFloor()
	hp := startHop(t, e.agent.HTTPAddr())
	e.hopPid = hp.pid
	unc := interleaved(*tableCycles,
		func(n int) *run {
			return e.sequential(n, false, func(int) error { return apiLockCycle(e.ac, "bench/unc/api") })
		},
		func(n int) *run {
			return e.sequential(n, false, func(int) error {
				t0 := time.Now()
				if err := fl.acquire("bench/unc/floor"); err != nil {
					return err
				}
				t1 := time.Now()
				err := fl.release("bench/unc/floor")
				e.floorAcq.add(t1.Sub(t0))
				e.floorRel.add(time.Since(t1))
				return err
			})
		},
		func(n int) *run {
			return e.sequential(n, true, func(int) error { return e.bd.cycle("bench/unc/broker", 0) })
		},
		func(n int) *run {
			return e.sequential(n, true, func(int) error { return e.bd.libCycle("bench/unc/lib") })
		},
		func(n int) *run {
			return e.sequential(n, false, func(int) error { return hp.bd.cycle("bench/unc/hop", 0) })
		},
		func(n int) *run {
			return e.sequential(n, false, func(int) error { return hp.check() })
		})
	apiUnc, flUnc, brUnc, libUnc, hopUnc, hopRTT := unc[0], unc[1], unc[2], unc[3], unc[4], unc[5]

	// The same cycle as a tenant of a shared broker, against api.Lock.
	var apiTen, brTen *run
	if *tableTenant {
		te := e.tenantEnv()
		ten := interleaved(*tableCycles,
			func(n int) *run {
				return e.sequential(n, false, func(int) error { return apiLockCycle(e.ac, "bench/ten/api") })
			},
			func(n int) *run {
				return te.sequential(n, true, func(int) error { return te.bd.cycle("bench/ten/broker", 0) })
			})
		apiTen, brTen = ten[0], ten[1]
	}

	// Hand-off.
	ho := interleaved(*tableHandoffs, e.apiHandoff,
		func(n int) *run { return e.brokerHandoff(e.bd, true, "broker", n) },
		func(n int) *run { return e.brokerHandoff(hp.bd, false, "hop", n) })
	apiHo, brHo, hopHo := ho[0], ho[1], ho[2]

	// Parallel clients on distinct keys.
	par := map[int][3]*run{}
	for _, clients := range []int{16, 64} {
		// interleaved splits the total into turns; each turn splits its
		// share among the clients.
		turn := func(broker bool, mk func(c int) (func() error, func())) func(n int) *run {
			return func(n int) *run { return e.parallel(clients, max(n/clients, 1), broker, mk) }
		}
		rs := interleaved(*tableParCycles,
			turn(false, func(c int) (func() error, func()) {
				key := fmt.Sprintf("bench/par%d/api/%d", clients, c)
				return func() error { return apiLockCycle(e.ac, key) }, func() {}
			}),
			turn(false, func(c int) (func() error, func()) {
				key := fmt.Sprintf("bench/par%d/floor/%d", clients, c)
				f := e.newFloor()
				return func() error { return f.cycle(key) }, func() { f.close(e.ac) }
			}),
			turn(true, func(c int) (func() error, func()) {
				key := fmt.Sprintf("bench/par%d/broker/%d", clients, c)
				return func() error { return e.bd.cycle(key, 0) }, func() {}
			}))
		par[clients] = [3]*run{rs[0], rs[1], rs[2]}
	}

	// Semaphore: limit 3, 12 clients on one prefix.
	const semLimit, semClients = 3, 12
	sem := interleaved(*tableSemCycles,
		func(n int) *run {
			return e.shared(semClients, n, false, func(int) error {
				return apiSemaphoreCycle(e.ac, "bench/sem/api", semLimit)
			})
		},
		func(n int) *run {
			return e.shared(semClients, n, true, func(int) error {
				return e.bd.cycle("bench/sem/broker", semLimit)
			})
		})
	apiSem, brSem := sem[0], sem[1]

	// Stream-less TryAcquire + Release with a client-owned session.
	try, rel := e.streamless(*tableReleases)

	// Loss notice: the session destroyed in Consul → lost / leaderCh closed.
	loss := e.lossRuns(*tableLoss)
	apiLoss, brLoss, brLossAged := loss.api, loss.fresh, loss.aged
	fl.close(e.ac)

	// The table.
	var tb textTable
	tb.add("figure", "broker", "consul api", "floor", "broker/api", "broker/floor", "target (issue 12)")
	lat := func(name string, br, ap, fl *latencies, q float64, target string) {
		b, a, f := qOf(br, q), qOf(ap, q), qOf(fl, q)
		tb.add(name, fmtMs(b), fmtMs(a), fmtMs(f), ratio(b, a), ratio(b, f), target)
	}
	lat(fmt.Sprintf("uncontended cycle p50 ms (n=%d)", *tableCycles), &brUnc.lat, &apiUnc.lat, &flUnc.lat, 0.5, "≤1.0× api (stretch ≤1.5× floor)")
	lat("uncontended cycle p99 ms", &brUnc.lat, &apiUnc.lat, &flUnc.lat, 0.99, "")
	lat(fmt.Sprintf("uncontended cycle, Go client library, p50 ms (n=%d)", *tableCycles), &libUnc.lat, &apiUnc.lat, &flUnc.lat, 0.5, "")
	if brTen != nil {
		lat(fmt.Sprintf("uncontended cycle, shared broker's tenant, p50 ms (n=%d)", *tableCycles), &brTen.lat, &apiTen.lat, &flUnc.lat, 0.5, "")
	}
	lat(fmt.Sprintf("uncontended cycle, hop floor (a relay), p50 ms (n=%d)", *tableCycles), &hopUnc.lat, &apiUnc.lat, &flUnc.lat, 0.5, "")
	tb.add(fmt.Sprintf("gRPC round trip alone (relay's health), p50 ms (n=%d)", *tableCycles), fmtMs(hopRTT.lat.p50()), "-", "-", "-", "-", "")
	lat(fmt.Sprintf("hand-off p50 ms (n=%d)", *tableHandoffs), &brHo.lat, &apiHo.lat, nil, 0.5, "≤1.0× api")
	lat("hand-off p99 ms", &brHo.lat, &apiHo.lat, nil, 0.99, "")
	lat("hand-off: Release / Unlock call alone p50 ms", &brHo.part, &apiHo.part, nil, 0.5, "")
	lat(fmt.Sprintf("hand-off, hop floor (a relay), p50 ms (n=%d)", *tableHandoffs), &hopHo.lat, &apiHo.lat, nil, 0.5, "")
	for _, clients := range []int{16, 64} {
		rs := par[clients]
		target := ""
		if clients == 64 {
			target = "≥1.5× api"
		}
		b, a, f := rs[2].rate(), rs[0].rate(), rs[1].rate()
		tb.add(fmt.Sprintf("%d clients, distinct keys, cycles/s (n=%d)", clients, rs[2].n),
			fmtRate(b), fmtRate(a), fmtRate(f), ratioF(b, a), ratioF(b, f), target)
	}
	tb.add(fmt.Sprintf("semaphore limit %d, %d clients, cycles/s (n=%d)", semLimit, semClients, brSem.n),
		fmtRate(brSem.rate()), fmtRate(apiSem.rate()), "-", ratioF(brSem.rate(), apiSem.rate()), "-", "≥1.2× api.Semaphore")
	tb.add(fmt.Sprintf("stream-less Release p50 ms (n=%d)", rel.len()), fmtMs(rel.p50()), "-", fmtMs(e.floorRel.p50()),
		"-", ratio(rel.p50(), e.floorRel.p50()), "≤20 ms")
	tb.add("stream-less Release p99 ms", fmtMs(rel.p99()), "-", fmtMs(e.floorRel.p99()), "-", ratio(rel.p99(), e.floorRel.p99()), "")
	tb.add(fmt.Sprintf("stream-less TryAcquire p50 ms (n=%d)", try.len()), fmtMs(try.p50()), "-", fmtMs(e.floorAcq.p50()),
		"-", ratio(try.p50(), e.floorAcq.p50()), "")
	loss.rows(lat)
	out.WriteString(tb.String())

	// Costs per cycle, by row and implementation.
	cost := newCostTable("cost per cycle")
	costRow := cost.row
	costRow("uncontended: broker", brUnc)
	costRow("uncontended: api.Lock", apiUnc)
	costRow("uncontended: floor", flUnc)
	costRow("uncontended: broker, Go client library", libUnc)
	cost.add("uncontended: hop floor (relay's CPU in broker)", strconv.Itoa(hopUnc.n), fmtMs(hopUnc.lat.p50()), fmtMs(hopUnc.lat.p99()), "-", "-",
		hopUnc.cpuPer1k(hopUnc.cpu), hopUnc.cpuPer1k(hopUnc.hopCPU), hopUnc.cpuPer1k(hopUnc.consulCPU), "-")
	if brTen != nil {
		costRow("uncontended, tenant: broker", brTen)
		costRow("uncontended, tenant: api.Lock", apiTen)
	}
	costRow("hand-off: broker", brHo)
	costRow("hand-off: api.Lock", apiHo)
	costRow("16 clients: broker", par[16][2])
	costRow("16 clients: api.Lock", par[16][0])
	costRow("16 clients: floor", par[16][1])
	costRow("64 clients: broker", par[64][2])
	costRow("64 clients: api.Lock", par[64][0])
	costRow("64 clients: floor", par[64][1])
	costRow("semaphore: broker", brSem)
	costRow("semaphore: api.Semaphore", apiSem)
	costRow("stream-less TryAcquire + Release: broker", e.streamErrs)
	costRow("loss notice: broker (per sample)", brLoss)
	out.WriteString("#\n")
	out.WriteString(cost.String())

	// Notes and errors.
	if e.proc != nil {
		out.WriteString("# Consul calls: broker rows count the broker's lockbroker_consul_requests_total (its /metrics); anchor rows count\n")
	} else {
		out.WriteString("# Consul calls: broker rows count internal/consulstore (*Store).OpCounts; anchor rows count\n")
	}
	out.WriteString("#   the HTTP requests of their api.Client (a counting RoundTripper), async ones included (api.Lock destroys its\n")
	out.WriteString("#   session after Unlock).\n")
	if e.proc != nil {
		out.WriteString("# CPU (client): getrusage of this test process: the gRPC client for broker rows, the api client for anchor rows.\n")
		out.WriteString("#   CPU (broker): utime+stime of the broker process; CPU (agent): of the consul agent (/proc/<pid>/stat, 10 ms ticks).\n")
		out.WriteString("# allocs: this process's runtime.MemStats.Mallocs, plus for broker rows the broker's go_memstats_mallocs_total\n")
		fmt.Fprintf(&out, "#   (less the %d one /metrics scrape allocates), per cycle.\n", e.proc.scrapeAllocs)
	} else {
		out.WriteString("# CPU (client): getrusage of this test process = in-process broker + gRPC client for broker rows, the api client\n")
		out.WriteString("#   for anchor rows. CPU (agent): utime+stime of the consul agent process (/proc/<pid>/stat, 10 ms ticks).\n")
		out.WriteString("# allocs: runtime.MemStats.Mallocs of the whole process (broker + client side for broker rows) per cycle.\n")
	}
	out.WriteString("# ratios: broker/anchor; for latencies lower is better, for cycles/s higher is better.\n")
	out.WriteString("# hop floor: the broker row's client and cycle against a relay in a process of its own that serves Acquire and\n")
	out.WriteString("#   Release with only the floor's two KV writes (one session kept; no validation, records, fencing, renewal or\n")
	out.WriteString("#   logging): the least any process between client and Consul costs here. Its hand-off queues the waiter and\n")
	out.WriteString("#   hands the key over in one transaction (unlock, lock with the waiter's session), as the broker's does, with no\n")
	out.WriteString("#   records or checks. The round-trip row is a health Check to the same relay over the same kind of connection.\n")
	fmt.Fprintf(&out, "#   broker - hop floor = %s ms per cycle (the broker's own cost); hop floor - floor = %s ms (the hop's).\n",
		fmtMs(brUnc.lat.p50()-hopUnc.lat.p50()), fmtMs(hopUnc.lat.p50()-flUnc.lat.p50()))
	if brTen != nil {
		out.WriteString("# tenant rows: a second broker binary on the same agent with --tenants (one tenant, prefix bench/), called with\n")
		out.WriteString("#   the tenant's bearer token (loopback plaintext), interleaved with api.Lock cycles of their own.\n")
	}
	out.WriteString(fmt.Sprintf("# hand-off: the waiter is queued (broker: after `queued`) and left %s before the holder releases;\n", *handoffSettle))
	out.WriteString("#   latency = Release/Unlock call → waiter's `acquired` / Lock returns, each noted by the waiter's own goroutine; the\n")
	out.WriteString("#   call-alone row is the holder's call until it returns.\n")
	e.lossNotes(&out)
	for _, x := range []struct {
		name string
		r    *run
	}{
		{"uncontended broker", brUnc}, {"uncontended api.Lock", apiUnc}, {"uncontended floor", flUnc}, {"uncontended Go client library", libUnc},
		{"uncontended hop floor", hopUnc}, {"gRPC round trip", hopRTT},
		{"uncontended tenant broker", brTen}, {"uncontended tenant api.Lock", apiTen},
		{"hand-off broker", brHo}, {"hand-off api.Lock", apiHo}, {"hand-off hop floor", hopHo},
		{"16 clients broker", par[16][2]}, {"16 clients api.Lock", par[16][0]}, {"16 clients floor", par[16][1]},
		{"64 clients broker", par[64][2]}, {"64 clients api.Lock", par[64][0]}, {"64 clients floor", par[64][1]},
		{"semaphore broker", brSem}, {"semaphore api.Semaphore", apiSem},
		{"stream-less broker", e.streamErrs}, {"loss broker", brLoss}, {"loss broker (spread)", loss.spread}, {"loss broker (aged)", brLossAged}, {"loss api.Lock", apiLoss},
	} {
		if x.r != nil && x.r.errs.count() > 0 {
			out.WriteString(fmt.Sprintf("# ERRORS %s: %s\n", x.name, x.r.errs.String()))
		}
	}
	fmt.Fprintf(&out, "# load average at end %s\n", loadAvg())
	fmt.Print(out.String())
}

// costTable is the table of costs per cycle (or per burst) of runs: Consul
// calls, CPU and allocations.
type costTable struct{ textTable }

func newCostTable(per string) *costTable {
	var c costTable
	c.add(per, "cycles", "p50 ms", "p99 ms", "Consul calls", "calls by kind", "CPU s/1k (client)", "CPU s/1k (broker)", "CPU s/1k (agent)", "allocs")
	return &c
}

// row adds r's costs as the row name.
func (c *costTable) row(name string, r *run) {
	brokerCPU := "-"
	if r.brokerCPU > 0 {
		brokerCPU = r.cpuPer1k(r.brokerCPU)
	}
	c.add(name, strconv.Itoa(r.n), fmtMs(r.lat.p50()), fmtMs(r.lat.p99()),
		fmt.Sprintf("%.2f", r.perCycle(float64(sumCounts(r.calls)))), perCycle(r.calls, r.n),
		r.cpuPer1k(r.cpu), brokerCPU, r.cpuPer1k(r.consulCPU),
		fmt.Sprintf("%.0f", r.perCycle(float64(r.allocs))))
}

// env is the one agent, one replica and the clients every row shares.
type env struct {
	t     *testing.T
	agent *consultest.Agent
	bd    brokerDriver
	store interface{ OpCounts() map[string]uint64 }
	// proc is the broker process (nil with -table.inprocess).
	proc    *brokerProcess
	ac      *api.Client
	counter *callCounter
	// anchorTr is the anchors' transport: its idle connections are closed
	// before every run.
	anchorTr *http.Transport
	pid      int
	hopPid   int // the hop floor's relay process, once started

	floorAcq, floorRel latencies // parts of the uncontended floor cycle
	streamErrs         *run
	lossReasons        map[string]int
}

func newEnv(t *testing.T) *env {
	// The broker and the anchor clients share one source IP here, so the
	// table's agent allows more than Consul's default 200 connections per
	// client (the anchors' idle pools would otherwise push the broker into
	// 429s); the scale run keeps the default.
	agent := consultest.Start(t, consultest.WithHCL(`limits { http_max_conns_per_client = 1000 }`))
	e := &env{t: t, agent: agent, streamErrs: &run{}, lossReasons: map[string]int{}}
	if *tableInProcess {
		r := startBroker(t, agent)
		e.bd, e.store = newDriver(r.Conn(t)), r.Store
	} else {
		// The broker binary as it is deployed: its session pool is on.
		e.bd, e.proc = startProcess(t, agent, nil)
		waitPool(t, agent)
		e.store = e.proc
	}
	e.anchorTr = pooledTransport()
	e.counter = newCallCounter(e.anchorTr)
	ac, err := anchorClient(agent.HTTPAddr(), e.counter)
	if err != nil {
		t.Fatal(err)
	}
	e.ac = ac
	_, port, _ := net.SplitHostPort(agent.HTTPAddr())
	p, _ := strconv.Atoi(port)
	e.pid = agentPID(p)
	return e
}

func (e *env) header(out *strings.Builder) {
	version := "unknown"
	if self, err := e.ac.Agent().Self(); err == nil {
		version = fmt.Sprint(self["Config"]["Version"])
	}
	apiVersion := "unknown"
	if mod, err := os.ReadFile(filepath.Join(brokertest.RepoRoot(e.t), "go.mod")); err == nil {
		for l := range strings.SplitSeq(string(mod), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "github.com/hashicorp/consul/api" {
				apiVersion = f[1]
			}
		}
	}
	host, _ := os.Hostname()
	fmt.Fprintf(out, "# lockbroker side-by-side bench (issue 12) — %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "# reproduce: %s   (= make bench)\n", reproduce)
	fmt.Fprintf(out, "# consul %s dev agent on %s (one agent for every row, http_max_conns_per_client = 1000; agent pid %d) · consul/api %s · %s %s/%s\n",
		version, e.agent.HTTPAddr(), e.pid, apiVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(out, "# machine %s: GOMAXPROCS=%d NumCPU=%d cpu %q; load average at start %s (the machine is shared)\n",
		host, runtime.GOMAXPROCS(0), runtime.NumCPU(), cpuModel(), loadAvg())
	fmt.Fprintf(out, "# tree: %s\n", treeState(e.t))
	if e.proc != nil {
		fmt.Fprintf(out, "# broker: the broker binary (cmd/broker, pid %d) in a process of its own, as deployed, on a loopback gRPC listener;\n", e.proc.pid)
	} else {
		out.WriteString("# broker: one in-process replica (internal/brokertest, -table.inprocess) on a loopback gRPC listener;\n")
	}
	out.WriteString("#   raw gen/lockbroker/v1 stubs over one connection; Acquire with default session options (no session field),\n")
	out.WriteString("#   Release with session + token, wait `released`. The Go client library row: client.Lock + Lease.Release on the\n")
	out.WriteString("#   same connection (a goroutine follows the stream; Release returns after `released`).\n")
	out.WriteString("# consul api: api.Lock / api.Semaphore as users write them: LockOpts/SemaphoreOpts{SessionTTL: 15s} per cycle (a fresh\n")
	out.WriteString("#   session each time, default lock-delay), Lock/Acquire then Unlock/Release; one api.Client, pooled transport (128 idle/host).\n")
	out.WriteString("# floor: KV acquire + KV release with one session kept across cycles (two Raft writes).\n")
	fmt.Fprintf(out, "# every row but stream-less and loss notice: each implementation measured in %d turns of n/%d, in alternating order\n", turns, turns)
	out.WriteString("#   (A B C, C B A, ...), so that a change of the machine's speed during the row weighs on all alike; turns merged.\n")
}

// run is one measured run of one implementation.
type run struct {
	lat latencies
	// part: in a hand-off, the holder's Release (Unlock) call alone.
	part      latencies
	n         int
	elapsed   time.Duration
	cpu       time.Duration // this process: the client (and with -table.inprocess, the broker)
	brokerCPU time.Duration // the broker process (broker rows, not -table.inprocess)
	hopCPU    time.Duration // the hop floor's relay process
	consulCPU time.Duration
	allocs    uint64 // this process, plus the broker process's for broker rows
	calls     map[string]uint64
	errs      errorLog
}

// turns is how many turns interleaved gives each implementation of a row.
const turns = 4

// interleaved measures the implementations of one row in turns, n cycles
// each in all, in the order A B C, C B A, A B C, C B A: a change of the
// machine's speed during the row (this machine is shared) then weighs on
// every implementation alike instead of on whichever ran last. It returns
// each implementation's turns merged into one run.
func interleaved(n int, impls ...func(n int) *run) []*run {
	out := make([]*run, len(impls))
	for i := range out {
		out[i] = &run{calls: map[string]uint64{}}
	}
	per := max(n/turns, 1)
	for t := range turns {
		for j := range impls {
			if t%2 == 1 {
				j = len(impls) - 1 - j
			}
			out[j].merge(impls[j](per))
		}
	}
	return out
}

// merge adds o's samples, counts and costs to r.
func (r *run) merge(o *run) {
	r.lat.merge(&o.lat)
	r.part.merge(&o.part)
	r.n += o.n
	r.elapsed += o.elapsed
	r.cpu += o.cpu
	r.brokerCPU += o.brokerCPU
	r.hopCPU += o.hopCPU
	r.consulCPU += o.consulCPU
	r.allocs += o.allocs
	for k, v := range o.calls {
		r.calls[k] += v
	}
	r.errs.merge(&o.errs)
}

func (r *run) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

func (r *run) perCycle(x float64) float64 {
	if r.n == 0 {
		return 0
	}
	return x / float64(r.n)
}

// cpuPer1k is CPU time d spread over r's cycles, in seconds per 1,000
// cycles, as the cost table prints it.
func (r *run) cpuPer1k(d time.Duration) string {
	return fmt.Sprintf("%.3f", r.perCycle(d.Seconds())*1000)
}

func (r *run) failed() bool { return r.errs.count() >= maxRowErrors }

func (e *env) consulCPU() time.Duration {
	_, c := statOf(e.pid)
	return c
}

func (e *env) calls(broker bool) map[string]uint64 {
	if broker {
		return e.store.OpCounts()
	}
	return e.counter.counts()
}

// quiet waits until neither the broker's nor the anchors' Consul call
// counts move for 300 ms (at most 3 s): the previous run's asynchronous
// work (session destroys, watches ending) is then out of the way.
func (e *env) quiet() {
	deadline := time.Now().Add(3 * time.Second)
	prev, stable := "", 0
	for time.Now().Before(deadline) && stable < 3 {
		cur := fmt.Sprint(e.store.OpCounts(), e.counter.counts())
		if cur == prev {
			stable++
		} else {
			stable = 0
		}
		prev = cur
		time.Sleep(100 * time.Millisecond)
	}
}

// measure runs body between two snapshots of the process's CPU and
// allocations, the agent's CPU and the Consul calls of the broker (broker
// true) or of the anchor client, and records the differences in r.
func (e *env) measure(r *run, broker bool, body func()) {
	e.quiet()
	e.anchorTr.CloseIdleConnections()
	runtime.GC()
	proc := e.proc
	if !broker {
		proc = nil
	}
	// The broker's allocations are read right next to the body, so that
	// exactly one /metrics scrape (the tail of the first, the head of the
	// second) falls between the two reads.
	calls0 := e.calls(broker)
	var bm0 uint64
	var bc0 time.Duration
	if proc != nil {
		var err error
		if bm0, err = proc.mallocs(); err != nil {
			r.errs.add(err)
		}
		bc0 = proc.cpu()
	}
	var h0 time.Duration
	if e.hopPid != 0 {
		_, h0 = statOf(e.hopPid)
	}
	c0, k0, m0 := processCPU(), e.consulCPU(), mallocs()
	t0 := time.Now()
	body()
	r.elapsed = time.Since(t0)
	r.cpu, r.consulCPU, r.allocs = processCPU()-c0, e.consulCPU()-k0, mallocs()-m0
	if e.hopPid != 0 {
		_, h1 := statOf(e.hopPid)
		r.hopCPU = h1 - h0
	}
	if proc != nil {
		r.brokerCPU = proc.cpu() - bc0
		bm1, err := proc.mallocs()
		switch {
		case err != nil:
			r.errs.add(err)
		case bm0 != 0 && bm1-bm0 > proc.scrapeAllocs:
			r.allocs += bm1 - bm0 - proc.scrapeAllocs
		}
	}
	r.calls = diffCounts(calls0, e.calls(broker))
}

// sequential runs n cycles one after another, after 20 warm-up cycles.
func (e *env) sequential(n int, broker bool, cycle func(i int) error) *run {
	r := &run{}
	for i := range 20 {
		_ = cycle(-1 - i)
	}
	e.measure(r, broker, func() {
		for i := range n {
			if r.failed() {
				return
			}
			t0 := time.Now()
			if err := cycle(i); err != nil {
				r.errs.add(err)
				continue
			}
			r.lat.add(time.Since(t0))
			r.n++
		}
	})
	return r
}

// parallel runs per cycles on each of clients goroutines; mk gives client c
// its cycle and cleanup. One warm-up cycle per client runs before the
// clock starts.
func (e *env) parallel(clients, per int, broker bool, mk func(c int) (func() error, func())) *run {
	r := &run{}
	cycles := make([]func() error, clients)
	for c := range clients {
		cycle, done := mk(c)
		defer done()
		cycles[c] = cycle
		_ = cycle()
	}
	var mu sync.Mutex
	e.measure(r, broker, func() {
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for range per {
					if r.failed() {
						return
					}
					t0 := time.Now()
					if err := cycles[c](); err != nil {
						r.errs.add(err)
						continue
					}
					r.lat.add(time.Since(t0))
					mu.Lock()
					r.n++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	})
	return r
}

// shared runs total cycles shared among clients goroutines.
func (e *env) shared(clients, total int, broker bool, cycle func(c int) error) *run {
	r := &run{}
	var mu sync.Mutex
	next := 0
	e.measure(r, broker, func() {
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for !r.failed() {
					mu.Lock()
					if next >= total {
						mu.Unlock()
						return
					}
					next++
					mu.Unlock()
					t0 := time.Now()
					if err := cycle(c); err != nil {
						r.errs.add(err)
						continue
					}
					r.lat.add(time.Since(t0))
					mu.Lock()
					r.n++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	})
	return r
}

func (e *env) newFloor() *floor {
	f, err := newFloor(e.ac)
	if err != nil {
		e.t.Fatalf("floor session: %v", err)
	}
	return f
}

// brokerHandoff measures Release → the queued waiter's `acquired` through
// bd: the broker (broker true: its process's figures are read) or the hop
// floor's relay; name keeps their keys apart.
func (e *env) brokerHandoff(bd brokerDriver, broker bool, name string, n int) *run {
	r := &run{}
	gen := 0
	key := func() string { return fmt.Sprintf("bench/handoff/%s/%d", name, gen) }
	holder, err := bd.acquire(key(), 0)
	if err != nil {
		e.t.Fatalf("hand-off holder: %v", err)
	}
	fail := func(err error, w *brokerHold) {
		r.errs.add(err)
		holder.cancel()
		if w != nil {
			w.cancel()
		}
		gen++
		if holder, err = bd.acquire(key(), 0); err != nil {
			e.t.Fatalf("hand-off holder: %v", err)
		}
	}
	e.measure(r, broker, func() {
		for range n {
			if r.failed() {
				return
			}
			w, err := bd.open(key(), 0)
			if err != nil {
				fail(err, nil)
				continue
			}
			if _, err := w.until(isQueued); err != nil {
				fail(err, w)
				continue
			}
			// The waiter reads its stream on a goroutine of its own and
			// notes when `acquired` came, as apiHandoff's waiter notes when
			// Lock returned: the holder's Release call may return after.
			got := make(chan acquiredAt, 1)
			go func() {
				resp, err := w.until(isAcquired)
				got <- acquiredAt{resp, time.Now(), err}
			}()
			time.Sleep(*handoffSettle)
			t0 := time.Now()
			if err := bd.release(holder); err != nil {
				fail(err, w) // ends the waiter's read too
				<-got
				continue
			}
			r.part.add(time.Since(t0))
			a := <-got
			if a.err != nil {
				fail(a.err, w)
				continue
			}
			r.lat.add(a.at.Sub(t0))
			r.n++
			w.seq = a.resp.GetAcquired().GetSequencer()
			if _, err := holder.until(isReleased); err != nil {
				r.errs.add(fmt.Errorf("old holder: %w", err))
			}
			holder.cancel()
			holder = w
		}
	})
	if err := bd.releaseAndWait(holder); err != nil {
		r.errs.add(err)
	}
	return r
}

// acquiredAt is a waiter's `acquired` and when its stream delivered it.
type acquiredAt struct {
	resp *lockbrokerv1.AcquireResponse
	at   time.Time
	err  error
}

// apiHandoff measures Unlock → the waiting api.Lock's Lock returning.
func (e *env) apiHandoff(n int) *run {
	r := &run{}
	const key = "bench/handoff/api"
	holder, err := e.ac.LockOpts(apiLockOpts(key))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := holder.Lock(nil); err != nil {
		e.t.Fatalf("hand-off holder: %v", err)
	}
	e.measure(r, false, func() {
		for range n {
			if r.failed() {
				return
			}
			w, err := e.ac.LockOpts(apiLockOpts(key))
			if err != nil {
				r.errs.add(err)
				continue
			}
			got := make(chan error, 1)
			var at time.Time
			stop := make(chan struct{})
			go func() {
				_, err := w.Lock(stop)
				at = time.Now()
				got <- err
			}()
			time.Sleep(*handoffSettle)
			t0 := time.Now()
			if err := holder.Unlock(); err != nil {
				r.errs.add(err)
			}
			r.part.add(time.Since(t0))
			select {
			case err = <-got:
			case <-time.After(opTimeout):
				close(stop)
				err = <-got
				if err == nil {
					err = fmt.Errorf("api.Lock hand-off: not acquired within %s", opTimeout)
				}
			}
			if err != nil {
				r.errs.add(err)
				return
			}
			r.lat.add(at.Sub(t0))
			r.n++
			holder = w
		}
	})
	_ = holder.Unlock()
	return r
}

// streamless measures TryAcquire and then Release with a client-owned
// session created once.
func (e *env) streamless(n int) (try, rel *latencies) {
	try, rel = &latencies{}, &latencies{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs, err := e.bd.sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{})
	if err != nil {
		e.t.Fatalf("create session: %v", err)
	}
	id := cs.GetSession().GetId()
	defer func() { _, _ = e.bd.sessions.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: id}) }()
	var prevToken uint64
	e.measure(e.streamErrs, true, func() {
		for i := range n {
			if e.streamErrs.failed() {
				return
			}
			if i%20 == 0 { // a client-owned session is the client's to renew
				if _, err := e.bd.sessions.RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: id}); err != nil {
					e.streamErrs.errs.add(err)
				}
			}
			key := "bench/streamless"
			t0 := time.Now()
			ta, err := e.bd.locks.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{Key: key, SessionId: id})
			if err != nil {
				e.streamErrs.errs.add(fmt.Errorf("TryAcquire: %w", err))
				continue
			}
			t1 := time.Now()
			rr, err := e.bd.locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: id, Token: ta.GetSequencer().GetToken()})
			t2 := time.Now()
			if err != nil {
				e.streamErrs.errs.add(fmt.Errorf("release: %w", err))
				continue
			}
			if !rr.GetReleased() {
				e.streamErrs.errs.add(e.explainNotReleased(key, id, ta.GetSequencer(), prevToken))
			}
			prevToken = ta.GetSequencer().GetToken()
			try.add(t1.Sub(t0))
			rel.add(t2.Sub(t1))
			e.streamErrs.lat.add(t2.Sub(t0))
			e.streamErrs.n++
		}
	})
	return try, rel
}

// explainNotReleased describes a Release that answered released=false
// right after TryAcquire granted seq: what Consul holds at the key now
// (consistent read).
func (e *env) explainNotReleased(key, session string, seq *lockbrokerv1.Sequencer, prevToken uint64) error {
	kv, _, err := e.ac.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	now := "absent"
	switch {
	case err != nil:
		now = err.Error()
	case kv != nil:
		now = fmt.Sprintf("session %q (ours: %v) LockIndex %d ModifyIndex %d", kv.Session, kv.Session == session, kv.LockIndex, kv.ModifyIndex)
	}
	return fmt.Errorf("release after TryAcquire (token %d, LockIndex %d, previous grant's token %d): released=false; key now: %s",
		seq.GetToken(), seq.GetLockIndex(), prevToken, now)
}

// lossRuns are the loss-notice rows' runs: api.Lock, and the broker's
// holds destroyed right after the grant, at ages spread evenly over
// [0, lossAge) (issue 41: a hold under 500 ms old heard of its loss 200 ms
// late, whatever the first row said), and lossAge old.
type lossRuns struct{ api, fresh, spread, aged *run }

func (e *env) lossRuns(n int) lossRuns {
	return lossRuns{
		api:    e.apiLoss(n),
		fresh:  e.brokerLoss(n, "fresh", func(int) time.Duration { return 0 }),
		spread: e.brokerLoss(n, "spread", func(i int) time.Duration { return time.Duration(i) * lossAge / time.Duration(n) }),
		aged:   e.brokerLoss(n, "aged", func(int) time.Duration { return lossAge }),
	}
}

// rows adds the loss-notice rows with lat (see TestBenchTable).
func (l lossRuns) rows(lat func(name string, br, ap, fl *latencies, q float64, target string)) {
	lat(fmt.Sprintf("loss notice p50 ms (n=%d)", l.fresh.n), &l.fresh.lat, &l.api.lat, nil, 0.5, "≤1000 ms")
	lat("loss notice p99 ms", &l.fresh.lat, &l.api.lat, nil, 0.99, "≤20 ms (issue 41)")
	lat(fmt.Sprintf("loss notice, hold 0-%s old (spread), p50 ms (n=%d)", lossAge, l.spread.n), &l.spread.lat, &l.api.lat, nil, 0.5, "")
	lat(fmt.Sprintf("loss notice, hold 0-%s old (spread), p99 ms", lossAge), &l.spread.lat, &l.api.lat, nil, 0.99, "≤20 ms (issue 41)")
	lat(fmt.Sprintf("loss notice, hold %s old, p50 ms (n=%d)", lossAge, l.aged.n), &l.aged.lat, &l.api.lat, nil, 0.5, "≤1000 ms")
	lat(fmt.Sprintf("loss notice, hold %s old, p99 ms", lossAge), &l.aged.lat, &l.api.lat, nil, 0.99, "≤20 ms (issue 41)")
}

// lossNotes says what the loss-notice rows measure, and the reasons the
// broker gave.
func (e *env) lossNotes(out *strings.Builder) {
	out.WriteString("# loss notice: session destroyed with a plain Consul call → `lost` on the stream / api.Lock's leaderCh closed;\n")
	out.WriteString("#   first rows right after the grant (a hold's watch starts 200ms after its grant unless it waits; until then a\n")
	out.WriteString("#   read-only transaction checks its key every 5 ms), then on holds\n")
	fmt.Fprintf(out, "#   0-%s old (sample i of n at i/n of it), then %s old.\n", lossAge, lossAge)
	reasons := slices.Sorted(maps.Keys(e.lossReasons))
	var rs []string
	for _, r := range reasons {
		rs = append(rs, fmt.Sprintf("%s×%d", r, e.lossReasons[r]))
	}
	out.WriteString("# broker loss reasons: " + strings.Join(rs, ", ") + "\n")
}

// TestBenchLossNotice prints the table's loss-notice rows alone (-loss):
// `go test -count=1 -run TestBenchLossNotice -v ./test/bench/ -args -loss`.
func TestBenchLossNotice(t *testing.T) {
	if !*lossOnly {
		t.Skip("run with -loss")
	}
	e := newEnv(t)
	var out strings.Builder
	e.header(&out)
	loss := e.lossRuns(*tableLoss)
	var tb textTable
	tb.add("figure", "broker", "consul api", "floor", "broker/api", "broker/floor", "target")
	loss.rows(func(name string, br, ap, _ *latencies, q float64, target string) {
		b, a := qOf(br, q), qOf(ap, q)
		tb.add(name, fmtMs(b), fmtMs(a), "-", ratio(b, a), "-", target)
	})
	out.WriteString(tb.String())
	e.lossNotes(&out)
	for name, r := range map[string]*run{"api.Lock": loss.api, "fresh": loss.fresh, "spread": loss.spread, "aged": loss.aged} {
		if r.errs.count() > 0 {
			fmt.Fprintf(&out, "# ERRORS %s: %s\n", name, r.errs.String())
		}
	}
	fmt.Print(out.String())
}

// brokerLoss measures Consul session destroy → `lost` on the stream, each
// sample on a fresh key (the destroyed session's lock-delay blocks the
// key), destroyed age(i) after the grant.
func (e *env) brokerLoss(n int, name string, age func(i int) time.Duration) *run {
	r := &run{}
	e.measure(r, true, func() {
		for i := range n {
			if r.failed() {
				return
			}
			h, err := e.bd.acquire(fmt.Sprintf("bench/loss/broker/%s/%d", name, i), 0)
			if err != nil {
				r.errs.add(err)
				continue
			}
			time.Sleep(age(i))
			t0 := time.Now()
			if _, err := e.ac.Session().Destroy(h.seq.GetSessionId(), nil); err != nil {
				r.errs.add(err)
				h.cancel()
				continue
			}
			resp, err := h.until(isLost)
			h.cancel()
			if err != nil {
				r.errs.add(err)
				continue
			}
			r.lat.add(time.Since(t0))
			r.n++
			e.lossReasons[resp.GetLost().GetReason().String()]++
		}
	})
	return r
}

// apiLoss measures Consul session destroy → api.Lock's leaderCh closed.
func (e *env) apiLoss(n int) *run {
	r := &run{}
	e.measure(r, false, func() {
		for i := range n {
			if r.failed() {
				return
			}
			key := fmt.Sprintf("bench/loss/api/%d", i)
			l, err := e.ac.LockOpts(apiLockOpts(key))
			if err != nil {
				r.errs.add(err)
				continue
			}
			lost, err := l.Lock(nil)
			if err != nil {
				r.errs.add(err)
				continue
			}
			kv, _, err := e.ac.KV().Get(key, nil)
			if err != nil || kv == nil {
				r.errs.add(fmt.Errorf("read %s: %v", key, err))
				_ = l.Unlock()
				continue
			}
			t0 := time.Now()
			if _, err := e.ac.Session().Destroy(kv.Session, nil); err != nil {
				r.errs.add(err)
			}
			select {
			case <-lost:
				r.lat.add(time.Since(t0))
				r.n++
			case <-time.After(opTimeout):
				r.errs.add(fmt.Errorf("api.Lock %s: leaderCh not closed within %s", key, opTimeout))
			}
			_ = l.Unlock()
		}
	})
	return r
}

// treeState names the commit under test and whether the broker's sources
// differ from it (the numbers belong to the working tree).
func treeState(t testing.TB) string {
	root := brokertest.RepoRoot(t)
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	dirty, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--", "internal", "gen", "proto").Output()
	state := "clean"
	if n := len(strings.FieldsFunc(string(dirty), func(r rune) bool { return r == '\n' })); n > 0 {
		state = fmt.Sprintf("%d uncommitted change(s) under internal/ gen/ proto/", n)
	}
	return fmt.Sprintf("HEAD %s, %s", strings.TrimSpace(string(head)), state)
}

func qOf(l *latencies, q float64) time.Duration {
	if l == nil {
		return 0
	}
	return l.quantile(q)
}

func fmtMs(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", msOf(d))
}

func fmtRate(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r)
}

func ratio(a, b time.Duration) string { return ratioF(float64(a), float64(b)) }

func ratioF(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
