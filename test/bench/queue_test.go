package bench

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	queueBench   = flag.Bool("queue", false, "run TestBenchQueue (make bench runs it)")
	queueClients = flag.Int("queue.clients", 2, "clients per replica on the contended key (three replicas)")
	queueGrants  = flag.Int("queue.grants", 600, "grants of the contended key per implementation")
	queueWaiters = flag.Int("queue.waiters", 30, "waiters queued over three replicas in the Consul-writes rows")
)

// queueReplicas is how many broker processes share the contended key.
const queueReplicas = 3

// TestBenchQueue prints issue 40's rows, three broker binaries on one
// agent against api.Lock on the same agent:
//   - a contended key over three replicas: clients on every replica
//     Acquire, Release at once and Acquire again; hand-offs/s, p50/p99
//     wait, and the grants each replica's clients got;
//   - Consul writes per queued waiter: a holder on replica 1, then
//     waiters over the three replicas until each has said `queued` with
//     its place (api.Lock: Lock called and left 1 s);
//   - Consul writes per hand-off: those waiters then take the key in
//     turn, each releasing at once;
//   - the same two rows for a limit-1 semaphore (broker only).
//
// Writes are what makes a Raft entry (sessions created and destroyed, KV
// writes and transactions); every call is listed by kind.
//
//	go test -count=1 -run TestBenchQueue -v ./test/bench/ -args -queue
func TestBenchQueue(t *testing.T) {
	if !*queueBench {
		t.Skip("run with -queue (make bench)")
	}
	agent := consultest.Start(t, consultest.WithHCL(`limits { http_max_conns_per_client = 1000 }`))
	var ds []brokerDriver
	var ps []*brokerProcess
	for range queueReplicas {
		d, p := startProcess(t, agent, nil)
		ds, ps = append(ds, d), append(ps, p)
	}
	waitPool(t, agent)
	counter := newCallCounter(pooledTransport())
	ac, err := anchorClient(agent.HTTPAddr(), counter)
	if err != nil {
		t.Fatal(err)
	}
	q := &queueEnv{t: t, ds: ds, ps: ps, ac: ac, counter: counter}

	clients := queueReplicas * *queueClients
	brC := q.contendedBroker("bench/queue/hot/broker", clients, *queueGrants)
	apC := q.contendedAPI("bench/queue/hot/api", clients, *queueGrants)
	brQ, brH := q.brokerQueue("bench/queue/line/broker", *queueWaiters, 0)
	semQ, semH := q.brokerQueue("bench/queue/line/semaphore", *queueWaiters, 1)
	apQ, apH := q.apiQueue("bench/queue/line/api", *queueWaiters)

	var out strings.Builder
	fmt.Fprintf(&out, "# lockbroker shared-queue bench (issue 40) — %s; load average at start of the table %s\n", time.Now().UTC().Format(time.RFC3339), loadAvg())
	out.WriteString("# reproduce: go test -count=1 -run TestBenchQueue -v ./test/bench/ -args -queue   (make bench runs it)\n")
	fmt.Fprintf(&out, "# %d broker binaries (default options, session pool on) on one consul dev agent; api.Lock as users write it\n", queueReplicas)
	out.WriteString("#   (a fresh session per Lock, SessionTTL 15s), one api.Client.\n")
	var tb textTable
	tb.add("figure", "broker", "consul api", "broker/api")
	tb.add(fmt.Sprintf("contended key, %d replicas × %d clients, hand-offs/s (n=%d)", queueReplicas, *queueClients, brC.n),
		fmtRate(brC.rate()), fmtRate(apC.rate()), ratioF(brC.rate(), apC.rate()))
	tb.add("contended key: wait (Acquire → acquired) p50 ms", fmtMs(brC.lat.p50()), fmtMs(apC.lat.p50()), ratio(brC.lat.p50(), apC.lat.p50()))
	tb.add("contended key: wait p99 ms", fmtMs(brC.lat.p99()), fmtMs(apC.lat.p99()), ratio(brC.lat.p99(), apC.lat.p99()))
	tb.add("contended key: wait max ms", fmtMs(brC.lat.quantile(1)), fmtMs(apC.lat.quantile(1)), "-")
	tb.add("contended key: grants by replica (broker) / by client (api)", brC.share, apC.share, "-")
	tb.add(fmt.Sprintf("Consul writes per queued waiter (n=%d)", brQ.n), fmt.Sprintf("%.2f", brQ.writes()), fmt.Sprintf("%.2f", apQ.writes()), "-")
	tb.add(fmt.Sprintf("Consul writes per hand-off (n=%d)", brH.n), fmt.Sprintf("%.2f", brH.writes()), fmt.Sprintf("%.2f", apH.writes()), "-")
	tb.add(fmt.Sprintf("Consul writes per queued semaphore waiter, limit 1 (n=%d)", semQ.n), fmt.Sprintf("%.2f", semQ.writes()), "-", "-")
	tb.add(fmt.Sprintf("Consul writes per semaphore hand-off, limit 1 (n=%d)", semH.n), fmt.Sprintf("%.2f", semH.writes()), "-", "-")
	tb.add("Consul writes per contended grant", fmt.Sprintf("%.2f", brC.writes()), fmt.Sprintf("%.2f", apC.writes()), "-")
	out.WriteString(tb.String())
	var cost textTable
	cost.add("Consul calls", "per", "broker (all replicas), by kind", "api.Lock, by kind")
	cost.add("queued waiter", "waiter", perCycle(brQ.calls, brQ.n), perCycle(apQ.calls, apQ.n))
	cost.add("hand-off", "grant", perCycle(brH.calls, brH.n), perCycle(apH.calls, apH.n))
	cost.add("queued semaphore waiter", "waiter", perCycle(semQ.calls, semQ.n), "-")
	cost.add("semaphore hand-off", "grant", perCycle(semH.calls, semH.n), "-")
	cost.add("contended key", "grant", perCycle(brC.calls, brC.n), perCycle(apC.calls, apC.n))
	out.WriteString("#\n")
	out.WriteString(cost.String())
	out.WriteString("# writes: session_create, session_destroy, kv_txn_write and KV acquire/release/put/cas/delete; renewals, reads and\n")
	out.WriteString("#   blocking queries are listed by kind only. Broker calls: the three processes' lockbroker_consul_requests_total.\n")
	out.WriteString("# contended key: every client Acquires, Releases (with its token) as soon as it has the key, and Acquires again;\n")
	out.WriteString("#   wait = Acquire call → `acquired` (api.Lock: Lock call → return).\n")
	fmt.Fprintf(&out, "# queued waiter: a holder on replica 1, then %d waiters over the replicas in turn, each until `queued` with its\n", *queueWaiters)
	out.WriteString("#   place (api.Lock: Lock called, then 1 s); hand-off: the holder releases, each waiter releases once it has the key.\n")
	out.WriteString("#   The semaphore rows do the same with a limit-1 semaphore (broker only).\n")
	for _, x := range []struct {
		name string
		r    *queueRun
	}{{"contended broker", brC}, {"contended api.Lock", apC}, {"queue broker", brQ}, {"queue api.Lock", apQ}, {"hand-off broker", brH}, {"hand-off api.Lock", apH}, {"queue semaphore", semQ}, {"hand-off semaphore", semH}} {
		if x.r.errs.count() > 0 {
			fmt.Fprintf(&out, "# ERRORS %s: %s\n", x.name, x.r.errs.String())
		}
	}
	fmt.Fprintf(&out, "# load average at end %s\n", loadAvg())
	fmt.Print(out.String())
}

