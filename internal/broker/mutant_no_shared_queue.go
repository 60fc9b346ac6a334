//go:build mutant_no_shared_queue

package broker

// A mutant build: lock waiters ignore the shared queue, and a release
// hands the key to this replica's oldest waiter however long the chain
// (see mutant_off.go).
const (
	mutantNoLossNotice  = false
	mutantNoResumeFence = false
	mutantNoSharedQueue = true
)
