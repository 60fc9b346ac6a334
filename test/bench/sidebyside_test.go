package bench

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/server"
)

var (
	sideBySide = flag.Bool("sidebyside", false, "run TestSideBySide")
	sbsWorkers = flag.Uint("sidebyside.workers", 0, "stream workers of replica B (A has the default)")
	sbsRounds  = flag.Int("sidebyside.rounds", 300, "rounds; each has a cycle and a hand-off on each replica")
	sbsSettle  = flag.Duration("sidebyside.settle", 20*time.Millisecond, "how long a hand-off waiter is left queued")
)

// TestSideBySide measures two replicas on one agent in this process that
// differ in their server's stream workers (A: the default, B:
// -sidebyside.workers), with calls alternated between them so that both
// see the same machine: warm cycles (blocks of 20), cycles right after a
// hand-off's pause, and hand-offs. It prints p50s and B−A.
//
//	go test -run TestSideBySide -v ./test/bench/ -args -sidebyside -sidebyside.workers 0
func TestSideBySide(t *testing.T) {
	if !*sideBySide {
		t.Skip("run with -sidebyside")
	}
	agent := consultest.Start(t)
	pool := brokertest.WithBrokerOptions(broker.WithSessionPool())
	replicas := []*brokertest.Replica{
		brokertest.Start(t, agent, pool),
		brokertest.Start(t, agent, pool, brokertest.WithServerOptions(server.WithStreamWorkers(uint32(*sbsWorkers)))),
	}
	waitPool(t, agent)
	var ds [2]brokerDriver
	for i, r := range replicas {
		c := r.Conn(t)
		ds[i] = newDriver(c)
	}
	var warm, cold, handoff [2]latencies
	timed := func(l *latencies, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			t.Fatal(err)
		}
		l.add(time.Since(t0))
	}
	for i := range *sbsRounds / 10 {
		for k := range 2 {
			j := (i + k) % 2
			for range 20 {
				timed(&warm[j], func() error { return ds[j].cycle(fmt.Sprintf("sbs/%d/warm", j), 0) })
			}
		}
	}
	for i := range *sbsRounds {
		for k := range 2 {
			j := (i + k) % 2
			timed(&cold[j], func() error { return ds[j].cycle(fmt.Sprintf("sbs/%d/cold", j), 0) })
			handoff[j].add(sbsHandoff(t, ds[j], fmt.Sprintf("sbs/%d/handoff", j)))
			time.Sleep(2 * time.Millisecond)
		}
	}
	fmt.Printf("side by side, A: default stream workers, B: %d; p50 ms (n), B−A µs\n", *sbsWorkers)
	for _, row := range []struct {
		name string
		l    *[2]latencies
	}{{"warm cycle", &warm}, {"cycle after a pause", &cold}, {fmt.Sprintf("hand-off, %s idle", *sbsSettle), &handoff}} {
		a, b := row.l[0].p50(), row.l[1].p50()
		fmt.Printf("  %-22s A %.3f  B %.3f  (n=%d)  B−A %+.0f µs\n", row.name, msOf(a), msOf(b), row.l[0].len(), float64(b-a)/float64(time.Microsecond))
	}
}

// sbsHandoff takes key, queues a waiter, leaves it -sidebyside.settle, and
// returns the time from the holder's Release to the waiter's `acquired`.
func sbsHandoff(t *testing.T, d brokerDriver, key string) time.Duration {
	h, err := d.acquire(key, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer h.cancel()
	w, err := d.open(key, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.cancel()
	if _, err := w.until(isQueued); err != nil {
		t.Fatal(err)
	}
	time.Sleep(*sbsSettle)
	t0 := time.Now()
	if err := d.release(h); err != nil {
		t.Fatal(err)
	}
	if _, err := w.until(isAcquired); err != nil {
		t.Fatal(err)
	}
	return time.Since(t0)
}
