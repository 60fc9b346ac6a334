package tenant

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBucket: a burst of rate calls, then one per 1/rate, with the wait
// until the next token.
func TestBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBucket(4)
	for i := range 4 {
		ok, _ := b.Take(now)
		assert.True(t, ok, "call %d of the burst", i)
	}
	ok, wait := b.Take(now)
	assert.False(t, ok)
	assert.Equal(t, 250*time.Millisecond, wait)
	ok, _ = b.Take(now.Add(250 * time.Millisecond))
	assert.True(t, ok)
	ok, _ = b.Take(now.Add(300 * time.Millisecond))
	assert.False(t, ok)
	// Idle for long: never more than the burst.
	later := now.Add(time.Hour)
	n := 0
	for {
		if ok, _ := b.Take(later); !ok {
			break
		}
		n++
	}
	assert.Equal(t, 4, n)

	// Rate 0: no limit.
	free := NewBucket(0)
	for range 100 {
		ok, _ := free.Take(now)
		assert.True(t, ok)
	}
	// A lower rate keeps no more than the new burst.
	b.SetRate(1)
	ok, _ = b.Take(later.Add(time.Hour))
	assert.True(t, ok)
	ok, wait = b.Take(later.Add(time.Hour))
	assert.False(t, ok)
	assert.Equal(t, time.Second, wait)
}
