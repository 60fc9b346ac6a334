package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// A shared broker keeps a session pool per tenant (issue 12): a tenant's
// Acquire with default options takes a ready session of its own tenant,
// made with the tenant's store and named in its record, instead of making
// one on the critical path; a pool nobody asks ends and destroys its
// sessions, and the broker's Close destroys every pool's.
func TestTenantSessionPools(t *testing.T) {
	defer broker.SetTenantPoolIdle(3 * time.Second)()
	agent, own := startStore(t, consulstore.Options{})
	// Tenant b has a Consul client of its own (as a tenant with its own
	// token has); tenant a uses the broker's.
	other, err := consulstore.Open(agent.Config(), consulstore.Options{})
	require.NoError(t, err)
	t.Cleanup(other.Close)
	b := broker.New(own, zap.NewNop(), broker.WithSessionPool(), broker.WithTenantStore(func(tenant string) broker.Store {
		if tenant == "b" {
			return other
		}
		return nil
	}))
	closed := false
	t.Cleanup(func() {
		if !closed {
			b.Close()
		}
	})
	consul := agent.Client()
	sessions := func() map[string]bool {
		ss, _, err := consul.Session().List(nil)
		require.NoError(t, err)
		ids := map[string]bool{}
		for _, s := range ss {
			ids[s.ID] = true
		}
		return ids
	}
	// A shared broker fills no pool at start: every call of a tenant's
	// goes to the tenant's pool, made at its first Acquire.
	time.Sleep(500 * time.Millisecond)
	require.Empty(t, sessions(), "sessions made before any Acquire")

	ctxA := broker.ContextWithTenant(context.Background(), "a")
	ctxB := broker.ContextWithTenant(context.Background(), "b")
	used := func(ctx context.Context, prefix string, n int) map[string]bool {
		ids := map[string]bool{}
		for i := range n {
			ids[cycle(t, b, ctx, fmt.Sprintf("%s/%d", prefix, i)).Session] = true
		}
		return ids
	}

	// Tenant b's first Acquire makes its pool; the pool fills with b's store.
	first := used(ctxB, "b/first", 1)
	// (4 or 5 sessions: the first request's session may come back
	// before the pool's fourth is made.)
	require.Eventually(t, func() bool { return other.OpCounts()["session_create"] >= 4 }, 10*time.Second, 50*time.Millisecond,
		"b's pool fills through b's store (4 ready sessions)")
	ownCreates := own.OpCounts()["session_create"]
	fromB := used(ctxB, "b/k", 40)
	assert.LessOrEqual(t, len(fromB), 8, "b's 40 grants reuse its pooled sessions")
	assert.Equal(t, ownCreates, own.OpCounts()["session_create"], "no session of b's is made with the broker's store")
	assert.LessOrEqual(t, len(fromB), int(other.OpCounts()["session_create"]), "every session b used was made with b's store")

	fromA := used(ctxA, "a/k", 20)
	assert.LessOrEqual(t, len(fromA), 8, "a's 20 grants reuse its pooled sessions")
	single := used(context.Background(), "single/k", 10)
	for id := range fromA {
		assert.False(t, fromB[id] || first[id] || single[id], "session %s of tenant a served another tenant", id)
	}
	for id := range single {
		assert.False(t, fromB[id] || first[id], "a single-tenant session %s served tenant b", id)
	}
	// Each pooled session's record names its tenant, as the record of a
	// session made for the request would.
	for tenant, ids := range map[string]map[string]bool{"a": fromA, "b": fromB, "": single} {
		for id := range ids {
			e, _, err := consul.KV().Get(broker.BrokerPrefix+"sessions/"+id, nil)
			require.NoError(t, err)
			require.NotNil(t, e, "session %s has a record", id)
			var rec struct{ Tenant string }
			require.NoError(t, json.Unmarshal(e.Value, &rec))
			assert.Equal(t, tenant, rec.Tenant, "the record of session %s", id)
		}
	}

	// Tenant c holds a lock while its pool ends: the hold's session, given
	// back to the ended pool, is destroyed and its record deleted.
	ctxC, cancelC := context.WithCancel(broker.ContextWithTenant(context.Background(), "c"))
	defer cancelC()
	held := make(chan broker.Sequencer, 1)
	cDone := make(chan error, 1)
	go func() {
		cDone <- b.Acquire(ctxC, &broker.AcquireSpec{Key: "c/held", WaitForever: true}, func(e broker.Event) error {
			if e.Kind == broker.EventAcquired {
				held <- e.Sequencer
			}
			return nil
		})
	}()
	var cSeq broker.Sequencer
	select {
	case cSeq = <-held:
	case err := <-cDone:
		t.Fatalf("c's Acquire ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("c's hold was never granted")
	}

	// Unused for tenantPoolIdle, b's pool ends: its sessions are destroyed
	// and their records deleted.
	require.Eventually(t, func() bool {
		live := sessions()
		for id := range fromB {
			if live[id] {
				return false
			}
		}
		return true
	}, 15*time.Second, 100*time.Millisecond, "b's unused pool destroyed its sessions")
	for id := range fromB {
		e, _, err := consul.KV().Get(broker.BrokerPrefix+"sessions/"+id, nil)
		require.NoError(t, err)
		assert.Nil(t, e, "the record of b's retired session %s", id)
	}
	require.Eventually(t, func() bool { return !b.HasTenantPool("c") }, 15*time.Second, 100*time.Millisecond, "c's pool ends while its hold is open")
	assert.True(t, sessions()[cSeq.Session], "an open hold keeps its session")
	ok, err := b.Release(ctxC, cSeq.Key, cSeq.Session, cSeq.Token)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, <-cDone)
	require.Eventually(t, func() bool { return !sessions()[cSeq.Session] }, 10*time.Second, 50*time.Millisecond,
		"the session given back to c's ended pool is destroyed")
	require.Eventually(t, func() bool {
		e, _, err := consul.KV().Get(broker.BrokerPrefix+"sessions/"+cSeq.Session, nil)
		return err == nil && e == nil
	}, 10*time.Second, 50*time.Millisecond, "and its record deleted")

	// b can still Acquire: a new pool, new sessions.
	again := used(ctxB, "b/again", 3)
	for id := range again {
		assert.False(t, fromB[id], "a destroyed session %s came back", id)
	}

	// Close destroys every pool's idle sessions.
	b.Close()
	closed = true
	assert.Empty(t, sessions(), "no session outlives the broker's pools")
}

