package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestReach: the replica counts as cut off from Consul once no probe has
// been answered for reachGrace of ticks; an answer ends it; a gap in the
// ticks (the process stopped) is not held against Consul.
func TestReach(t *testing.T) {
	r := newReach()
	t0 := r.lastOK
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// tick judges every reachTick over (from, to]; it returns when the
	// replica was first judged cut off (0: not).
	tick := func(from, to time.Duration) time.Duration {
		for d := from + reachTick; d <= to; d += reachTick {
			if r.judge(at(d)) {
				return d
			}
		}
		return 0
	}
	r.judge(t0)
	lost := r.lost()
	assert.Equal(t, reachGrace, tick(0, 10*time.Second), "no answer for reachGrace")
	assert.True(t, isClosed(lost), "waiters told")
	assert.Zero(t, tick(reachGrace, 10*time.Second), "told once")

	// Answered again: a new channel, open, for the waiters to come.
	assert.True(t, r.answered(at(10*time.Second)), "was cut off")
	assert.False(t, isClosed(r.lost()))
	assert.True(t, isClosed(lost), "the old channel stays closed")
	assert.False(t, r.answered(at(10*time.Second)), "was not cut off")

	// Answers every 2 s (a slow agent): never cut off.
	for d := 10 * time.Second; d < 30*time.Second; d += 2 * time.Second {
		assert.Zero(t, tick(d, d+2*time.Second), "at %v", d)
		r.answered(at(d + 2*time.Second))
	}
	// An answer with an older time does not move the count back.
	r.answered(at(25 * time.Second))
	assert.Equal(t, 33*time.Second, tick(30*time.Second, 40*time.Second))

	// Stopped 12 s (the ticks 12 s apart), then nothing answered: the
	// count starts when it runs again.
	r.answered(at(40 * time.Second))
	assert.Zero(t, tick(40*time.Second, 41*time.Second))
	assert.False(t, r.judge(at(53*time.Second)), "a wake is not a cut")
	assert.Equal(t, 56*time.Second, tick(53*time.Second, 60*time.Second), "3 s after the wake")
}