// queueEnv is the agent, the replicas and the anchor client.
type queueEnv struct {
	t       *testing.T
	ds      []brokerDriver
	ps      []*brokerProcess
	ac      *api.Client
	counter *callCounter
}

// queueRun is one measured row.
type queueRun struct {
	lat     latencies
	n       int
	elapsed time.Duration
	calls   map[string]uint64
	share   string // grants by replica or client
	errs    errorLog
}

func (r *queueRun) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

// writeKinds are the calls that make a Raft entry.
var writeKinds = map[string]bool{"session_create": true, "session_destroy": true, "kv_txn_write": true, "kv_txn": true,
	"kv_acquire": true, "kv_release": true, "kv_put": true, "kv_cas": true, "kv_delete": true}

// writes is the row's writes per grant (or waiter).
func (r *queueRun) writes() float64 {
	if r.n == 0 {
		return 0
	}
	var w uint64
	for k, v := range r.calls {
		if writeKinds[k] {
			w += v
		}
	}
	return float64(w) / float64(r.n)
}

// brokerCalls sums the replicas' Consul calls by kind.
func (q *queueEnv) brokerCalls() map[string]uint64 {
	out := map[string]uint64{}
	for _, p := range q.ps {
		for k, v := range p.OpCounts() {
			out[k] += v
		}
	}
	return out
}

// settle waits until the counts calls returns stop moving for 300 ms (at
// most 3 s).
func settle(calls func() map[string]uint64) map[string]uint64 {
	deadline := time.Now().Add(3 * time.Second)
	prev, stable := calls(), 0
	for time.Now().Before(deadline) && stable < 3 {
		time.Sleep(100 * time.Millisecond)
		cur := calls()
		if fmt.Sprint(cur) == fmt.Sprint(prev) {
			stable++
		} else {
			stable = 0
		}
		prev = cur
	}
	return prev
}

// contendedBroker runs clients over the replicas on one key until grants
// grants: each Acquires, Releases at once, and Acquires again.
func (q *queueEnv) contendedBroker(key string, clients, grants int) *queueRun {
	return q.contended(clients, grants, queueReplicas, q.brokerCalls, func(c int) (time.Duration, error) {
		d := q.ds[c%queueReplicas]
		t0 := time.Now()
		h, err := d.acquire(key, 0)
		if err != nil {
			return 0, err
		}
		wait := time.Since(t0)
		return wait, d.releaseAndWait(h)
	})
}

