//go:build mutant_rw_stale_token

package broker

// A mutant build (see mutant_issue43_off.go).
const (
	mutantRWReaderBesideWriter = false
	mutantRWStaleToken         = true
	mutantMultiPartial         = false
)
