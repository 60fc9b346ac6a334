//go:build mutant_no_loss_notice

package broker

// A mutant build: holds never send `lost` (see mutant_off.go).
const (
	mutantNoLossNotice  = true
	mutantNoResumeFence = false
	mutantNoSharedQueue = false
)
