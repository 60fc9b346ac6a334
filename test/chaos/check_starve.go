package chaos

import (
	"fmt"
	"sort"
	"time"
)

// CheckerStarvation names the starvation checker.
const CheckerStarvation = "starvation"

// StarvationBounds are what CheckStarvation allows a waiter, from the
// shared queue's design (internal/broker/ticket.go, handoff.go).
type StarvationBounds struct {
	// Settle is how long after the end of the last fault a key counts as
	// quiet: an orphaned session may hold it up to 2×TTL, then its
	// lock-delay runs (the profile's recovery).
	Settle time.Duration
	// Arrival is how long after its Acquire call a waiter may take to
	// queue (session, read, the ticket's transaction): requests made
	// meanwhile may still queue ahead of it, and grants meanwhile may
	// go to anyone.
	Arrival time.Duration
	// Turn is what each turn ahead costs on top of the hold itself: the
	// release, the hand-over to a waiter of another replica (its blocking
	// query wakes, its grant transaction), and the handoffCourtesy (50ms)
	// that a replica's chain of hand-offs leaves the key free each
	// handoffChain (1s).
	Turn time.Duration
	// Base is the waiter's own share once it has queued: queueGrace (1s)
	// once, to skip a head whose waiter went away with its session still
	// alive, and its own grant and `acquired`.
	Base time.Duration
}

// starvationBounds are the run's: Settle is set from the profile.
var starvationBounds = StarvationBounds{Arrival: time.Second, Turn: 300 * time.Millisecond, Base: 1500 * time.Millisecond}

// CheckStarvation checks that no waiter of a quiet key waits beyond its
// place in the queue: a wait (an Acquire, from its call to its grant or
// failure) is judged when no fault was active from Settle before its
// call; a fault that starts during the wait ends what is judged of it
// (the wait so far must already be within the bound). Once queued (by
// Arrival after its call) it waits for the turns ahead of it: the holder
// then and the waiters queued before it, one turn each (a client's loop
// holds or waits, one at a time), so at most the other clients of the key
// that held or waited at some time in that window; of those, limit-1
// share the key with it (a semaphore). The bound is
//
//	Arrival + turns × (longest hold of the key during the wait + Turn) + Base.
//
// With one queue per key across replicas a waiter waits for those ahead
// of it only; with a queue per replica, the clients of a replica that
// pass the key among themselves overtake a waiter of another replica
// again and again (the no-shared-queue mutant).
func CheckStarvation(s *Snapshot, b StarvationBounds) Result {
	r := newResult(CheckerStarvation)
	judged, keys := 0, map[string]bool{}
	var worst float64
	var worstMsg string
	holds := byKey(s.Holds)
	attempts := map[string][]Attempt{}
	for _, a := range s.Attempts {
		attempts[a.Key] = append(attempts[a.Key], a)
	}
	for _, a := range s.Attempts {
		if len(a.Keys) > 0 {
			continue // a multi-key wait also waits for its other keys: not this bound
		}
		if since, ok := quietSince(s, a.Call); ok && a.Call < since+b.Settle {
			continue
		}
		end := a.Return
		if f := nextFault(s, a.Call); f > 0 && f < end {
			end = f
		}
		if s.frozen(a.Client, a.Call, end) {
			continue
		}
		window := a.Call + b.Arrival
		ahead, longest := map[int]bool{}, time.Duration(0)
		for _, h := range holds[a.Key] {
			if h.Client == a.Client {
				continue
			}
			if h.Acquired <= window && h.End >= a.Call {
				ahead[h.Client] = true
			}
			if h.Acquired <= end && h.End >= a.Call {
				longest = max(longest, h.End-h.Acquired)
			}
		}
		for _, o := range attempts[a.Key] {
			if o.Client != a.Client && o.Call <= window && o.Return >= a.Call {
				ahead[o.Client] = true
			}
		}
		turns := max(len(ahead)-s.limit(a.Key)+1, 0)
		bound := b.Arrival + time.Duration(turns)*(longest+b.Turn) + b.Base
		wait := end - a.Call
		judged++
		keys[a.Key] = true
		if ratio := float64(wait) / float64(bound); ratio > worst {
			worst = ratio
			worstMsg = fmt.Sprintf("client %d on %s waited %s, bound %s", a.Client, a.Key, ms(wait), ms(bound))
		}
		if wait <= bound {
			continue
		}
		r.add(Violation{At: end, Key: a.Key,
			Msg: fmt.Sprintf("client %d waited %s for %s (bound %s: %s + %d turns ahead × (longest hold %s + %s) + %s); meanwhile %d grants went to requests made after it had queued",
				a.Client, ms(wait), a.Key, ms(bound), b.Arrival, turns, ms(longest), b.Turn, b.Base, overtakes(holds[a.Key], a, window, end)),
			Excerpt: append([]string{fmt.Sprintf("client %d asked at %s; the attempt ended at %s ok=%v %s", a.Client, ms(a.Call), ms(a.Return), a.OK, a.Err)},
				grantsIn(holds[a.Key], a.Call, end, 6)...)})
	}
	r.Summary = fmt.Sprintf("%d waits on %d keys judged (no fault from %s before the call); bound: %s + turns ahead × (longest hold + %s) + %s; worst wait/bound %.2f (%s)",
		judged, len(keys), b.Settle, b.Arrival, b.Turn, b.Base, worst, worstMsg)
	return r
}

// quietSince is the end of the last fault started by t (false: none).
func quietSince(s *Snapshot, t time.Duration) (time.Duration, bool) {
	var since time.Duration
	ok := false
	for _, f := range s.Faults {
		if f.Start <= t {
			since, ok = max(since, f.End), true
		}
	}
	return since, ok
}

// nextFault is the start of the first fault after t (0 when none).
func nextFault(s *Snapshot, t time.Duration) time.Duration {
	var next time.Duration
	for _, f := range s.Faults {
		if f.Start > t && (next == 0 || f.Start < next) {
			next = f.Start
		}
	}
	return next
}

// overtakes counts the grants in (window, end] to requests made after
// window (a's queueing done).
func overtakes(holds []Hold, a Attempt, window, end time.Duration) int {
	n := 0
	for _, h := range holds {
		if h.Client != a.Client && h.Call > window && h.Acquired <= end {
			n++
		}
	}
	return n
}

// grantsIn describes the first n grants of a key in [from, to].
func grantsIn(holds []Hold, from, to time.Duration, n int) []string {
	var in []Hold
	for _, h := range holds {
		if h.Acquired >= from && h.Acquired <= to {
			in = append(in, h)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].Acquired < in[j].Acquired })
	var out []string
	for i, h := range in {
		if i == n {
			out = append(out, fmt.Sprintf("… %d more grants", len(in)-n))
			break
		}
		out = append(out, fmt.Sprintf("client %d (%s) asked at %s, granted at %s, held until %s", h.Client, h.Kind, ms(h.Call), ms(h.Acquired), ms(h.End)))
	}
	return out
}
