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

// An uncontended multi-key cycle costs Consul what a single key's does
// (issue 43, item 5): one granting and one releasing transaction on a
// pooled session, and no blocking query (its keys' watches start only
// when it must wait, or 200 ms after it subscribed, as a single hold's).
// Before, each of the 4 keys started a watch at once: ~8 queries a cycle.
func TestMultiKeyCycleCostsTwoTransactions(t *testing.T) {
	_, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop(), broker.WithSessionPool())
	t.Cleanup(b.Close)
	keys := []string{"multicost/a", "multicost/b", "multicost/c", "multicost/d"}
	multiCycle(t, b, keys) // the pool fills, the keys exist
	time.Sleep(500 * time.Millisecond)
	before := store.OpCounts()
	const cycles = 40
	start := time.Now()
	for range cycles {
		multiCycle(t, b, keys)
	}
	took := time.Since(start)
	d := opsSince(store, before)
	t.Logf("%d 4-key cycles in %v: Consul calls %v", cycles, took, d)
	assert.Equal(t, uint64(2*cycles), d["kv_txn_write"], "one grant and one release transaction a cycle")
	// The lazy watches may start while a cycle holds the keys when their
	// 200 ms are up (a listing each, then parked): a few per key over the
	// run, not some every cycle.
	assert.LessOrEqual(t, d["kv_watch"], uint64(4*2*(1+took/(200*time.Millisecond))), "blocking queries")
	assert.Zero(t, d["kv_list"], "no read")
}

// multiCycle takes keys as one multi-key lock, releases it through its
// last key, and waits for `released`.
func multiCycle(t *testing.T, b *broker.Broker, keys []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(chan broker.Event, 16)
	done := make(chan error, 1)
	go func() {
		done <- b.Acquire(ctx, &broker.AcquireSpec{Key: keys[0], Keys: keys[1:], WaitForever: true}, func(e broker.Event) error {
			events <- e
			return nil
		})
	}()
	var seqs []broker.Sequencer
	for seqs == nil {
		select {
		case e := <-events:
			if e.Kind == broker.EventAcquired {
				seqs = e.Sequencers
			}
		case err := <-done:
			t.Fatalf("Acquire %v ended before its grant: %v", keys, err)
		}
	}
	require.Len(t, seqs, len(keys))
	last := seqs[len(seqs)-1]
	ok, err := b.Release(ctx, last.Key, last.Session, last.Token)
	require.NoError(t, err)
	require.True(t, ok)
	for {
		select {
		case e := <-events:
			if e.Kind == broker.EventLost {
				t.Fatalf("%v lost instead of released: %+v", keys, e)
			}
		case err := <-done:
			require.NoError(t, err)
			return
		}
	}
}
