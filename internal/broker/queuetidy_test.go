package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	lockCycle(t, b, key) // the pool fills, the key exists
	time.Sleep(500 * time.Millisecond)
	before := store.OpCounts()
	const cycles = 40
	for range cycles {
		lockCycle(t, b, key)
	}
	time.Sleep(300 * time.Millisecond) // a background tidy would have read by now
	after := store.OpCounts()
	d := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	t.Logf("%d cycles: Consul calls %v", cycles, d)
	assert.Equal(t, uint64(2*cycles), d["kv_txn_write"], "one grant and one release transaction a cycle")
	assert.Zero(t, d["kv_list"], "no read")
}

// lockCycle takes key, releases it with its token, and waits for the
// hold's end.
func lockCycle(t *testing.T, b *broker.Broker, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(chan broker.Event, 16)
	done := make(chan error, 1)
	go func() {
		done <- b.Acquire(ctx, &broker.AcquireSpec{Key: key, WaitForever: true}, func(e broker.Event) error {
			events <- e
			return nil
		})
	}()
	var seq *broker.Sequencer
	for seq == nil {
		select {
		case e := <-events:
			if e.Kind == broker.EventAcquired {
				s := e.Sequencer
				seq = &s
			}
		case err := <-done:
			t.Fatalf("Acquire %s ended before its grant: %v", key, err)
		}
	}
	ok, err := b.Release(ctx, key, seq.Session, seq.Token)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, <-done)
}
