package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestReach(t *testing.T) {
	r := newReach()
	t0 := r.lastOK
	lost := r.lost()
	assert.False(t, r.judge(t0.Add(reachGrace-time.Millisecond)), "not yet")
	assert.False(t, isClosed(lost))
	assert.True(t, r.judge(t0.Add(reachGrace)), "no answer for reachGrace")
	assert.True(t, isClosed(lost), "waiters told")
	assert.False(t, r.judge(t0.Add(2*reachGrace)), "told once")
	// An answer to a probe started before the last one counts (Consul
	// answered), but does not move lastOK back.
	r2 := newReach()
	r2.answered(r2.lastOK.Add(time.Second))
	r2.answered(r2.lastOK.Add(-5 * time.Second))
	assert.False(t, r2.judge(r2.lastOK.Add(reachGrace-time.Millisecond)))

	// Answered again: a new channel, open, for the waiters to come.
	assert.True(t, r.answered(t0.Add(3*reachGrace)), "was cut off")
	assert.False(t, isClosed(r.lost()))
	assert.True(t, isClosed(lost), "the old channel stays closed")
	assert.False(t, r.answered(t0.Add(3*reachGrace)), "was not cut off")
}
