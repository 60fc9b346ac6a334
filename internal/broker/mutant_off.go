//go:build !mutant_no_loss_notice && !mutant_no_resume_fence && !mutant_no_shared_queue

package broker

// Mutants: deliberately broken builds that the chaos suite's checkers must
// catch (make chaos-short MUTANT=...). A normal build has none.
const (
	// mutantNoLossNotice suppresses `lost` events (build tag
	// mutant_no_loss_notice).
	mutantNoLossNotice = false
	// mutantNoResumeFence lets a replica write for a session it no longer
	// owns (build tag mutant_no_resume_fence).
	mutantNoResumeFence = false
	// mutantNoSharedQueue makes lock waiters ignore the key's shared queue
	// as before it existed (build tag mutant_no_shared_queue): no tickets,
	// a release hands the key to this replica's oldest waiter, with no
	// bound on the chain (ticket.go, handoff.go).
	mutantNoSharedQueue = false
)
