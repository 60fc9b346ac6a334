package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestStallAfter(t *testing.T) {
	s := time.Second
	for _, tt := range []struct {
		d, grace, want time.Duration
	}{
		{9 * s, 10 * s, 4050 * time.Millisecond}, // SIGTERM at 6 s: 0.45, not 0.6 (5.4 s, 0.6 s before it)
		{9 * s, 1 * s, 5 * s},                    // SIGTERM at 8 s: 3 s before it
		{9 * s, 0, 5400 * time.Millisecond},      // SIGTERM at 9 s: the libraries' share
		{54 * s, 10 * s, 32400 * time.Millisecond},
		{3 * s, 10 * s, 1350 * time.Millisecond}, // no room for an attempt: never below 0.45
	} {
		got := stallAfter(tt.d, tt.grace)
		assert.Equal(t, tt.want, got, "guarantee %v, grace %v", tt.d, tt.grace)
		stop := tt.d - min(tt.grace, tt.d/3)
		assert.Less(t, got, stop, "stalled before SIGTERM")
	}
}
