package consulstore

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

var (
	txnCost     = flag.Bool("txncost", false, "run TestTxnCost (prints figures, asserts nothing)")
	txnCostIdle = flag.Duration("txncost.idle", 20*time.Millisecond, "idle before each measured call")
	txnCostN    = flag.Int("txncost.n", 1000, "measured calls in all, spread over the kinds")
)

// TestTxnCost prints what a Raft write costs in Consul by its shape, after
// an idle (as a hand-off's release comes after its waiter queued): a KV
// release as api.Lock's Unlock makes it, and transactions of 1, 2 and 4
// ops through this Store (4 is a hand-off: unlock and the holder's record,
// lock and the waiter's record), and a 1-op transaction through api.Txn
// (what Consul's transaction endpoint costs beside its KV endpoint, with
// the same HTTP client). Kinds take turns, so each sees the same machine. Run: go test ./internal/consulstore/ -run TestTxnCost -v -args -txncost
func TestTxnCost(t *testing.T) {
	if !*txnCost {
		t.Skip("run with -txncost")
	}
	agent := consultest.Start(t)
	s, err := Open(agent.Config(), Options{})
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	s1, err := s.CreateSession(ctx, broker.SessionSpec{Name: "a", TTL: 60 * time.Second})
	require.NoError(t, err)
	s2, err := s.CreateSession(ctx, broker.SessionSpec{Name: "b", TTL: 60 * time.Second})
	require.NoError(t, err)
	kv := s.Client().KV()
	rec := make([]byte, 200) // about a record's size
	kinds := []string{"kv release", "txn 1 op (unlock)", "txn 2 ops (unlock, lock)", "txn 4 ops (hand-off shape)", "api.Txn 1 op (unlock)"}
	lat := map[string][]time.Duration{}
	for i := range *txnCostN {
		kind := kinds[i%len(kinds)]
		k := fmt.Sprintf("txncost/%d", i)
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: k, Value: []byte("v"), Session: s1}})
		require.NoError(t, err)
		time.Sleep(*txnCostIdle)
		t0 := time.Now()
		switch i % len(kinds) {
		case 0:
			_, _, err = kv.Release(&api.KVPair{Key: k, Session: s1, Value: []byte("v")}, nil)
		case 1:
			_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1}})
		case 2:
			_, err = s.Txn(ctx, []broker.Op{
				{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1},
				{Verb: broker.OpLock, Key: k, Value: []byte("w"), Session: s2},
			})
		case 3:
			_, err = s.Txn(ctx, []broker.Op{
				{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1},
				{Verb: broker.OpSet, Key: "txncost/rec/" + s1, Value: rec},
				{Verb: broker.OpLock, Key: k, Value: []byte("w"), Session: s2},
				{Verb: broker.OpSet, Key: "txncost/rec/" + s2, Value: rec},
			})
		case 4:
			_, _, _, err = s.Client().Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: k, Value: []byte("v"), Session: s1}}}, nil)
		}
		lat[kind] = append(lat[kind], time.Since(t0))
		require.NoError(t, err)
		if i%len(kinds) == 2 || i%len(kinds) == 3 {
			_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: k, Session: s2}})
			require.NoError(t, err)
		}
	}
	fmt.Printf("# Consul write by shape after %s idle (n=%d each)\n", *txnCostIdle, *txnCostN/len(kinds))
	for _, kind := range kinds {
		l := lat[kind]
		slices.Sort(l)
		fmt.Printf("%-28s p50 %7.0f µs   p90 %7.0f µs\n", kind, float64(l[len(l)/2].Microseconds()), float64(l[len(l)*9/10].Microseconds()))
	}
}
