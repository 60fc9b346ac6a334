//go:build mutant_multi_partial

package broker

// A mutant build (see mutant_issue43_off.go).
const (
	mutantRWReaderBesideWriter = false
	mutantRWStaleToken         = false
	mutantMultiPartial         = true
)
