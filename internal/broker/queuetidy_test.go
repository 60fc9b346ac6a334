package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// An uncontended lock cycle pays nothing for the shared queue's tidying
// (a hold that never queued, on a key whose view shows no queue, ends
// without a read): one granting and one releasing transaction a cycle on
// a pooled session, and no listing.
func TestUncontendedCycleTidiesNothing(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop(), broker.WithSessionPool())
	t.Cleanup(b.Close)
	const key = "tidycost/k"
	cycle(t, b, context.Background(), key) // the pool fills, the key exists
	time.Sleep(500 * time.Millisecond)
	before := store.OpCounts()
	const cycles = 40
	for range cycles {
		cycle(t, b, context.Background(), key)
	}
	time.Sleep(300 * time.Millisecond) // a background tidy would have read by now
	d := opsSince(store, before)
	t.Logf("%d cycles: Consul calls %v", cycles, d)
	assert.Equal(t, uint64(2*cycles), d["kv_txn_write"], "one grant and one release transaction a cycle")
	assert.Zero(t, d["kv_list"], "no read")
}

// opsSince is how many calls of each kind store made since before (an
// earlier OpCounts); kinds it made none of are left out.
func opsSince(store *consulstore.Store, before map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range store.OpCounts() {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}
