package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// A watch of one key sends the state now, then every change, and "no
// holder" is a state of its own: an observer sees a resignation (Release),
// a failure (session destroyed in Consul) and the key's deletion, not only
// new holders.
func TestWatchKeySendsEveryState(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	const key = "svc/leader"
	o := wtObserve(t, "observer", c, key, false)

	type want struct {
		kind   lockbrokerv1.LockKind
		holder string // value of the single holder; "" for none
		token  uint64
	}
	var wants []want
	o.until(5*time.Second, "the state now", func(*lockbrokerv1.LockState) bool { return true })
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_NONE})

	a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("A"), Session: fast()})
	seqA := a.acquired(5 * time.Second).GetSequencer()
	o.until(5*time.Second, "A holding", wtHeldBy(seqA.GetSessionId()))
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK, holder: "A", token: seqA.GetToken()})

	// Resignation.
	_, err := c.Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seqA.GetSessionId(), Token: seqA.GetToken()})
	require.NoError(t, err)
	o.until(5*time.Second, "A's resignation", wtFree)
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK})

	b := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("B"), Session: fast()})
	seqB := b.acquired(5 * time.Second).GetSequencer()
	o.until(5*time.Second, "B holding", wtHeldBy(seqB.GetSessionId()))
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK, holder: "B", token: seqB.GetToken()})

	// Failure: B's session is destroyed in Consul.
	start := time.Now()
	_, err = agent.Client().Session().Destroy(seqB.GetSessionId(), nil)
	require.NoError(t, err)
	_, at := o.until(5*time.Second, "B's failure", wtFree)
	assert.Less(t, at.Sub(start), time.Second, "observer saw the failure after %s", at.Sub(start))
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK})

	// The key is deleted: kind NONE.
	_, err = agent.Client().KV().Delete(key, nil)
	require.NoError(t, err)
	o.until(5*time.Second, "the deletion", func(st *lockbrokerv1.LockState) bool {
		return st.GetKind() == lockbrokerv1.LockKind_LOCK_KIND_NONE
	})
	wants = append(wants, want{kind: lockbrokerv1.LockKind_LOCK_KIND_NONE})

	got, _ := o.responses()
	require.Len(t, got, len(wants), "every change once, nothing else: %s", wtDescribe(got))
	var lastIndex uint64
	for i, w := range wants {
		st := got[i].GetState()
		assert.Equal(t, key, st.GetKey())
		assert.Equal(t, w.kind, st.GetKind(), "state %d", i)
		assert.Zero(t, got[i].GetSkipped(), "state %d: a prompt reader skips nothing", i)
		assert.Greater(t, st.GetIndex(), lastIndex, "state %d: the index grows", i)
		lastIndex = st.GetIndex()
		if w.holder == "" {
			assert.Empty(t, st.GetHolders(), "state %d", i)
			continue
		}
		assert.Equal(t, uint32(1), st.GetLimit(), "state %d", i)
		if assert.Len(t, st.GetHolders(), 1, "state %d", i) {
			assert.Equal(t, w.holder, string(st.GetHolders()[0].GetValue()), "state %d", i)
			assert.Equal(t, w.token, st.GetHolders()[0].GetToken(), "state %d: the holder's token is its grant's", i)
		}
	}
}

// Every observer, holder and waiter of one key on a replica shares one
// Consul blocking query; a second key gets a second one.
func TestWatchObserversShareOneBlockingQuery(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	const key, other = "shared/key", "shared/other"
	require.Zero(t, r.Store.OpenBlockingQueries(), "nothing is watched yet")

	observers := make([]*wtObserver, 20)
	for i := range observers {
		c := r.Locks(t) // a connection each, as separate clients would
		observers[i] = wtObserve(t, "observer", c, key, false)
	}
	for _, o := range observers {
		o.until(5*time.Second, "the state now", func(*lockbrokerv1.LockState) bool { return true })
	}
	require.Eventually(t, func() bool { return r.Store.OpenBlockingQueries() == 1 }, 5*time.Second, 5*time.Millisecond)

	// Sample the count while holders come and go.
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			if n := r.Store.OpenBlockingQueries(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	c := r.Locks(t)
	a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("A"), Session: fast()})
	seqA := a.acquired(5 * time.Second).GetSequencer()
	b := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("B"), Session: fast()})
	b.next(5*time.Second, isQueued)
	for _, o := range observers {
		o.until(5*time.Second, "A holding", wtHeldBy(seqA.GetSessionId()))
	}
	a.cancel()
	seqB := b.acquired(5 * time.Second).GetSequencer()
	// (A change that lasts less than a blocking query's round trip may
	// reach no observer: wait for B's to be seen before ending it.)
	for _, o := range observers {
		o.until(5*time.Second, "B holding", wtHeldBy(seqB.GetSessionId()))
	}
	b.cancel()
	for _, o := range observers {
		o.until(5*time.Second, "B's resignation", wtFree)
	}
	close(stop)
	wg.Wait()
	assert.Equal(t, int64(1), peak.Load(), "20 observers, a holder and a waiter of one key share one blocking query")

	o2 := wtObserve(t, "other", r.Locks(t), other, false)
	o2.until(5*time.Second, "the state now", func(*lockbrokerv1.LockState) bool { return true })
	require.Eventually(t, func() bool { return r.Store.OpenBlockingQueries() == 2 }, 5*time.Second, 5*time.Millisecond, "a second key, a second query")
}

