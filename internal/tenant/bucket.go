package tenant

import (
	"math"
	"sync"
	"time"
)

// Bucket is a token bucket: it holds up to burst tokens, gains rate
// tokens per second, and each call takes one. Safe for concurrent use.
type Bucket struct {
	mu       sync.Mutex
	rate     float64
	minBurst float64
	burst    float64
	tokens   float64
	last     time.Time
}

// NewBucket returns a full bucket of rate tokens per second whose burst is
// the rate (at least 1). A rate of 0 or less never refuses.
func NewBucket(rate float64) *Bucket {
	return NewBucketMin(rate, 1)
}

// NewBucketMin is NewBucket with a burst of at least minBurst: a bucket of
// bytes whose single take may be larger than a second's worth.
func NewBucketMin(rate, minBurst float64) *Bucket {
	b := &Bucket{minBurst: math.Max(1, minBurst)}
	b.SetRate(rate)
	b.tokens = b.burst
	return b
}

// SetRate changes the rate (and burst) and keeps the tokens already
// earned, up to the new burst.
func (b *Bucket) SetRate(rate float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rate = rate
	b.burst = math.Max(math.Max(1, b.minBurst), math.Ceil(rate))
	b.tokens = math.Min(b.tokens, b.burst)
}

// Take takes a token at now. When none is left it takes nothing and says
// how long until one will be.
func (b *Bucket) Take(now time.Time) (ok bool, wait time.Duration) {
	return b.TakeN(now, 1)
}

// TakeN takes n tokens at now (n no more than the burst). When fewer are
// left it takes nothing and says how long until n will be.
func (b *Bucket) TakeN(now time.Time, n float64) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate <= 0 {
		return true, 0
	}
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = math.Min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
	n = math.Min(n, b.burst)
	if b.tokens >= n {
		b.tokens -= n
		return true, 0
	}
	return false, time.Duration((n - b.tokens) / b.rate * float64(time.Second))
}
