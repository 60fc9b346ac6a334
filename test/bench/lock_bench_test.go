package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Lock benchmarks: figures, not assertions. Each reports the median and
// 99th percentile of its operation in milliseconds (p50-ms, p99-ms), next
// to go test's mean (ns/op).

// lkLatencies collects one duration per iteration.
type lkLatencies []time.Duration

// report adds the median and p99 (ms) to the benchmark's results.
func (l lkLatencies) report(b *testing.B) {
	b.Helper()
	if len(l) == 0 {
		return
	}
	s := slices.Clone(l)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(at(0.50)), "p50-ms")
	b.ReportMetric(ms(at(0.99)), "p99-ms")
}

// BenchmarkLockAcquireRelease: an uncontended lock taken and given back,
// through the broker (Go client Lock + Release, lock-delay 0) and directly
// through Consul's api.Lock (Lock + Unlock, a fresh session each time, as
// api.Lock makes one per Lock) against the same agent.
func BenchmarkLockAcquireRelease(b *testing.B) {
	agent := consultest.Start(b)
	r := brokertest.Start(b, agent)
	c := client.New(r.Conn(b))
	cc := agent.Client()
	ctx := context.Background()

	b.Run("broker", func(b *testing.B) {
		lat := make(lkLatencies, 0, 256)
		for b.Loop() {
			t0 := time.Now()
			l, err := c.Lock(ctx, "bench/uncontended/broker", client.WithLockDelay(0), client.WithTTL(10*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		lat.report(b)
	})

	b.Run("consul-api", func(b *testing.B) {
		lat := make(lkLatencies, 0, 256)
		for b.Loop() {
			t0 := time.Now()
			l, err := cc.LockOpts(&api.LockOptions{Key: "bench/uncontended/api", SessionTTL: "10s"})
			if err != nil {
				b.Fatal(err)
			}
			held, err := l.Lock(nil)
			if err != nil || held == nil {
				b.Fatalf("api.Lock: %v", err)
			}
			if err := l.Unlock(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		lat.report(b)
	})
}

// lkBenchStream is an Acquire stream read by the benchmark goroutine.
type lkBenchStream struct {
	s      lockbrokerv1.LockService_AcquireClient
	cancel context.CancelFunc
}

func lkBenchAcquire(b *testing.B, c lockbrokerv1.LockServiceClient, key string) *lkBenchStream {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{
		Key:     key,
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(10 * time.Second), LockDelay: durationpb.New(0)}},
	})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	return &lkBenchStream{s: s, cancel: cancel}
}

// until reads events until want matches one, and returns it.
func (s *lkBenchStream) until(b *testing.B, want func(*lockbrokerv1.AcquireResponse) bool) *lockbrokerv1.AcquireResponse {
	b.Helper()
	for {
		resp, err := s.s.Recv()
		if err != nil {
			b.Fatalf("stream ended: %v", err)
		}
		if want(resp) {
			return resp
		}
	}
}

// BenchmarkLockHandOff: a holder releases (Release) while a waiter is
// queued; the time from the Release call to the waiter's `acquired`, with
// the waiter on the same replica as the holder or on another one.
func BenchmarkLockHandOff(b *testing.B) {
	agent := consultest.Start(b)
	r1 := brokertest.Start(b, agent)
	r2 := brokertest.Start(b, agent)
	c1, c2 := r1.Locks(b), r2.Locks(b)

	for _, tt := range []struct {
		name   string
		waiter lockbrokerv1.LockServiceClient
	}{
		{name: "same-replica", waiter: c1},
		{name: "cross-replica", waiter: c2},
	} {
		b.Run(tt.name, func(b *testing.B) {
			key := "bench/handoff/" + tt.name
			// Holders alternate between the two clients so that every
			// Release goes to the holder's own replica.
			clients := [2]lockbrokerv1.LockServiceClient{c1, tt.waiter}
			holder := lkBenchAcquire(b, clients[0], key)
			seq := holder.until(b, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil }).GetAcquired().GetSequencer()
			lat := make(lkLatencies, 0, 256)
			i := 0
			for b.Loop() {
				i++
				hc, wc := clients[(i-1)%2], clients[i%2]
				waiter := lkBenchAcquire(b, wc, key)
				waiter.until(b, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetQueued() != nil })
				t0 := time.Now()
				if _, err := hc.Release(context.Background(), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId()}); err != nil {
					b.Fatal(err)
				}
				a := waiter.until(b, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil }).GetAcquired()
				lat = append(lat, time.Since(t0))
				holder.until(b, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetReleased() != nil })
				holder.cancel()
				holder, seq = waiter, a.GetSequencer()
			}
			holder.cancel()
			lat.report(b)
		})
	}
}
