package bench

import (
	"testing"
	"time"

	"github.com/lockbroker/lockbroker/internal/consultest"
)

// BenchmarkCycle is the uncontended cycle of TestBenchTable as a Go
// benchmark, for profiling (go test -run '^$' -bench Cycle/broker
// -benchtime 2000x -cpuprofile cpu.out ./test/bench/): the broker (raw
// stubs, in-process replica), api.Lock and the raw floor on one agent. It
// reports allocations (whole process) and p50/p99 in ms.
func BenchmarkCycle(b *testing.B) {
	agent := consultest.Start(b)
	r := startBroker(b, agent)
	conn := r.Conn(b)
	bd := newDriver(conn)
	ac, err := anchorClient(agent.HTTPAddr(), newCallCounter(pooledTransport()))
	if err != nil {
		b.Fatal(err)
	}
	fl, err := newFloor(ac)
	if err != nil {
		b.Fatal(err)
	}
	defer fl.close(ac)
	for _, bm := range []struct {
		name  string
		cycle func() error
	}{
		{"broker", func() error { return bd.cycle("bench/cycle/broker", 0) }},
		{"api.Lock", func() error { return apiLockCycle(ac, "bench/cycle/api") }},
		{"floor", func() error { return fl.cycle("bench/cycle/floor") }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			var lat latencies
			for b.Loop() {
				t0 := time.Now()
				if err := bm.cycle(); err != nil {
					b.Fatal(err)
				}
				lat.add(time.Since(t0))
			}
			b.ReportMetric(msOf(lat.p50()), "p50-ms")
			b.ReportMetric(msOf(lat.p99()), "p99-ms")
		})
	}
}

// BenchmarkHandOff is the table's broker hand-off as a Go benchmark, for
// profiling and for counting its allocations, which a loaded machine does
// not change (go test -run '^$' -bench HandOff -benchtime 300x -benchmem
// -cpuprofile cpu.out ./test/bench/): an in-process replica; each
// iteration queues a waiter behind the holder (until `queued`), leaves it
// -table.settle, and releases the holder, which hands the lock over. The
// iteration's time includes the settle; p50-ms and p99-ms are the
// table's figure (Release call → the waiter's `acquired`), allocs/op the
// whole process's (broker, client and Consul client) per iteration.
func BenchmarkHandOff(b *testing.B) {
	agent := consultest.Start(b)
	r := startBroker(b, agent)
	bd := newDriver(r.Conn(b))
	const key = "bench/handoff/gobench"
	holder, err := bd.acquire(key, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = bd.releaseAndWait(holder) }()
	var lat latencies
	b.ReportAllocs()
	for b.Loop() {
		w, err := bd.open(key, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := w.until(isQueued); err != nil {
			b.Fatal(err)
		}
		got := make(chan acquiredAt, 1)
		go func() {
			resp, err := w.until(isAcquired)
			got <- acquiredAt{resp, time.Now(), err}
		}()
		time.Sleep(*handoffSettle)
		t0 := time.Now()
		if err := bd.release(holder); err != nil {
			b.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			b.Fatal(a.err)
		}
		lat.add(a.at.Sub(t0))
		w.seq = a.resp.GetAcquired().GetSequencer()
		if _, err := holder.until(isReleased); err != nil {
			b.Fatal(err)
		}
		holder.cancel()
		holder = w
	}
	b.ReportMetric(msOf(lat.p50()), "p50-ms")
	b.ReportMetric(msOf(lat.p99()), "p99-ms")
}
