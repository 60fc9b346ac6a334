//go:build !mutant_rw_reader_beside_writer && !mutant_rw_stale_token && !mutant_multi_partial

package broker

// Mutants of read-write and multi-key locks (issue 43), as in
// mutant_off.go: deliberately broken builds the chaos suite must catch.
const (
	// mutantRWReaderBesideWriter grants a reader while a writer holds
	// (build tag mutant_rw_reader_beside_writer; rwGrantable).
	mutantRWReaderBesideWriter = false
	// mutantRWStaleToken makes a read-write grant report its key's
	// CreateIndex as its token, never above the previous grant's (build
	// tag mutant_rw_stale_token; rwToken).
	mutantRWStaleToken = false
	// mutantMultiPartial takes the keys of a multi-key request in
	// separate transactions, one by one (build tag mutant_multi_partial).
	mutantMultiPartial = false
)
