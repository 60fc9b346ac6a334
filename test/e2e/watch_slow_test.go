package e2e

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// A watcher that reads nothing for 10s while its key changes 1,000 times
// costs the broker nothing that grows with the backlog: once it reads
// again it gets the newest state at once.
//
// Two keys change at once: one whose states are big (16 KiB values: a
// backlog of 16 MB, far beyond what gRPC buffers for one stream), one
// whose states are small (a leader's address: ~100 bytes a state). gRPC
// buffers up to ~128 KiB per stream before the broker's Send blocks (the
// server's fixed 64 KiB write quota plus the client's 64 KiB stream
// window), and the broker can only drop states once Send blocks. So the
// big states' watcher reads far fewer than 1,000 messages and is told in
// `skipped` what it missed, while the small states' watcher reads every
// one of its ~1,000 states from the gRPC buffers: fast, but nothing is
// dropped because nothing had to be.
func TestWatchSlowObserverGetsNewestState(t *testing.T) {
	const (
		changes = 1000
		stall   = 10 * time.Second
	)
	type slowKey struct {
		name, key string
		value     func(i int) []byte
		// fewer: the watcher must read far fewer messages than changes.
		fewer bool
		// writers change the value at once (for speed with big values).
		writers int

		seq    *lockbrokerv1.Sequencer
		stream lockbrokerv1.LockService_WatchClient
		cancel context.CancelFunc
	}
	big := func(i int) []byte {
		v := make([]byte, 16<<10)
		copy(v, fmt.Sprintf("v%04d", i))
		return v
	}
	small := func(i int) []byte { return []byte(fmt.Sprintf("10.0.%d.%d:8080", i/256, i%256)) }
	keys := []*slowKey{
		{name: "16 KiB states", key: "slow/big", value: big, fewer: true, writers: 4},
		{name: "small states", key: "slow/small", value: small, writers: 1},
	}
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)

	for _, k := range keys {
		holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: k.key, Value: k.value(0), Session: fast()})
		k.seq = holder.acquired(5 * time.Second).GetSequencer()
		// The slow watcher: its first state is read, then nothing until
		// the changes are done and the stall is over.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ws, err := r.Locks(t).Watch(ctx, &lockbrokerv1.WatchRequest{Key: k.key})
		require.NoError(t, err)
		for { // until it shows the holder (the first state may lag: see TestWatchFirstStateIsNotOlderThanAKnownGrant)
			first, err := ws.Recv()
			require.NoError(t, err)
			if wtHeldBy(k.seq.GetSessionId())(first.GetState()) {
				break
			}
		}
		k.stream, k.cancel = ws, cancel
	}

	heapBefore := wtHeapInuse()
	stalled := time.Now()
	// Each key's holder changes its value 1,000 times (big values with
	// several writers at once, for speed), the final value last.
	setValue := func(k *slowKey, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: k.key, SessionId: k.seq.GetSessionId(), Value: k.value(i), Token: k.seq.GetToken()}); err != nil {
			t.Errorf("%s: SetValue %d: %v", k.name, i, err)
		}
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		for w := range k.writers {
			wg.Go(func() {
				for i := 1 + w; i < changes; i += k.writers {
					setValue(k, i)
				}
			})
		}
	}
	wg.Wait()
	for _, k := range keys {
		setValue(k, changes)
	}
	wrote := time.Since(stalled)
	heapAfter := wtHeapInuse()
	t.Logf("%d changes of each key written in %s", changes, wrote.Round(time.Millisecond))
	t.Logf("heap in use (broker, clients and test in one process): %.1f MiB before the changes, %.1f MiB after (%+.1f MiB), with both watchers stalled",
		float64(heapBefore)/(1<<20), float64(heapAfter)/(1<<20), (float64(heapAfter)-float64(heapBefore))/(1<<20))
	assert.Less(t, int64(heapAfter)-int64(heapBefore), int64(20<<20), "the heap does not grow with a 16 MB backlog")
	require.False(t, t.Failed())

	if rest := stall - time.Since(stalled); rest > 0 {
		time.Sleep(rest) // the 10 seconds of not reading
	}

	for _, k := range keys {
		final := k.value(changes)
		start := time.Now()
		var (
			read    int
			skipped uint64
			last    *lockbrokerv1.LockState
		)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				resp, err := k.stream.Recv()
				if err != nil {
					t.Errorf("%s: the slow watcher's stream ended: %v", k.name, err)
					return
				}
				read++
				skipped += resp.GetSkipped()
				last = resp.GetState()
				if len(last.GetHolders()) == 1 && bytes.Equal(last.GetHolders()[0].GetValue(), final) {
					return
				}
			}
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			k.cancel() // ends Recv
			<-done
			t.Fatalf("%s: the slow watcher did not get the final value within 5s (read %d)", k.name, read)
		}
		took := time.Since(start)
		t.Logf("%s: the slow watcher read %d messages in %s, skipped %d in all", k.name, read, took.Round(time.Millisecond), skipped)
		assert.Less(t, took, time.Second, "%s: the final state comes promptly", k.name)
		assert.Equal(t, k.seq.GetToken(), last.GetHolders()[0].GetToken(), "%s: SetValue keeps the token", k.name)
		assert.LessOrEqual(t, uint64(read)+skipped, uint64(changes), "%s: read + skipped never exceeds the changes", k.name)
		if k.fewer {
			assert.Positive(t, skipped, "%s: the broker reports the states it dropped", k.name)
			assert.Less(t, read, changes/10, "%s: far fewer messages than changes", k.name)
		}
	}
}

// wtHeapInuse is the process's heap in use after a full collection.
func wtHeapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
