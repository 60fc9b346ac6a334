package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestRWBurstOneReplicaCosts: 16 readers arriving at once on one key of
// one replica are all granted together, with distinct tokens, each
// arrival costing about one transaction: the replica lines its arrivals
// up instead of letting them race each other's check-and-set of K (which
// cost about 70 transactions and 50 consistent reads per burst).
func TestRWBurstOneReplicaCosts(t *testing.T) {
	t.Parallel()
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop(), broker.WithSessionPool())
	t.Cleanup(b.Close)
	const readers = 16
	key := "rwburst/k"
	for burst := range 3 {
		before := store.OpCounts()
		var hs []*testHold
		for range readers {
			hs = append(hs, startHold(t, b, &broker.AcquireSpec{Key: key, Mode: broker.ModeRead, WaitForever: true}, nil))
		}
		tokens := map[uint64]bool{}
		var held []broker.Event
		for _, h := range hs {
			e := h.nextWithin(broker.EventAcquired, 20*time.Second)
			require.NotNil(t, e.Sequencer)
			assert.True(t, e.Sequencer.Read)
			assert.False(t, tokens[e.Sequencer.Token], "token %d granted twice", e.Sequencer.Token)
			tokens[e.Sequencer.Token] = true
			held = append(held, e)
		}
		after := store.OpCounts()
		writes := after["kv_txn_write"] - before["kv_txn_write"]
		lists := after["kv_list"] - before["kv_list"]
		t.Logf("burst %d: %d transactions, %d consistent reads until all %d granted", burst, writes, lists, readers)
		assert.LessOrEqual(t, writes, uint64(readers+4), "about one transaction per arrival")
		assert.LessOrEqual(t, lists, uint64(4), "no read per lost race")
		for i, h := range hs {
			ok, err := b.Release(context.Background(), key, held[i].Sequencer.Session, held[i].Sequencer.Token)
			require.NoError(t, err)
			require.True(t, ok, fmt.Sprintf("release %d", i))
			h.nextWithin(broker.EventReleased, 10*time.Second)
		}
	}
}
