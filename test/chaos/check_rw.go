package chaos

import (
	"fmt"
	"sort"
	"time"
)

// CheckerRW names the read-write exclusion checker.
const CheckerRW = "rw-exclusion"

// rwKeys are the keys that have read-write holds (Hold.Mode set).
func rwKeys(s *Snapshot) map[string]bool {
	out := map[string]bool{}
	for _, h := range s.Holds {
		if h.Mode != "" {
			out[h.Key] = true
		}
	}
	return out
}

// CheckRW checks the belief intervals of read-write holds: on every key,
// at most one writer at a time, and no reader beside a writer (readers
// beside each other are fine). As in CheckOverlap, holds of paused or
// frozen clients are left to the fencing checkers, and a hold an operator
// took away while its client could not hear of it is checked up to then.
func CheckRW(s *Snapshot) Result {
	r := newResult(CheckerRW)
	checked, reads, writes := 0, 0, 0
	for _, key := range sortedKeys(rwKeys(s)) {
		type ev struct {
			at    time.Duration
			start bool
			h     Hold
		}
		var evs []ev
		for _, h := range byKey(s.Holds)[key] {
			if h.Mode == "" || h.Paused || s.frozen(h.Client, h.Acquired, h.End) {
				continue
			}
			checked++
			if h.Mode == ModeWrite {
				writes++
			} else {
				reads++
			}
			end := h.End
			if u := unheardTake(s, h, takenBound); u > 0 && u < end {
				end = max(u, h.Acquired)
			}
			evs = append(evs, ev{h.Acquired, true, h}, ev{end, false, h})
		}
		sort.SliceStable(evs, func(i, j int) bool {
			if evs[i].at != evs[j].at {
				return evs[i].at < evs[j].at
			}
			return !evs[i].start && evs[j].start // ends first
		})
		active := map[int]Hold{}
		for _, e := range evs {
			if !e.start {
				delete(active, e.h.ID)
				continue
			}
			active[e.h.ID] = e.h
			nw, nr := 0, 0
			for _, h := range active {
				if h.Mode == ModeWrite {
					nw++
				} else {
					nr++
				}
			}
			if nw == 0 || (nw == 1 && nr == 0) {
				continue
			}
			ids := make([]int, 0, len(active))
			for id := range active {
				ids = append(ids, id)
			}
			sort.Ints(ids)
			var ex []string
			for _, id := range ids {
				h := active[id]
				ex = append(ex, h.Mode+" "+h.describe())
			}
			r.add(Violation{At: e.at, Key: key,
				Msg:     fmt.Sprintf("%d writers and %d readers believed they held %s at once (a writer holds alone)", nw, nr, key),
				Excerpt: ex})
		}
	}
	r.Summary = fmt.Sprintf("%d read-write holds of non-paused clients (%d reads, %d writes): at most one writer, and no reader beside it", checked, reads, writes)
	return r
}