// contendedAPI is contendedBroker with api.Lock clients.
func (q *queueEnv) contendedAPI(key string, clients, grants int) *queueRun {
	return q.contended(clients, grants, clients, q.counter.counts, func(int) (time.Duration, error) {
		l, err := q.ac.LockOpts(apiLockOpts(key))
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		if _, err := l.Lock(nil); err != nil {
			return 0, err
		}
		wait := time.Since(t0)
		return wait, l.Unlock()
	})
}

// contended runs clients goroutines until grants grants, each calling
// grant (take the key, let it go: the wait, and an error) again and
// again; client c's grants count for share c%shares. calls reads the
// Consul calls.
func (q *queueEnv) contended(clients, grants, shares int, calls func() map[string]uint64, grant func(c int) (time.Duration, error)) *queueRun {
	r := &queueRun{}
	by := make([]atomic.Int64, shares)
	var left atomic.Int64
	left.Store(int64(grants))
	var mu sync.Mutex
	c0 := settle(calls)
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 && r.errs.count() < maxRowErrors {
				wait, err := grant(c)
				if wait == 0 {
					r.errs.add(err)
					continue
				}
				mu.Lock()
				r.lat.add(wait)
				r.n++
				mu.Unlock()
				by[c%shares].Add(1)
				if err != nil {
					r.errs.add(err)
				}
			}
		})
	}
	wg.Wait()
	r.elapsed = time.Since(t0)
	r.calls = diffCounts(c0, settle(calls))
	var parts []string
	for i := range by {
		parts = append(parts, fmt.Sprint(by[i].Load()))
	}
	r.share = strings.Join(parts, " / ")
	return r
}

// brokerQueue queues waiters behind a holder on replica 1, then lets
// them take the key in turn; it returns both phases.
func (q *queueEnv) brokerQueue(key string, waiters int, limit uint32) (queued, handed *queueRun) {
	queued, handed = &queueRun{}, &queueRun{}
	holder, err := q.ds[0].acquire(key, limit)
	if err != nil {
		q.t.Fatalf("queue holder: %v", err)
	}
	c0 := settle(q.brokerCalls)
	var ws []*brokerHold
	for i := range waiters {
		w, err := q.ds[i%queueReplicas].open(key, limit)
		if err == nil {
			_, err = w.until(func(r *lockbrokerv1.AcquireResponse) bool { return isQueued(r) && r.GetQueued().GetPosition() > 0 })
		}
		if err != nil {
			queued.errs.add(err)
			if w != nil {
				w.cancel()
			}
			continue
		}
		ws = append(ws, w)
		queued.n++
	}
	c1 := settle(q.brokerCalls)
	queued.calls = diffCounts(c0, c1)
	// Each waiter releases as soon as it has the key: the next hand-off.
	var wg sync.WaitGroup
	for i, w := range ws {
		d := q.ds[i%queueReplicas]
		wg.Go(func() {
			defer w.cancel()
			resp, err := w.until(isAcquired)
			if err != nil {
				handed.errs.add(err)
				return
			}
			w.seq = resp.GetAcquired().GetSequencer()
			if err := d.release(w); err != nil {
				handed.errs.add(err)
			}
		})
	}
	t0 := time.Now()
	if err := q.ds[0].releaseAndWait(holder); err != nil {
		handed.errs.add(err)
	}
	wg.Wait()
	handed.elapsed = time.Since(t0)
	handed.n = len(ws)
	handed.calls = diffCounts(c1, settle(q.brokerCalls))
	return queued, handed
}

// apiQueue is brokerQueue with api.Lock: a waiter's Lock is called and
// left 1 s (api.Lock cannot say it is waiting).
func (q *queueEnv) apiQueue(key string, waiters int) (queued, handed *queueRun) {
	queued, handed = &queueRun{}, &queueRun{}
	holder, err := q.ac.LockOpts(apiLockOpts(key))
	if err != nil {
		q.t.Fatal(err)
	}
	if _, err := holder.Lock(nil); err != nil {
		q.t.Fatalf("api.Lock queue holder: %v", err)
	}
	c0 := settle(q.counter.counts)
	got := make(chan *api.Lock, waiters)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range waiters {
		l, err := q.ac.LockOpts(apiLockOpts(key))
		if err != nil {
			queued.errs.add(err)
			continue
		}
		queued.n++
		wg.Go(func() {
			if _, err := l.Lock(stop); err != nil {
				handed.errs.add(err)
				return
			}
			got <- l
		})
	}
	time.Sleep(time.Second)
	c1 := q.counter.counts()
	queued.calls = diffCounts(c0, c1)
	t0 := time.Now()
	if err := holder.Unlock(); err != nil {
		handed.errs.add(err)
	}
	for range queued.n {
		select {
		case l := <-got:
			if err := l.Unlock(); err != nil {
				handed.errs.add(err)
			}
			handed.n++
			continue
		case <-time.After(opTimeout):
			handed.errs.add(fmt.Errorf("api.Lock hand-off: no waiter got %s within %s", key, opTimeout))
		}
		break
	}
	handed.elapsed = time.Since(t0)
	close(stop) // after an error: the waiters left give up
	wg.Wait()
	close(got)
	for l := range got {
		_ = l.Unlock()
	}
	handed.calls = diffCounts(c1, settle(q.counter.counts))
	return queued, handed
}
