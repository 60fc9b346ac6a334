//go:build mutant_no_resume_fence

package broker

// A mutant build: a replica writes for sessions it no longer owns (see
// mutant_off.go).
const (
	mutantNoLossNotice  = false
	mutantNoResumeFence = true
	mutantNoSharedQueue = false
)
