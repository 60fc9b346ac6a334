package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// CheckerMulti names the multi-key all-or-nothing checker.
const CheckerMulti = "multi-atomic"

// multiValue is the value a multi-key client asks for: its name and every
// key of its request, so that an observer of Consul can tell which keys
// belong together.
func multiValue(name string, keys []string) string {
	return name + " keys=" + strings.Join(keys, ",")
}

// multiKeysOf parses multiValue ("" keys when v is not one).
func multiKeysOf(v string) []string {
	_, list, ok := strings.Cut(v, " keys=")
	if !ok || list == "" {
		return nil
	}
	return strings.Split(list, ",")
}

// CheckMulti checks that a multi-key lock is all or nothing:
//   - in Consul: in every consistent read an observer made of the
//     multi-key lock keys (KVView), a request's session holds either
//     every key of the request or none (keys are grouped by session and
//     value, which names the request's keys; failing that, by the
//     request the history has for that session then);
//   - in belief: a client that received `acquired` for a multi-key
//     request believes it holds every key of it (one hold per key of
//     Keys, no more, no fewer), from the same moment to the same moment.
func CheckMulti(s *Snapshot) Result {
	r := newResult(CheckerMulti)
	groups := map[int][]Hold{}
	for _, h := range s.Holds {
		if h.Group > 0 {
			groups[h.Group] = append(groups[h.Group], h)
		}
	}
	ids := make([]int, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		g := groups[id]
		want := slices.Clone(g[0].Keys)
		var got []string
		var ex []string
		same := true
		for _, h := range g {
			got = append(got, h.Key)
			ex = append(ex, h.describe())
			same = same && h.Acquired == g[0].Acquired && h.End == g[0].End
		}
		sort.Strings(want)
		sort.Strings(got)
		switch {
		case !slices.Equal(want, got):
			r.add(Violation{At: g[0].Acquired, Key: g[0].Key,
				Msg:     fmt.Sprintf("client %d believed it held %v of its multi-key request for %v", g[0].Client, got, want),
				Excerpt: ex})
		case !same:
			r.add(Violation{At: g[0].Acquired, Key: g[0].Key,
				Msg:     fmt.Sprintf("client %d believed it held the keys of one multi-key grant over different times", g[0].Client),
				Excerpt: ex})
		}
	}
	seen, partial, unknown := 0, 0, 0
	for _, v := range s.Views {
		type holder struct{ session, value string }
		held := map[holder][]string{}
		for _, kh := range v.Held {
			held[holder{kh.Session, kh.Value}] = append(held[holder{kh.Session, kh.Value}], kh.Key)
		}
		hs := make([]holder, 0, len(held))
		for h := range held {
			hs = append(hs, h)
		}
		sort.Slice(hs, func(i, j int) bool { return hs[i].session+hs[i].value < hs[j].session+hs[j].value })
		for _, h := range hs {
			want := multiKeysOf(h.value)
			if want == nil {
				want = requestKeys(s, h.session, v.At)
			}
			if want == nil {
				unknown++
				continue
			}
			seen++
			keys := held[h]
			var missing []string
			for _, k := range want {
				if !slices.Contains(keys, k) {
					missing = append(missing, k)
				}
			}
			if len(missing) == 0 {
				continue
			}
			partial++
			sort.Strings(keys)
			r.add(Violation{At: v.At, Key: keys[0],
				Msg: fmt.Sprintf("Consul (index %d) showed session %.8s holding %v of its multi-key request for %v: %v not held",
					v.Index, h.session, keys, want, missing),
				Excerpt: []string{fmt.Sprintf("value %q", h.value)}})
		}
	}
	r.Summary = fmt.Sprintf("%d multi-key grants believed whole; %d consistent reads of Consul showed %d multi-key holds, %d partial (%d holders not matched to a request)",
		len(groups), len(s.Views), seen, partial, unknown)
	return r
}

// requestKeys are the keys of the multi-key request that session held (or
// was being granted) at the run-clock time at: the latest grant of that
// session asked for by then, believed until at least 2s before.
func requestKeys(s *Snapshot, session string, at time.Duration) []string {
	var best *Hold
	for i := range s.Holds {
		h := &s.Holds[i]
		if h.Group == 0 || h.Session != session || h.Call > at || h.End+2*time.Second < at {
			continue
		}
		if best == nil || h.Call > best.Call {
			best = h
		}
	}
	if best == nil {
		return nil
	}
	return best.Keys
}
