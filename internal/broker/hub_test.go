package broker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A parked watch (its holds all young) may be started again before its
// old query loop has returned: by a waiter's activation or by a timer.
// The old loop must not end its successor on the way out: the key would
// stay meant for a query of its own with none running, blind to every
// change (in the chaos suite: a destroyed session noticed only by the
// next renewal, 1.6 s late, and waiters never woken by other replicas).
// The hook restarts the watch exactly in that window; afterwards a change
// made in Consul must still reach the subscriber.
func TestParkedWatchRestartedBeforeItsLoopEnds(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{WaitTime: 5 * time.Second})
	core, logs := observer.New(zap.ErrorLevel)
	b := broker.New(store, zap.New(core))
	t.Cleanup(b.Close)
	kv := agent.Client().KV()
	key := "hub/park-restart"
	_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("v0")}, nil)
	require.NoError(t, err)

	var once sync.Once
	restarted := make(chan struct{})
	t.Cleanup(broker.SetParkedHook(func(k string) {
		if k == key {
			once.Do(func() { b.StartWatch(key); close(restarted) })
		}
	}))

	// The first subscriber's timer starts the watch at 200 ms, when it
	// stops being young. A second, young, subscribes and the first
	// leaves; the next change of the key returns the query with only
	// the young one left: the watch parks.
	_, _, closeFirst := b.SubscribeLazy(key)
	time.Sleep(250 * time.Millisecond)
	require.Equal(t, "dedicated", b.WatchMode(key), "the first subscriber is no longer young")
	wake, index, closeSecond := b.SubscribeLazy(key)
	t.Cleanup(closeSecond)
	closeFirst()
	_, err = kv.Put(&api.KVPair{Key: key, Value: []byte("v0.5")}, nil)
	require.NoError(t, err)
	select {
	case <-restarted:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch never parked")
	}

	// Once the subscriber is no longer young its watch runs, and a write
	// in Consul reaches it within the loss bound.
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, "dedicated", b.WatchMode(key), "a query of its own runs")
	for len(wake) > 0 {
		<-wake
	}
	_, err = kv.Put(&api.KVPair{Key: key, Value: []byte("v1")}, nil)
	require.NoError(t, err)
	written, _, err := kv.Get(key, nil)
	require.NoError(t, err)
	deadline := time.After(time.Second)
	for index() < written.ModifyIndex {
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("the write at index %d never reached the subscriber (watch %q, listing at %d)", written.ModifyIndex, b.WatchMode(key), index())
		}
	}
	assert.Zero(t, logs.Len(), "no broken watch had to be mended: %v", logs.All())
}
