package fuzz

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteSeedCorpus regenerates the committed seed corpora under
// testdata/fuzz from the seeds in the fuzz targets:
//
//	FUZZ_WRITE_CORPUS=1 go test -run TestWriteSeedCorpus ./test/fuzz
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("FUZZ_WRITE_CORPUS") == "" {
		t.Skip("set FUZZ_WRITE_CORPUS=1 to rewrite testdata/fuzz")
	}
	write := func(target, name, body string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("go test fuzz v1\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range requestSeeds() {
		write("FuzzRequests", fmt.Sprintf("seed-%02d-%s", i, requestKinds[int(s.kind)%len(requestKinds)]),
			fmt.Sprintf("byte(%q)\n[]byte(%q)\n", rune(s.kind), s.data))
	}
	for i, body := range semaphoreSeeds {
		write("FuzzSemaphoreLock", fmt.Sprintf("seed-%02d", i), fmt.Sprintf("[]byte(%q)\nbool(%v)\n", body, i%7 != 6))
	}
	for i, s := range acquireSeeds {
		write("FuzzAcquireKinds", fmt.Sprintf("seed-%02d", i), fmt.Sprintf("byte(%q)\nuint32(%d)\nbyte(%q)\n[]byte(%q)\n", rune(s.kind), s.limit, rune(s.key), s.keys))
	}
	write("FuzzHoldStateMachine", "seed-00", fmt.Sprintf("[]byte(%q)\n", []byte{0, 1, 2, 3}))
}
