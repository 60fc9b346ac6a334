package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"
)

// The fault kinds. Each is described in docs/chaos.md.
const (
	FBrokerKill          = "broker-kill"            // SIGKILL a replica, restart it
	FBrokerPause         = "broker-pause"           // SIGSTOP/SIGCONT, shorter than the TTL
	FBrokerPauseLong     = "broker-pause-long"      // SIGSTOP/SIGCONT straddling the TTL
	FBrokerTerm          = "broker-term"            // SIGTERM (rolling restart), restart it
	FConsulLeaderKill    = "consul-leader-kill"     // SIGKILL the Consul leader, restart it
	FConsulFollowerKill  = "consul-follower-kill"   // SIGKILL a follower, restart it
	FConsulRestartAll    = "consul-restart-all"     // stop every Consul server, start them again
	FConsulBlackhole     = "consul-blackhole-short" // broker↔Consul partition shorter than the TTL
	FConsulBlackholeLong = "consul-blackhole-long"  // … longer than the TTL
	FConsulLatency       = "consul-latency"         // 200ms ± 100ms each way on a broker↔Consul link
	FConsulReset         = "consul-reset"           // reset_peer on a broker↔Consul link
	FClientPartition     = "client-partition"       // clients cut from one or every replica
	FClientReset         = "client-reset"           // reset_peer on client↔broker links
	FClientLatency       = "client-latency"         // 200ms ± 100ms on client↔broker links
	FClientFreeze        = "client-freeze"          // a client frozen (and silent) past its TTL
	FClientFreezeReset   = "client-freeze-reset"    // … whose connections are reset as it freezes
	FSessionDestroy      = "session-destroy"        // an operator destroys a holder's session
)

// Lanes run concurrently; faults within a lane run one after another.
const (
	laneProcess = iota // broker and Consul processes
	laneNetwork        // toxiproxy
	laneClient         // client freezes and admin actions
	numLanes
)

// faultSpec says how to draw a fault of one kind.
type faultSpec struct {
	kind     string
	lane     int
	weight   float64
	min, max time.Duration // how long it lasts (down time, pause, partition)
}

// specs are the fault kinds for a TTL and lock-delay.
func specs(ttl, lockDelay time.Duration) []faultSpec {
	straddle := 2*ttl + lockDelay
	return []faultSpec{
		{FBrokerKill, laneProcess, 3, 500 * time.Millisecond, 3 * time.Second},
		{FBrokerPause, laneProcess, 2, time.Second, ttl / 2},
		{FBrokerPauseLong, laneProcess, 1, ttl + time.Second, ttl + 5*time.Second},
		{FBrokerTerm, laneProcess, 2, 500 * time.Millisecond, 2 * time.Second},
		{FConsulLeaderKill, laneProcess, 2, time.Second, 5 * time.Second},
		{FConsulFollowerKill, laneProcess, 1, time.Second, 5 * time.Second},
		{FConsulRestartAll, laneProcess, 0.4, time.Second, 3 * time.Second},
		{FConsulBlackhole, laneNetwork, 2, time.Second, ttl / 2},
		{FConsulBlackholeLong, laneNetwork, 1, ttl + 2*time.Second, ttl + 8*time.Second},
		{FConsulLatency, laneNetwork, 2, 3 * time.Second, 10 * time.Second},
		{FConsulReset, laneNetwork, 1, 500 * time.Millisecond, 2 * time.Second},
		{FClientPartition, laneNetwork, 2, 2 * time.Second, 15 * time.Second},
		{FClientReset, laneNetwork, 1, 500 * time.Millisecond, 2 * time.Second},
		{FClientLatency, laneNetwork, 1, 3 * time.Second, 8 * time.Second},
		{FClientFreeze, laneClient, 0.5, straddle + 2*time.Second, straddle + 6*time.Second},
		{FClientFreezeReset, laneClient, 0.5, straddle + 2*time.Second, straddle + 6*time.Second},
		{FSessionDestroy, laneClient, 2, 0, 0},
		{FBrokerPauseFailover, laneProcess, 1, ttl + time.Second, ttl + 3*time.Second},
	}
}

// Planned is one fault of the schedule.
type Planned struct {
	Kind string        `json:"kind"`
	At   time.Duration `json:"at"`  // offset in its segment
	Dur  time.Duration `json:"dur"` // how long it lasts
	// Pick is a random number the injector uses to choose its target
	// among what exists at injection time (replica, server, clients).
	Pick uint64 `json:"pick"`
}

// Segment is a stretch of the schedule: chaos (lanes of faults) or quiet.
type Segment struct {
	Chaos bool                `json:"chaos"`
	Len   time.Duration       `json:"len"`
	Lanes [numLanes][]Planned `json:"lanes"`
}