// A prefix watch streams the state of each lock and semaphore under the
// prefix (and at the prefix itself), one key per response, then each
// change; a key that disappears is reported with kind NONE. Plain KV
// entries, semaphore contender entries and siblings of the prefix are not
// locks under it and never appear.
func TestWatchPrefixStreamsEachLockAndSemaphore(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	kv := agent.Client().KV()

	a := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "fleet/a", Value: []byte("A"), Session: fast()})
	seqA := a.acquired(5 * time.Second).GetSequencer()
	var poolSeqs []*lockbrokerv1.Sequencer
	for _, v := range []string{"P1", "P2"} {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "fleet/pool", Value: []byte(v), Limit: 3, Session: fast()})
		poolSeqs = append(poolSeqs, s.acquired(5*time.Second).GetSequencer())
	}
	_, err := kv.Put(&api.KVPair{Key: "fleet/config", Value: []byte("plain")}, nil)
	require.NoError(t, err)
	sib := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "fleet2/x", Value: []byte("S"), Session: fast()})
	sib.acquired(5 * time.Second)

	o := wtObserve(t, "prefix observer", c, "fleet", true)
	of := func(key string, want func(*lockbrokerv1.LockState) bool) func(*lockbrokerv1.LockState) bool {
		return func(st *lockbrokerv1.LockState) bool { return st.GetKey() == key && want(st) }
	}

	// The state now: fleet/a and fleet/pool, in either order.
	initial := map[string]*lockbrokerv1.LockState{}
	for range 2 {
		resp, _ := o.until(5*time.Second, "an initial state", func(*lockbrokerv1.LockState) bool { return true })
		initial[resp.GetState().GetKey()] = resp.GetState()
	}
	require.Contains(t, initial, "fleet/a")
	require.Contains(t, initial, "fleet/pool")
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_LOCK, initial["fleet/a"].GetKind())
	assert.True(t, wtHeldBy(seqA.GetSessionId())(initial["fleet/a"]))
	pool := initial["fleet/pool"]
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, pool.GetKind())
	assert.Equal(t, uint32(3), pool.GetLimit())
	if assert.Len(t, pool.GetHolders(), 2) {
		assert.Equal(t, "P1", string(pool.GetHolders()[0].GetValue()), "oldest grant first")
		assert.Equal(t, "P2", string(pool.GetHolders()[1].GetValue()))
	}

	// Changes: a new lock, a lock at the prefix itself, a resignation, a
	// semaphore holder leaving, a deletion.
	b := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "fleet/b", Value: []byte("B"), Session: fast()})
	seqB := b.acquired(5 * time.Second).GetSequencer()
	o.until(5*time.Second, "fleet/b held", of("fleet/b", wtHeldBy(seqB.GetSessionId())))

	top := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "fleet", Value: []byte("T"), Session: fast()})
	seqTop := top.acquired(5 * time.Second).GetSequencer()
	o.until(5*time.Second, "fleet held", of("fleet", wtHeldBy(seqTop.GetSessionId())))

	_, err = c.Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: "fleet/a", SessionId: seqA.GetSessionId(), Token: seqA.GetToken()})
	require.NoError(t, err)
	o.until(5*time.Second, "fleet/a free", of("fleet/a", wtFree))

	_, err = c.Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: "fleet/pool", SessionId: poolSeqs[0].GetSessionId(), Token: poolSeqs[0].GetToken()})
	require.NoError(t, err)
	o.until(5*time.Second, "fleet/pool down to P2", of("fleet/pool", func(st *lockbrokerv1.LockState) bool {
		return len(st.GetHolders()) == 1 && string(st.GetHolders()[0].GetValue()) == "P2"
	}))

	_, err = kv.Delete("fleet/b", nil)
	require.NoError(t, err)
	o.until(5*time.Second, "fleet/b gone", of("fleet/b", func(st *lockbrokerv1.LockState) bool {
		return st.GetKind() == lockbrokerv1.LockKind_LOCK_KIND_NONE && len(st.GetHolders()) == 0
	}))

	got, _ := o.responses()
	markers := 0
	for i, resp := range got {
		if resp.GetSnapshotComplete() {
			// The initial burst (fleet/a and fleet/pool) ends with one
			// marker that carries no state, before any change.
			markers++
			assert.Nil(t, resp.GetState(), "the snapshot marker carries no state")
			assert.Equal(t, 2, i, "the marker follows the initial states: %s", wtDescribe(got))
			continue
		}
		assert.Contains(t, []string{"fleet", "fleet/a", "fleet/b", "fleet/pool"}, resp.GetState().GetKey(),
			"only locks and semaphores under the prefix: %s", wtDescribe(got))
	}
	assert.Equal(t, 1, markers, "one snapshot_complete marker: %s", wtDescribe(got))
}

// wtCtx is a deadline for the unary calls of these tests.
func wtCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
