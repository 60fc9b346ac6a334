package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hotChain is clients 1–3 passing key "k" among themselves every 20ms
// from a to b, each asking again as it releases: what a replica that
// hands the key only to its own waiters does.
func hotChain(a, b float64) ([]Hold, []Attempt) {
	var holds []Hold
	var atts []Attempt
	asked := map[int]time.Duration{1: s(a), 2: s(a), 3: s(a)}
	for i, at := 0, s(a); at < s(b); i, at = i+1, at+20*time.Millisecond {
		c := 1 + i%3
		holds = append(holds, Hold{ID: i + 1, Client: c, Kind: KindHot, Key: "k", Limit: 1, Call: asked[c], Acquired: at, End: at + 20*time.Millisecond, Reason: EndReleased})
		atts = append(atts, Attempt{Client: c, Key: "k", Call: asked[c], Return: at, OK: true})
		asked[c] = at + 20*time.Millisecond
	}
	return holds, atts
}

func TestCheckStarvation(t *testing.T) {
	b := StarvationBounds{Settle: s(27), Arrival: s(1), Turn: s(0.3), Base: s(1.5)}
	chain, chainAtts := hotChain(1, 12)
	far := Attempt{Client: 9, Key: "k", Call: s(1), Return: s(11), Err: "context deadline exceeded"}
	tests := []struct {
		name     string
		holds    []Hold
		attempts []Attempt
		faults   []Fault
		limits   map[string]int
		ok       bool
		judged   string
	}{
		{"waiters of three replicas take turns in arrival order", []Hold{
			lockHold(1, 1, 10, 0.5, 1.2, EndReleased),
			lockHold(2, 2, 20, 1.25, 1.5, EndReleased), // asked at 0.8
			lockHold(3, 9, 30, 1.55, 1.9, EndReleased),
		}, []Attempt{
			{Client: 1, Key: "k", Call: s(0.4), Return: s(0.5), OK: true},
			{Client: 2, Key: "k", Call: s(0.8), Return: s(1.25), OK: true},
			{Client: 9, Key: "k", Call: s(1), Return: s(1.55), OK: true},
		}, nil, nil, true, "3 waits on 1 keys"},
		{"a replica's own waiters overtake a waiter of another replica", chain,
			append(append([]Attempt{}, chainAtts...), far), nil, nil, false, ""},
		{"a fault during the wait ends what is judged of it", chain,
			append(append([]Attempt{}, chainAtts...), far),
			[]Fault{{Kind: FBrokerKill, Start: s(2), End: s(3)}}, nil, true, ""},
		{"waits within Settle after a fault are not judged", chain,
			append(append([]Attempt{}, chainAtts...), far),
			[]Fault{{Kind: FBrokerKill, Start: s(0.1), End: s(0.5)}}, nil, true, "0 waits"},
		{"a semaphore with a free slot: no turn ahead", []Hold{
			{ID: 1, Client: 1, Key: "k", Limit: 3, Acquired: s(0.5), End: s(5)},
			{ID: 2, Client: 2, Key: "k", Limit: 3, Acquired: s(0.6), End: s(5)},
		}, []Attempt{
			{Client: 9, Key: "k", Call: s(1), Return: s(4), OK: true}, // past Arrival + Base
		}, nil, map[string]int{"k": 3}, false, ""},
		{"a semaphore's waiter behind its holders", []Hold{
			{ID: 1, Client: 1, Key: "k", Limit: 3, Acquired: s(0.5), End: s(3)},
			{ID: 2, Client: 2, Key: "k", Limit: 3, Acquired: s(0.6), End: s(3)},
			{ID: 3, Client: 3, Key: "k", Limit: 3, Acquired: s(0.7), End: s(3.2)},
		}, []Attempt{
			{Client: 9, Key: "k", Call: s(1), Return: s(3.1), OK: true},
		}, nil, map[string]int{"k": 3}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := &Snapshot{Holds: tt.holds, Attempts: tt.attempts, Faults: tt.faults, Limits: tt.limits}
			r := CheckStarvation(snap, b)
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			assert.Contains(t, r.Summary, tt.judged)
			if !tt.ok {
				require.NotEmpty(t, r.Violations)
				assert.NotEmpty(t, r.Violations[0].Excerpt)
			}
		})
	}
	t.Run("the overtakes are counted", func(t *testing.T) {
		r := CheckStarvation(&Snapshot{Holds: chain, Attempts: append(append([]Attempt{}, chainAtts...), far)}, b)
		require.False(t, r.OK)
		var v *Violation
		for i := range r.Violations {
			if r.Violations[i].Msg[:len("client 9 ")] == "client 9 " {
				v = &r.Violations[i]
			}
		}
		require.NotNil(t, v, "%+v", r.Violations)
		assert.Contains(t, v.Msg, "waited 10.000s")
		assert.Regexp(t, `meanwhile [1-9][0-9]+ grants went to requests made after it`, v.Msg)
	})
}