// Schedule is the whole plan of a run, derived from its seed.
type Schedule struct {
	Seed     uint64    `json:"seed"`
	Segments []Segment `json:"segments"`
}

// Count is the number of planned faults.
func (s *Schedule) Count() int {
	n := 0
	for _, seg := range s.Segments {
		for _, l := range seg.Lanes {
			n += len(l)
		}
	}
	return n
}

// ByKind counts planned faults by kind.
func (s *Schedule) ByKind() map[string]int {
	out := map[string]int{}
	for _, seg := range s.Segments {
		for _, l := range seg.Lanes {
			for _, f := range l {
				out[f.Kind]++
			}
		}
	}
	return out
}

// Plan draws a schedule from seed: chaos segments of chaosLen separated by
// quiet periods of quietLen until total, ending with a quiet period.
// weights, when not nil, replace the default weight of the kinds it names
// (0 removes a kind); must lists kinds placed first in their lane.
func Plan(seed uint64, total, chaosLen, quietLen, ttl, lockDelay time.Duration, weights map[string]float64, must []string) *Schedule {
	rng := rand.New(rand.NewPCG(seed, 0x6c6f636b))
	sp := specs(ttl, lockDelay)
	for i := range sp {
		if w, ok := weights[sp[i].kind]; ok {
			sp[i].weight = w
		}
	}
	s := &Schedule{Seed: seed}
	first := true
	for used := time.Duration(0); used < total; {
		chaos := min(chaosLen, total-used-quietLen)
		if chaos >= 5*time.Second {
			seg := Segment{Chaos: true, Len: chaos}
			for lane := range numLanes {
				seg.Lanes[lane] = planLane(rng, sp, lane, chaos, mustFor(sp, lane, must, first))
			}
			s.Segments = append(s.Segments, seg)
			used += chaos
			first = false
		}
		q := min(quietLen, total-used)
		if total-used-q < quietLen+5*time.Second {
			q = total - used // the last quiet period takes the rest: never a stub
		}
		if q <= 0 {
			break
		}
		s.Segments = append(s.Segments, Segment{Len: q})
		used += q
	}
	return s
}

func mustFor(sp []faultSpec, lane int, must []string, first bool) []string {
	if !first {
		return nil
	}
	var out []string
	for _, k := range must {
		for _, f := range sp {
			if f.kind == k && f.lane == lane {
				out = append(out, k)
			}
		}
	}
	return out
}

// planLane draws one lane's faults within a segment of length n.
func planLane(rng *rand.Rand, sp []faultSpec, lane int, n time.Duration, must []string) []Planned {
	var pool []faultSpec
	var total float64
	for _, f := range sp {
		if f.lane == lane && f.weight > 0 {
			pool = append(pool, f)
			total += f.weight
		}
	}
	byKind := map[string]faultSpec{}
	for _, f := range sp {
		byKind[f.kind] = f
	}
	var out []Planned
	at := between(rng, 500*time.Millisecond, 2*time.Second)
	for i := 0; ; i++ {
		var f faultSpec
		switch {
		case i < len(must):
			f = byKind[must[i]]
		case len(pool) == 0:
			return out
		default:
			x := rng.Float64() * total
			for _, c := range pool {
				if x -= c.weight; x <= 0 {
					f = c
					break
				}
			}
			if f.kind == "" {
				f = pool[len(pool)-1]
			}
		}
		d := f.min
		if f.max > f.min {
			d = between(rng, f.min, f.max)
		}
		if at+d+time.Second > n {
			if i < len(must) { // a must-have still goes in if it fits at all
				continue
			}
			return out
		}
		out = append(out, Planned{Kind: f.kind, At: at, Dur: d, Pick: rng.Uint64()})
		at += d + between(rng, 500*time.Millisecond, 3*time.Second)
	}
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// faultStats counts injected faults (a planned fault with no target, e.g.
// a session-destroy while nobody holds, is skipped and not counted).
type faultStats struct {
	mu     sync.Mutex
	byKind map[string]int
	total  int
}

func (f *faultStats) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byKind == nil {
		f.byKind = map[string]int{}
	}
	f.byKind[kind]++
	f.total++
}

func (f *faultStats) snapshot() (map[string]int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.byKind {
		out[k] = v
	}
	return out, f.total
}

// describeKinds renders counts by kind, sorted.
func describeKinds(m map[string]int) string {
	keys := sortedKeys(m)
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// executeSegment runs a chaos segment's lanes concurrently.
func (r *run) executeSegment(ctx context.Context, seg Segment) {
	start := time.Now()
	var wg sync.WaitGroup
	for _, lane := range seg.Lanes {
		wg.Go(func() {
			for _, p := range lane {
				sleep(ctx, time.Until(start.Add(p.At)))
				if ctx.Err() != nil {
					return
				}
				r.inject(ctx, p)
			}
		})
	}
	wg.Wait()
}
