package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

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
	require.Eventually(t, func() bool { return len(sessions()) >= 16 }, 10*time.Second, 50*time.Millisecond, "the single-tenant pool fills at start")

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

	// Unused for tenantPoolIdle, b's pool ends: its sessions are destroyed
	// and their records deleted. a's pool, used later, still has its own.
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
		done <- b.Acquire(ctx, broker.AcquireSpec{Key: key, WaitForever: true}, func(e broker.Event) error {
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
