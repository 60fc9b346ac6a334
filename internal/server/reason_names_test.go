package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLostReasonNames: the broker's log spells each loss reason as the
// API does, without LOST_REASON_ (the libraries and lockctl do the same).
func TestLostReasonNames(t *testing.T) {
	for r, p := range reasons {
		assert.Equal(t, p.String(), "LOST_REASON_"+r.String())
	}
}
