package broker

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzEncodeRecord: encodeRecord writes exactly what json.Marshal writes,
// for plain and escaped strings, empty and nil maps alike.
func FuzzEncodeRecord(f *testing.F) {
	f.Add("replica-1", "", false, uint64(0), "a/b,c/d", int64(1700000000000), uint64(0), uint8(0))
	f.Add("", "team<a>&b", true, uint64(17), "k\x00\"\\/é,\u2028,z", int64(-1), uint64(1<<63), uint8(7))
	f.Add("r", "t", false, uint64(1), "", int64(0), uint64(5), uint8(2))
	f.Add("r", "", false, uint64(3), "q/hot,x", int64(0), uint64(9), uint8(8))
	f.Add("r", "", false, uint64(3), "q/h\"ot", int64(0), uint64(9), uint8(9))
	f.Fuzz(func(t *testing.T, owner, tenant string, del bool, prev uint64, keys string, since int64, token uint64, shape uint8) {
		r := &record{Owner: owner, Tenant: tenant, Delete: del, Prev: prev}
		if shape&1 == 0 {
			r.Holds = map[string]uint64{}
		}
		if shape&2 != 0 {
			r.Since = map[string]int64{}
		}
		if shape&4 != 0 {
			r.Again = map[string]bool{}
		}
		if shape&8 != 0 {
			r.Waiting, _, _ = strings.Cut(keys, ",") // the key a ticket waits for
		}
		for i, k := range strings.Split(keys, ",") {
			if r.Holds != nil {
				r.Holds[k] = token + uint64(i)
			}
			if r.Since != nil {
				r.Since[k] = since - int64(i)
			}
			if r.Again != nil {
				r.Again[k] = i%2 == 0
			}
		}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := encodeRecord(r); !bytes.Equal(got, want) {
			t.Fatalf("encodeRecord\n got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkEncodeRecord(b *testing.B) {
	r := newRecord("d0a5c1a4-5d2e-4f0a-9f3a-1c2b3d4e5f60", "replica-7f3a").with("bench/handoff/broker/0", false)
	b.Run("hand-written", func(b *testing.B) {
		for b.Loop() {
			_ = encodeRecord(r)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(r)
		}
	})
}