// cycle acquires key as the tenant of ctx, releases it with its token and
// returns the grant once the hold ended `released`.
func cycle(t *testing.T, b *broker.Broker, ctx context.Context, key string) broker.Sequencer {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	events := make(chan broker.Event, 16)
	done := make(chan error, 1)
	go func() {
		done <- b.Acquire(ctx, &broker.AcquireSpec{Key: key, WaitForever: true}, func(e broker.Event) error {
			events <- e
			return nil
		})
	}()
	var seq broker.Sequencer
	for got := false; !got; {
		select {
		case e := <-events:
			if e.Kind == broker.EventAcquired {
				seq, got = e.Sequencer, true
			}
		case err := <-done:
			t.Fatalf("Acquire %s ended before its grant: %v", key, err)
		}
	}
	ok, err := b.Release(ctx, key, seq.Session, seq.Token)
	require.NoError(t, err)
	require.True(t, ok)
	for {
		select {
		case e := <-events:
			if e.Kind == broker.EventLost {
				t.Fatalf("%s lost instead of released: %+v", key, e)
			}
		case err := <-done:
			require.NoError(t, err)
			return seq
		}
	}
}

// A pooled session retires after 64 grants: its record is deleted, then
// the session destroyed, within the pool's next tick (not left to the
// janitor, which runs every 15 s: destroying the session first would
// release the record and move its index, and the deletion would fail).
func TestPoolRetiresSessionAndRecord(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{})
	b := broker.New(store, zap.NewNop(), broker.WithSessionPool())
	t.Cleanup(b.Close)
	start := time.Now()
	grants := map[string]int{}
	retired := ""
	for i := 0; i < 400 && retired == ""; i++ {
		s := cycle(t, b, context.Background(), fmt.Sprintf("retire/%d", i)).Session
		if grants[s]++; grants[s] == 64 {
			retired = s
		}
	}
	require.NotEmpty(t, retired, "a session served 64 grants")
	consul := agent.Client()
	require.Eventually(t, func() bool {
		e, _, err := consul.KV().Get(broker.BrokerPrefix+"sessions/"+retired, nil)
		if err != nil || e != nil {
			return false
		}
		s, _, err := consul.Session().Info(retired, nil)
		return err == nil && s == nil
	}, 5*time.Second, 20*time.Millisecond, "the retired session and its record are gone")
	assert.Less(t, time.Since(start), 14*time.Second, "before the janitor's first run")
	assert.Zero(t, cycleOn(t, b, retired), "a retired session is not given again")
}

// cycleOn counts the grants of 20 more cycles that used session.
func cycleOn(t *testing.T, b *broker.Broker, session string) int {
	n := 0
	for i := range 20 {
		if cycle(t, b, context.Background(), fmt.Sprintf("retire/after/%d", i)).Session == session {
			n++
		}
	}
	return n
}

// A tenant whose store cannot make sessions (here: no Consul behind it)
// gets the store's error for its Acquire, and its pool does not retry the
// creation at every tick: one failed fill, then a pause.
func TestTenantPoolBacksOffFailedFill(t *testing.T) {
	_, own := startStore(t, consulstore.Options{})
	cfg := api.DefaultConfig()
	cfg.Address = "127.0.0.1:1" // nothing listens
	dead, err := consulstore.Open(cfg, consulstore.Options{CallTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(dead.Close)
	b := broker.New(own, zap.NewNop(), broker.WithSessionPool(), broker.WithTenantStore(func(string) broker.Store { return dead }))
	t.Cleanup(b.Close)
	ctx, cancel := context.WithTimeout(broker.ContextWithTenant(context.Background(), "d"), 10*time.Second)
	defer cancel()
	err = b.Acquire(ctx, &broker.AcquireSpec{Key: "d/k", WaitForever: true}, func(broker.Event) error { return nil })
	require.Error(t, err, "no session can be made")
	time.Sleep(4 * time.Second) // four ticks of the pool
	assert.LessOrEqual(t, dead.OpCounts()["session_create"], uint64(2), "the request's attempt and one fill, not one a tick")
}
