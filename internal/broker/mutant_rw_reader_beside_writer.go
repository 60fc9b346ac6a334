//go:build mutant_rw_reader_beside_writer

package broker

// A mutant build (see mutant_issue43_off.go).
const (
	mutantRWReaderBesideWriter = true
	mutantRWStaleToken         = false
	mutantMultiPartial         = false
)
