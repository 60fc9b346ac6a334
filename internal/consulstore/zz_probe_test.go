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

var probeIdle = flag.Duration("probe.idle", 20*time.Millisecond, "")

func TestZZProbeTxnSize(t *testing.T) {
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
	rec := make([]byte, 300)
	lock := func(k, id string) {
		_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: k, Value: []byte("v"), Session: id}})
		require.NoError(t, err)
	}
	modes := []string{"kvrelease", "txn1", "txn2", "txn4", "txn4small"}
	lat := map[string][]time.Duration{}
	for i := range 1000 {
		m := modes[i%len(modes)]
		k := fmt.Sprintf("probe/%d", i)
		lock(k, s1)
		time.Sleep(*probeIdle)
		t0 := time.Now()
		switch m {
		case "kvrelease":
			_, _, err = kv.Release(&api.KVPair{Key: k, Session: s1, Value: []byte("v")}, nil)
		case "txn1":
			_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1}})
		case "txn2":
			_, err = s.Txn(ctx, []broker.Op{
				{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1},
				{Verb: broker.OpLock, Key: k, Value: []byte("w"), Session: s2},
			})
		case "txn4small":
			_, err = s.Txn(ctx, []broker.Op{
				{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1},
				{Verb: broker.OpSet, Key: "probe/rec/" + s1, Value: []byte("x")},
				{Verb: broker.OpLock, Key: k, Value: []byte("w"), Session: s2},
				{Verb: broker.OpSet, Key: "probe/rec/" + s2, Value: []byte("x")},
			})
		case "txn4":
			_, err = s.Txn(ctx, []broker.Op{
				{Verb: broker.OpUnlock, Key: k, Value: []byte("v"), Session: s1},
				{Verb: broker.OpSet, Key: "probe/rec/" + s1, Value: rec},
				{Verb: broker.OpLock, Key: k, Value: []byte("w"), Session: s2},
				{Verb: broker.OpSet, Key: "probe/rec/" + s2, Value: rec},
			})
		}
		lat[m] = append(lat[m], time.Since(t0))
		require.NoError(t, err)
		if m == "txn4" || m == "txn2" || m == "txn4small" {
			_, err = s.Txn(ctx, []broker.Op{{Verb: broker.OpUnlock, Key: k, Session: s2}})
			require.NoError(t, err)
		}
	}
	for _, m := range modes {
		l := lat[m]
		slices.Sort(l)
		t.Logf("%-10s p50 %v p90 %v", m, l[len(l)/2], l[len(l)*9/10])
	}
}
