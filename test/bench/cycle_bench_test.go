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
