package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Names of the checkers, as reports and mutant verdicts name them.
const (
	CheckerFencing    = "fencing"
	CheckerOverlap    = "overlap"
	CheckerLinear     = "linearizability"
	CheckerLoss       = "loss-bound"
	CheckerLiveness   = "liveness"
	CheckerLeaks      = "no-leaks"
	maxViolationsKept = 20
)

// Violation is one breach of a checker's property.
type Violation struct {
	At  time.Duration `json:"at_ms"`
	Key string        `json:"key,omitempty"`
	Msg string        `json:"msg"`
	// Excerpt is the part of the history that shows it.
	Excerpt []string `json:"excerpt,omitempty"`
}

// Result is a checker's verdict.
type Result struct {
	Name       string      `json:"name"`
	OK         bool        `json:"ok"`
	Count      int         `json:"violations"`
	Violations []Violation `json:"examples,omitempty"`
	// Summary says what was checked, in a line.
	Summary string `json:"summary"`
}

// add records a violation (keeping the first few in full).
func (r *Result) add(v Violation) {
	r.OK = false
	r.Count++
	if len(r.Violations) < maxViolationsKept {
		r.Violations = append(r.Violations, v)
	}
}

func newResult(name string) Result { return Result{Name: name, OK: true} }

// ms renders a run-clock offset.
func ms(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

// describe renders a hold for an excerpt.
func (h *Hold) describe() string {
	paused := ""
	if h.Paused {
		paused = " paused"
	}
	return fmt.Sprintf("hold#%d client %d (%s) key %s token %d session %.8s: acquired %s, believed until %s (%s, deadline %s, %d resumes)%s",
		h.ID, h.Client, h.Kind, h.Key, h.Token, h.Session, ms(h.Acquired), ms(h.End), h.Reason, ms(h.Deadline), h.Resumes, paused)
}

// describe renders a write for an excerpt.
func (w *Write) describe() string {
	verdict := "refused"
	if w.Accepted {
		verdict = "accepted"
	}
	stale := ""
	if w.Stale {
		stale = " (stale, after a freeze)"
	}
	return fmt.Sprintf("write seq %d by client %d hold#%d token %d at %s: %s%s", w.Seq, w.Client, w.HoldID, w.Token, ms(w.Return), verdict, stale)
}

// byKey groups holds by key.
func byKey(holds []Hold) map[string][]Hold {
	out := map[string][]Hold{}
	for _, h := range holds {
		out[h.Key] = append(out[h.Key], h)
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CheckFencing checks Kleppmann's fencing property: for every key, the
// resource never accepted a write whose grant token is lower than one it
// had already accepted. The grant token is the one the history recorded
// for the writer's hold, whatever the client sent, so a client that
// ignores tokens is caught too. It also counts how paused clients were
// stopped: their first write after a freeze must be refused whenever a
// newer holder had written meanwhile (by the token, never by luck).
func CheckFencing(s *Snapshot) Result {
	r := newResult(CheckerFencing)
	maxTok := map[string]Write{}
	var accepted, refused, staleRefused, staleAccepted int
	for _, w := range s.Writes { // in the resource's order
		if w.Accepted {
			accepted++
		} else {
			refused++
		}
		if w.Stale {
			if w.Accepted {
				staleAccepted++
			} else {
				staleRefused++
			}
		}
		if !w.Accepted {
			continue
		}
		if prev, ok := maxTok[w.Key]; ok && w.Token < prev.Token {
			r.add(Violation{At: w.Return, Key: w.Key,
				Msg:     fmt.Sprintf("the resource accepted token %d after it had accepted token %d", w.Token, prev.Token),
				Excerpt: []string{prev.describe(), w.describe()}})
			continue
		}
		maxTok[w.Key] = w
	}
	r.Summary = fmt.Sprintf("%d writes accepted, %d refused by token; stale writes after freezes: %d refused, %d accepted",
		accepted, refused, staleRefused, staleAccepted)
	return r
}

// CheckOverlap checks the belief intervals: for every key, holds (but
// read-write ones: CheckRW) of
// clients that were not paused never overlap in time beyond the key's
// limit (1 for a lock). All clients share the run's clock. A hold an
// operator took away while its client was cut off from its broker, or its
// broker could not see Consul, is checked up to that moment (see
// unheardTake).
func CheckOverlap(s *Snapshot) Result {
	r := newResult(CheckerOverlap)
	checked, unheard := 0, 0
	for _, key := range sortedKeys(byKey(s.Holds)) {
		holds := byKey(s.Holds)[key]
		limit := s.limit(key)
		type ev struct {
			at    time.Duration
			start bool
			h     Hold
		}
		var evs []ev
		for _, h := range holds {
			if h.Mode != "" || h.Paused || s.frozen(h.Client, h.Acquired, h.End) {
				continue // read-write holds: CheckRW
			}
			checked++
			end := h.End
			if u := unheardTake(s, h, takenBound); u > 0 && u < end {
				end = max(u, h.Acquired)
				unheard++
			}
			evs = append(evs, ev{h.Acquired, true, h}, ev{end, false, h})
		}
		sort.SliceStable(evs, func(i, j int) bool {
			if evs[i].at != evs[j].at {
				return evs[i].at < evs[j].at
			}
			return !evs[i].start && evs[j].start // ends first: [a,b] then [b,c] do not overlap
		})
		active := map[int]Hold{}
		for _, e := range evs {
			if !e.start {
				delete(active, e.h.ID)
				continue
			}
			active[e.h.ID] = e.h
			if len(active) > limit {
				var ex []string
				ids := make([]int, 0, len(active))
				for id := range active {
					ids = append(ids, id)
				}
				sort.Ints(ids)
				for _, id := range ids {
					h := active[id]
					ex = append(ex, h.describe())
				}
				r.add(Violation{At: e.at, Key: key,
					Msg:     fmt.Sprintf("%d clients believed they held %s at once (limit %d)", len(active), key, limit),
					Excerpt: ex})
			}
		}
	}
	r.Summary = fmt.Sprintf("%d holds of non-paused clients checked for overlap (%d taken away by an operator while cut off from their broker, or their broker from Consul: checked until then)", checked, unheard)
	return r
}

// LossBounds are the promises CheckLoss holds the run to (DESIGN.md, "Loss
// detection").
type LossBounds struct {
	// Slack is how late past its guaranteed deadline a client may learn
	// of a loss (timer and scheduling jitter on a loaded machine).
	Slack time.Duration
	// Taken is the bound for a hold taken away in Consul (an admin fault
	// destroying its session): 1s in DESIGN.md.
	Taken time.Duration
}

// LossStats describes the losses of a run.
type LossStats struct {
	ByReason map[string]int `json:"by_reason"`
	// Latency is from the start of the latest fault before the loss to
	// the client learning of it, for non-paused clients.
	P50 time.Duration `json:"-"`
	P99 time.Duration `json:"-"`
	Max time.Duration `json:"-"`
	N   int           `json:"measured"`
	// Unattributed: losses with no fault started during the hold.
	Unattributed int `json:"unattributed"`
}

// takenReasons are losses that say the hold was taken away in Consul;
// only an admin fault may do that in a run.
var takenReasons = map[string]bool{
	"lost:SESSION_INVALIDATED": true, "lost:RELEASED_BY_OTHER": true,
	"lost:DELETED_BY_OTHER": true, "lost:LIMIT_CONFLICT": true,
	"lost:RELEASED_UNASKED": true, // a `released` its client never asked for
}

// CheckLoss checks that every hold that ended in a loss (for a client that
// was not paused) was reported to its client:
//   - no later than its guaranteed deadline (plus Slack);
//   - for a lock, before any other holder of the key received `acquired`;
//   - as taken away in Consul (invalidated, released or deleted by
//     another) only when an admin fault did that to it, and then within
//     Taken of the fault. Every other write to a run's keys comes from
//     the brokers on behalf of their holders, so such a loss means a
//     broker (an old replica, say) took a live hold away.
//
// A client cut off from its broker when an operator took its hold away
// cannot be told (unheardTake): it is held to its deadline only.
//
// It also measures the loss-notice latency.
func CheckLoss(s *Snapshot, b LossBounds) (Result, LossStats) {
	r := newResult(CheckerLoss)
	st := LossStats{ByReason: map[string]int{}}
	var lat []time.Duration
	holds := byKey(s.Holds)
	for _, h := range s.Holds {
		if !h.Lost() {
			continue
		}
		st.ByReason[strings.TrimPrefix(h.Reason, "lost:")]++
		if h.Paused || s.frozen(h.Client, h.Acquired, h.End) {
			continue
		}
		if h.Deadline > 0 && h.End > h.Deadline+b.Slack {
			r.add(Violation{At: h.End, Key: h.Key,
				Msg:     fmt.Sprintf("loss learned %s after the guaranteed deadline", ms(h.End-h.Deadline)),
				Excerpt: []string{h.describe()}})
		}
		if s.limit(h.Key) == 1 {
			end := h.End
			if u := unheardTake(s, h, b.Taken); u > 0 {
				end = min(end, u)
			}
			for _, g := range holds[h.Key] {
				if g.Mode == ModeRead && h.Mode == ModeRead {
					continue // readers share a read-write lock
				}
				if g.ID != h.ID && g.Client != h.Client && g.Acquired > h.Acquired && g.Acquired < end {
					r.add(Violation{At: g.Acquired, Key: h.Key,
						Msg:     fmt.Sprintf("another holder received acquired %s before this holder learned of its loss", ms(h.End-g.Acquired)),
						Excerpt: []string{h.describe(), g.describe()}})
					break
				}
			}
		}
		admin := adminFault(s, h)
		if takenReasons[h.Reason] && admin == nil {
			r.add(Violation{At: h.End, Key: h.Key,
				Msg:     "hold taken away in Consul (" + h.Reason + ") though no admin fault touched it: a broker wrote over a live hold",
				Excerpt: []string{h.describe()}})
		}
		cause := admin
		if cause == nil {
			cause = latestFault(s, h.Acquired, h.End)
		}
		if cause == nil {
			st.Unattributed++
			continue
		}
		lat = append(lat, h.End-cause.Start)
	}
	// Admin faults: the holder learns within Taken.
	for _, f := range s.Faults {
		if f.Session == "" {
			continue
		}
		for _, h := range s.Holds {
			if h.Session != f.Session || h.Key != f.Key || h.Acquired > f.Start || h.End < f.Start {
				continue
			}
			if h.Paused || s.frozen(h.Client, h.Acquired, h.End) {
				continue
			}
			if h.End-f.Start > b.Taken+b.Slack && !blinded(s, f, h, b.Taken) && unheardTake(s, h, b.Taken) == 0 {
				r.add(Violation{At: h.End, Key: h.Key,
					Msg:     fmt.Sprintf("hold taken away in Consul at %s (%s) learned %s later (bound %s)", ms(f.Start), f.Kind, ms(h.End-f.Start), b.Taken),
					Excerpt: []string{h.describe()}})
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	st.N = len(lat)
	if len(lat) > 0 {
		st.P50, st.P99, st.Max = percentile(lat, 0.50), percentile(lat, 0.99), lat[len(lat)-1]
	}
	r.Summary = fmt.Sprintf("%d losses; notice latency after the causing fault p50 %s p99 %s max %s (%d measured)",
		st.Total(), st.P50.Round(time.Millisecond), st.P99.Round(time.Millisecond), st.Max.Round(time.Millisecond), st.N)
	return r, st
}

// Total is the number of losses.
func (st LossStats) Total() int {
	n := 0
	for _, c := range st.ByReason {
		n += c
	}
	return n
}

// adminFault returns the admin fault that took h away, if any.
func adminFault(s *Snapshot, h Hold) *Fault {
	for i := range s.Faults {
		f := &s.Faults[i]
		if f.Session != "" && f.Session == h.Session && f.Start >= h.Acquired-time.Second && f.Start <= h.End {
			return f
		}
	}
	return nil
}

// latestFault is the fault started last within [from, to].
func latestFault(s *Snapshot, from, to time.Duration) *Fault {
	var best *Fault
	for i := range s.Faults {
		f := &s.Faults[i]
		if f.Start >= from && f.Start <= to && (best == nil || f.Start > best.Start) {
			best = f
		}
	}
	return best
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// CheckLiveness checks progress after faults: in every quiet period (no
// fault active, every process up) every worker client that was not frozen
// held its key at some time between start+recovery and the period's end.
// recovery is the time the system may need to forget the last faults
// (2×TTL for orphaned sessions to expire, the lock-delay, a Consul
// election and a broker restart); the bound a client waits is therefore
// at most recovery plus the rest of the quiet period.
//
// It also checks that a client that vanishes while holding a lock loses
// it to someone else within vanish, unless faults on what its hold relied
// on push that bound (checkVanished).
func CheckLiveness(s *Snapshot, recovery, vanish time.Duration, clients map[int]ClientKind) Result {
	r := newResult(CheckerLiveness)
	plain, pushed := checkVanished(s, VanishBounds{Vanish: vanish, Recovery: recovery, Handover: max(vanish-releaseBound, 0)}, &r)
	checked := plain + pushed
	for _, q := range s.Quiets {
		from := q.Start + recovery
		if q.End-from < minLivenessWindow {
			continue // too short to judge (a run cut short)
		}
		held := map[int]bool{}
		for _, h := range s.Holds {
			if h.Acquired <= q.End && h.End >= from {
				held[h.Client] = true
			}
		}
		ids := make([]int, 0, len(clients))
		for id := range clients {
			ids = append(ids, id)
		}
		sort.Ints(ids)
		for _, id := range ids {
			if clients[id] == KindObserver || clients[id] == KindMultiObs || s.frozen(id, q.Start, q.End) {
				continue
			}
			checked++
			if !held[id] {
				r.add(Violation{At: q.End,
					Msg: fmt.Sprintf("client %d (%s) wanted its lock throughout the quiet period %s–%s and never held it after %s (bound %s)",
						id, clients[id], ms(q.Start), ms(q.End), ms(from), q.End-q.Start),
					Excerpt: attemptsIn(s, id, q.Start, q.End, 4)})
			}
		}
	}
	r.Summary = fmt.Sprintf("%d quiet periods, %d checks; bound: recovery %s then the rest of the period; a vanished holder's lock is released (seen free, or granted anew) within %s (%d holds), or by %s after the last fault on its replica or Consul (%d holds)",
		len(s.Quiets), checked, recovery, vanish, plain, recovery, pushed)
	return r
}

// minLivenessWindow is the shortest window (after recovery) in which
// liveness is judged.
const minLivenessWindow = 10 * time.Second

// attemptsIn describes client c's last n Acquire attempts that overlap
// [from, to].
func attemptsIn(s *Snapshot, c int, from, to time.Duration, n int) []string {
	var out []string
	for i := len(s.Attempts) - 1; i >= 0 && len(out) < n; i-- {
		a := s.Attempts[i]
		if a.Client == c && a.Call <= to && a.Return >= from {
			out = append(out, fmt.Sprintf("attempt on %s %s–%s ok=%v %s", a.Key, ms(a.Call), ms(a.Return), a.OK, a.Err))
		}
	}
	if len(out) == 0 {
		out = append(out, "no Acquire attempt ended in the period (one was in flight)")
	}
	return out
}

// Leftovers is what the run found left behind at its end.
type Leftovers struct {
	Sessions []string // Consul sessions still present
	Keys     []string // keys under the run's prefix still present
	// BrokerExits lists brokers that did not exit cleanly on SIGTERM.
	BrokerExits []string
	// LogFindings lists data races, panics and fatal errors in logs.
	LogFindings []string
}

// CheckLeaks turns what the run found left behind into a verdict.
func CheckLeaks(l Leftovers) Result {
	r := newResult(CheckerLeaks)
	for _, s := range l.Sessions {
		r.add(Violation{Msg: "session left in Consul: " + s})
	}
	for _, k := range l.Keys {
		r.add(Violation{Msg: "key left in Consul: " + k})
	}
	for _, b := range l.BrokerExits {
		r.add(Violation{Msg: "unclean broker exit: " + b})
	}
	for _, f := range l.LogFindings {
		r.add(Violation{Msg: "log: " + f})
	}
	r.Summary = fmt.Sprintf("%d sessions, %d keys left; %d unclean exits; %d log findings",
		len(l.Sessions), len(l.Keys), len(l.BrokerExits), len(l.LogFindings))
	return r
}
