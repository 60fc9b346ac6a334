package chaos

import (
	"fmt"
	"sort"
	"time"
)

// releaseBound is DESIGN.md's promise for a vanished client: its
// broker-owned hold is released within 20s.
const releaseBound = 20 * time.Second

// VanishBounds are the promises a vanished holder's lock is held to.
type VanishBounds struct {
	// Vanish: DESIGN.md, "Loss detection": a client that vanishes is
	// detected by gRPC server keepalive and its broker-owned hold is
	// released within 20s; then the lock-delay, and 1s to hand it over.
	// It presumes the owning replica and Consul work meanwhile.
	Vanish time.Duration
	// Recovery: when they do not (the owning replica killed, its Consul
	// server or link down, a Consul leader election), the hold's session
	// is orphaned or its release fails, and Consul expires it within
	// 2×TTL of its last renewal or of the latest leader election (a new
	// leader re-arms every session timer), then the lock-delay: 2×TTL +
	// lock-delay + 5s after such a fault ends.
	Recovery time.Duration
	// Handover is the part of a bound after the release is due (the
	// lock-delay and 1s): a fault that starts then cannot have stopped
	// the release.
	Handover time.Duration
}

// excuse is how long after fault f a vanished holder's lock may still be
// stuck, when f hits what the frozen client's hold relied on (0: f does
// not touch it, see hitsHolder). The owning replica and its Consul server
// are fr's Replica and Server (any, when unknown).
func (b VanishBounds) excuse(f Fault, fr Freeze) time.Duration {
	if !hitsHolder(f, fr.Replica, fr.Server) {
		return 0
	}
	switch f.Kind {
	case FBrokerPause, FBrokerPauseLong, FBrokerPauseFailover, FBrokerTerm:
		// Stopped, its keepalive stops too; once it runs (or drains, and
		// releases what nobody resumed) it has the whole promise again.
		return b.Vanish
	}
	// Killed, the session is orphaned; cut off from Consul, or during an
	// election, the release may fail: only the session's TTL frees the
	// lock ("its session expires with its TTL").
	return b.Recovery
}

// deadline is when the lock of a client frozen by fr must have gone to
// someone else: fr.Start + Vanish, pushed past every fault that touches
// the hold, is still on at fr.Start, and starts before the release is due
// (the deadline as pushed so far, less Handover), to that fault's end
// plus its excuse. It also says how
// many faults pushed it.
func (b VanishBounds) deadline(s *Snapshot, fr Freeze) (time.Duration, int) {
	faults := append([]Fault(nil), s.Faults...)
	sort.SliceStable(faults, func(i, j int) bool { return faults[i].Start < faults[j].Start })
	dl, pushed := fr.Start+b.Vanish, 0
	for _, f := range faults {
		end := f.End
		if end == 0 {
			end = s.End
		}
		if f.Start > dl-b.Handover || end < fr.Start {
			continue
		}
		if ex := b.excuse(f, fr); ex > 0 && end+ex > dl {
			dl, pushed = end+ex, pushed+1
		}
	}
	return dl, pushed
}

// checkVanished checks the other direction of DESIGN.md's loss detection:
// a client that vanishes while holding a lock (frozen with its
// connections mute, so that only gRPC keepalive can tell, or closed)
// loses it by the deadline above: someone else gets the lock, or a
// consistent read (an observer's GetLock) sees the key free or held by
// another grant. This is also what makes a frozen client's stale write
// meet a newer token rather than luck. It returns the number of holds
// judged at the plain bound and at a pushed one.
//
// The read counts because the promise is the release, not the next
// grant: a waiter whose own replica is cut off from Consul or stopped
// may take longer to get a free key (the liveness check of the quiet
// periods judges that), and faults on the waiters' replicas do not push
// this bound.
func checkVanished(s *Snapshot, b VanishBounds, r *Result) (plain, pushed int) {
	for _, f := range s.Freezes {
		if f.End-f.Start <= b.Vanish {
			continue
		}
		for _, h := range s.Holds {
			if h.Client != f.Client || h.Acquired > f.Start || h.End < f.Start || s.limit(h.Key) != 1 {
				continue
			}
			dl, n := b.deadline(s, f)
			if n == 0 {
				plain++
			} else {
				pushed++
			}
			if movedBy(s, h, f.Start, dl) || seenReleased(s, h, f.Start, dl) {
				continue
			}
			why := fmt.Sprintf("within %s", b.Vanish)
			if n > 0 {
				why = fmt.Sprintf("by %s (%d faults on its replica %q or Consul pushed the bound)", ms(dl), n, f.Replica)
			}
			r.add(Violation{At: dl, Key: h.Key,
				Msg:     fmt.Sprintf("client %d vanished at %s holding %s and nobody else got the lock, nor did a consistent read see it released, %s (frozen until %s)", f.Client, ms(f.Start), h.Key, why, ms(f.End)),
				Excerpt: []string{h.describe()}})
		}
	}
	return plain, pushed
}

// movedBy reports whether h's key was granted anew (any other hold, the
// vanished client's own after it woke included) within [from, to].
func movedBy(s *Snapshot, h Hold, from, to time.Duration) bool {
	for _, g := range s.Holds {
		if g.Key == h.Key && g.ID != h.ID && g.Acquired >= from && g.Acquired <= to {
			return true
		}
	}
	return false
}

// seenReleased reports whether a consistent read of h's key (GetLock)
// that began at or after from and answered by to saw the key free or
// held by another grant than h's: h's hold had ended by then. A read that
// began before from may have been served before h's grant or before the
// freeze, and tells nothing.
func seenReleased(s *Snapshot, h Hold, from, to time.Duration) bool {
	for _, c := range s.Checks {
		if c.GetLock && c.Key == h.Key && c.Call >= from && c.Return <= to && c.Holder != h.Token {
			return true
		}
	}
	return false
}
