package chaos

import (
	"fmt"
	"sort"
)

// CheckerTokens names the per-key grant order checker.
const CheckerTokens = "token-order"

// CheckTokenOrder checks fencing per key at the source: the tokens of a
// key's grants strictly increase in grant order, for locks, every read
// and write grant of a read-write lock (a writer's token is above every
// grant before it, a reader's above every writer's before it) and every
// key of a multi-key grant. Grant order is known where real time fixes it:
// a grant whose `acquired` reached its client before another request on
// the key was even sent came first, so its token must be lower. Semaphore
// slots are not lock grants and are left out.
func CheckTokenOrder(s *Snapshot) Result {
	r := newResult(CheckerTokens)
	checked, keys := 0, 0
	for _, key := range sortedKeys(byKey(s.Holds)) {
		var holds []Hold
		for _, h := range byKey(s.Holds)[key] {
			if s.limit(key) == 1 && h.Token > 0 {
				holds = append(holds, h)
			}
		}
		if len(holds) == 0 {
			continue
		}
		keys++
		byAcq := append([]Hold(nil), holds...)
		sort.SliceStable(byAcq, func(i, j int) bool { return byAcq[i].Acquired < byAcq[j].Acquired })
		byCall := append([]Hold(nil), holds...)
		sort.SliceStable(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
		// Sweep: before judging b, take in every grant received before b
		// was asked for; the highest of their tokens must be below b's.
		var top Hold
		i := 0
		for _, b := range byCall {
			for ; i < len(byAcq) && byAcq[i].Acquired < b.Call; i++ {
				if byAcq[i].Token > top.Token {
					top = byAcq[i]
				}
			}
			checked++
			if top.ID == 0 || top.Token < b.Token {
				continue
			}
			r.add(Violation{At: b.Acquired, Key: key,
				Msg: fmt.Sprintf("a %sgrant of %s got token %d, not above token %d of a %sgrant received before it was asked for",
					modeWord(b.Mode), key, b.Token, top.Token, modeWord(top.Mode)),
				Excerpt: []string{top.describe(), b.describe()}})
		}
	}
	r.Summary = fmt.Sprintf("%d grants on %d keys (locks, read-write, each key of multi-key): tokens strictly increase in grant order", checked, keys)
	return r
}

func modeWord(mode string) string {
	if mode == "" {
		return ""
	}
	return mode + " "
}
