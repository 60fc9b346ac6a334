package consulstore

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestEncodeTxnMatchesAPI: the hand-written body means to Consul what
// api.TxnOps encodes to (the same JSON value), for awkward keys, values
// and numbers.
func TestEncodeTxnMatchesAPI(t *testing.T) {
	keys := []string{"", "a/b", `q"uote\back`, "ctl\x00\x01\x1f\x7f", "tab\t\n\r", "é/ü/\u2028\u2029", "<html>&", "bad\xffutf8\xc3", strings.Repeat("k", 600)}
	values := [][]byte{nil, {}, []byte("v"), {0, 0xff, 0xfe}, make([]byte, 1000)}
	var ops []broker.Op
	for i, k := range keys {
		ops = append(ops, broker.Op{Verb: broker.OpLock, Key: k, Value: values[i%len(values)], Flags: math.MaxUint64 - uint64(i),
			Index: uint64(i), Session: "6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50"})
	}
	ops = append(ops, broker.Op{Verb: broker.OpGet, Key: "k"}, broker.Op{Verb: broker.OpCheckNotExists, Key: "k", Session: "s\x01"})
	for n := 1; n <= len(ops); n++ {
		want, err := json.Marshal(txnOps(ops[:n]))
		require.NoError(t, err)
		got := encodeTxn(ops[:n])
		assert.Equal(t, decodeOps(t, want), decodeOps(t, got), "ops[:%d]: %s", n, got)
	}
}

// decodeOps decodes a txn body with exact numbers, leaving out the null
// Node, Service and Check of api.TxnOp (Consul reads null as absent).
func decodeOps(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var ops []map[string]any
	require.NoError(t, d.Decode(&ops), "%s", body)
	for _, op := range ops {
		for k, v := range op {
			if v == nil {
				delete(op, k)
			}
		}
	}
	return ops
}

// BenchmarkTxn is one lock and one unlock transaction, through the hand
// path and through api.Txn (a Store without its txnEndpoint), on one
// agent.
func BenchmarkTxn(b *testing.B) {
	agent := consultest.Start(b)
	s, err := Open(agent.Config(), Options{})
	require.NoError(b, err)
	defer s.Close()
	id, err := s.CreateSession(b.Context(), broker.SessionSpec{Name: "bench", TTL: 30 * time.Second})
	require.NoError(b, err)
	viaAPI := New(s.Client(), 0) // same client, no txnEndpoint
	for _, bm := range []struct {
		name string
		s    *Store
	}{{"hand", s}, {"api", viaAPI}} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, verb := range []broker.OpVerb{broker.OpLock, broker.OpUnlock} {
					if _, err := bm.s.Txn(b.Context(), []broker.Op{{Verb: verb, Key: "bench/txn", Value: []byte("v"), Session: id}}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
