package bench

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	scale         = flag.Bool("scale", false, "run TestScale (make bench runs it)")
	scaleHolds    = flag.Int("scale.holds", 10000, "concurrent holds for TestScale")
	scaleWatchers = flag.Int("scale.watchers", 1000, "watchers for TestScale")
)

// TestScale measures one replica holding many locks and serving many
// watchers (DESIGN.md: 10,000 holds and 1,000 watchers within Consul's 200
// connections per client). It prints figures; it asserts only that every
// hold was granted and that loss is still detected.
func TestScale(t *testing.T) {
	if !*scale {
		t.Skip("run with -scale (make bench)")
	}
	agent := consultest.Start(t, consultest.WithHCL(`limits { http_max_conns_per_client = 200 }`))
	r := brokertest.Start(t, agent)
	conn := r.Conn(t)
	c := lockbrokerv1.NewLockServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var ms0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)

	type held struct {
		seq    *lockbrokerv1.Sequencer
		events lockbrokerv1.LockService_AcquireClient
	}
	holds := make([]held, *scaleHolds)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 64)
	for i := range holds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{
				Key:     fmt.Sprintf("scale/%d", i),
				Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(60 * time.Second), LockDelay: durationpb.New(0)}},
			})
			if err != nil {
				failed.Add(1)
				return
			}
			resp, err := st.Recv()
			if err != nil || resp.GetAcquired() == nil {
				t.Errorf("hold %d: %v", i, err)
				failed.Add(1)
				return
			}
			holds[i] = held{resp.GetAcquired().GetSequencer(), st}
		}()
	}
	wg.Wait()
	acquireAll := time.Since(start)
	if failed.Load() > 0 {
		t.Fatalf("%d holds failed", failed.Load())
	}

	// Watchers: 1,000 streams over 100 keys.
	for i := range *scaleWatchers {
		w, err := c.Watch(ctx, &lockbrokerv1.WatchRequest{Key: fmt.Sprintf("scale/%d", i%100)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // let watches settle before reading the gauges
	blocking := r.Store.OpenBlockingQueries()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)

	// Loss is still detected through the shared watches.
	victim := holds[len(holds)-1]
	lostAt := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		for {
			resp, err := victim.events.Recv()
			if err != nil {
				return
			}
			if resp.GetLost() != nil {
				lostAt <- time.Since(t0)
				return
			}
		}
	}()
	if _, err := agent.Client().Session().Destroy(victim.seq.GetSessionId(), nil); err != nil {
		t.Fatal(err)
	}
	var lossLatency time.Duration
	select {
	case lossLatency = <-lostAt:
	case <-time.After(10 * time.Second):
		t.Fatal("no lost event within 10s")
	}

	t.Logf("holds=%d watchers=%d", *scaleHolds, *scaleWatchers)
	t.Logf("acquire all: %s (%.0f holds/s)", acquireAll.Round(time.Millisecond), float64(*scaleHolds)/acquireAll.Seconds())
	t.Logf("open Consul blocking queries: %d", blocking)
	t.Logf("process heap in use: %.1f MiB (+%.1f MiB), goroutines: %d (includes the test's own client side)",
		float64(ms.HeapInuse)/(1<<20), float64(ms.HeapInuse-ms0.HeapInuse)/(1<<20), runtime.NumGoroutine())
	t.Logf("lost after session destroy: %s", lossLatency.Round(time.Millisecond))
	fmt.Printf("SCALE holds=%d watchers=%d acquire_all=%s blocking_queries=%d heap_inuse_mib=%.1f loss_latency=%s\n",
		*scaleHolds, *scaleWatchers, acquireAll.Round(time.Millisecond), blocking, float64(ms.HeapInuse)/(1<<20), lossLatency.Round(time.Millisecond))
	cancel()
}
