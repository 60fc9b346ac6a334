package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestEnter: a request is refused while the replica counts as cut off; one
// admitted before the cut has its context cancelled by it, and leave then
// gives the REPLICA_CUT_OFF to answer; one that ends first, or whose own
// caller gave up, keeps its own answer.
func TestEnter(t *testing.T) {
	b := &Broker{reach: newReach()}
	t0 := b.reach.lastOK
	// cutAt judges every reachTick from from on, until the cut.
	cutAt := func(from time.Duration) {
		for d := from; d <= from+2*reachGrace; d += reachTick {
			if b.reach.judge(t0.Add(d)) {
				return
			}
		}
		t.Fatalf("no cut judged from %v on", from)
	}

	// Admitted, and done before the cut.
	ctx, leave, err := b.Enter(context.Background())
	require.NoError(t, err)
	assert.NoError(t, leave())
	assert.Error(t, ctx.Err(), "left: its context ends")

	// Admitted, then caught by the cut.
	ctx, leave, err = b.Enter(context.Background())
	require.NoError(t, err)
	cutAt(0)
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the cut did not end the request's context")
	}
	r, _ := ReasonOf(leave())
	assert.Equal(t, ReasonReplicaCutOff, r)

	// Refused while cut off, at once.
	_, _, err = b.Enter(context.Background())
	r, _ = ReasonOf(err)
	assert.Equal(t, ReasonReplicaCutOff, r)
	assert.Equal(t, err.Error(), b.Admit().Error())

	// Answered again: admitted; a caller that gave up keeps its own error.
	assert.True(t, b.reach.answered(t0.Add(10*time.Second)))
	assert.NoError(t, b.Admit())
	parent, cancel := context.WithCancel(context.Background())
	ctx, leave, err = b.Enter(parent)
	require.NoError(t, err)
	cancel()
	<-ctx.Done()
	cutAt(10 * time.Second)
	assert.NoError(t, leave(), "the caller's own cancel, not the cut")
}
