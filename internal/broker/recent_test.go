package broker

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recentReleases answers for recentTTL, forgets in the order releases came
// (a key noted again stays until its last note is old), holds at most
// recentMax, and its queue stays within twice what it holds.
func TestRecentReleases(t *testing.T) {
	t0 := time.Now()
	r := newRecentReleases()
	r.note("a", t0)
	r.note("b", t0.Add(30*time.Second))
	r.note("c", t0)
	r.note("c", t0.Add(50*time.Second)) // noted again
	assert.True(t, r.has("a", t0.Add(59*time.Second)))
	assert.False(t, r.has("a", t0.Add(61*time.Second)), "older than recentTTL")
	assert.False(t, r.has("x", t0))

	r.note("d", t0.Add(61*time.Second))
	assert.NotContains(t, r.at, "a", "forgotten once old")
	assert.True(t, r.has("b", t0.Add(61*time.Second)))
	assert.True(t, r.has("c", t0.Add(70*time.Second)), "its first note expired, its second did not")
	assert.Len(t, r.at, 3)

	// At most recentMax: the oldest go first.
	r = newRecentReleases()
	for i := range recentMax + 10 {
		r.note(strconv.Itoa(i), t0)
	}
	assert.Len(t, r.at, recentMax)
	assert.NotContains(t, r.at, "9")
	assert.Contains(t, r.at, "10")
	assert.Contains(t, r.at, strconv.Itoa(recentMax+9))

	// A steady 1,000 releases a second: 60 s of them are kept, and the
	// queue gives back what it forgot.
	r = newRecentReleases()
	for i := range 300_000 {
		r.note(strconv.Itoa(i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.Len(t, r.at, 60_000)
	assert.Equal(t, 60_000, len(r.order)-r.head)
	assert.LessOrEqual(t, len(r.order), 2*60_000+1024)
	assert.True(t, r.has("299999", t0.Add(300*time.Second)))
	assert.False(t, r.has("239999", t0.Add(300*time.Second)))
}
