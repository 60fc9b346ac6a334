package consulstore

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// managementToken is the initial management token of the test agents with
// ACLs (a test-only value).
const managementToken = "0e5b4e9a-6d1c-4c8e-9c55-7d0d1f3a1c01"

// startACLAgent starts an agent whose ACLs deny by default.
func startACLAgent(t *testing.T) *consultest.Agent {
	t.Helper()
	return consultest.Start(t,
		consultest.WithHCL(`acl { enabled = true  default_policy = "deny"  tokens { initial_management = "`+managementToken+`" } }`),
		func(c *consultest.ProcessConfig) { c.Token = managementToken })
}

// openAs returns a Store on agent that sends token.
func openAs(t *testing.T, agent *consultest.Agent, token string) *Store {
	t.Helper()
	cfg := agent.Config()
	cfg.Token = token
	return openConfig(t, cfg, Options{CallTimeout: 5 * time.Second})
}

// TestACLDenials proves the three shapes of Consul's ACL denials against a
// real agent with default_policy = "deny": a 403, a transaction rolled back
// with "Permission denied", and reads filtered by ACLs, are all
// StorePermissionDenied with the Consul operation named, never an empty
// result or ErrSessionNotFound; and no error quotes a token.
func TestACLDenials(t *testing.T) {
	t.Parallel()
	agent := startACLAgent(t)
	admin := openAs(t, agent, managementToken)
	ctx := t.Context()

	set(t, admin, "acl/a", "A")
	sess := session(t, admin, broker.SessionSpec{Name: "admin"})
	_, err := admin.Txn(ctx, []broker.Op{{Verb: broker.OpLock, Key: "acl/held", Session: sess}})
	require.NoError(t, err)
	tok, _, err := admin.Client().ACL().TokenCreate(&api.ACLToken{Description: "no rights"}, nil)
	require.NoError(t, err)
	none := openAs(t, agent, tok.SecretID)
	unknown := openAs(t, agent, "6a7f0c7e-1111-4222-8333-944444444444")

	tests := []struct {
		name, op string
		call     func(ctx context.Context, s *Store) error
	}{
		{"txn write: rolled back with Permission denied", "kv txn", func(ctx context.Context, s *Store) error {
			_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpSet, Key: "acl/a", Value: []byte("x")}})
			return err
		}},
		{"txn lock: rolled back with Permission denied", "kv txn", func(ctx context.Context, s *Store) error {
			_, err := s.Txn(ctx, []broker.Op{
				{Verb: broker.OpCheckNotExists, Key: "acl/b"},
				{Verb: broker.OpLock, Key: "acl/b", Session: sess},
			})
			return err
		}},
		{"txn read check: rolled back with Permission denied", "kv txn", func(ctx context.Context, s *Store) error {
			_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpCheckSession, Key: "acl/held", Session: sess}})
			return err
		}},
		{"check (the sweep's): rolled back with Permission denied, not a pass", "kv txn", func(ctx context.Context, s *Store) error {
			return s.Check(ctx, []broker.Op{{Verb: broker.OpCheckIndex, Key: "acl/a", Index: 1}, {Verb: broker.OpCheckNotExists, Key: "acl/b"}})
		}},
		{"txn read get: results filtered", "kv txn", func(ctx context.Context, s *Store) error {
			_, err := s.Txn(ctx, []broker.Op{{Verb: broker.OpGet, Key: "acl/a"}})
			return err
		}},
		{"kv list: filtered", "kv list", func(ctx context.Context, s *Store) error {
			_, _, err := s.List(ctx, "acl/", true)
			return err
		}},
		{"kv watch: filtered", "kv watch", func(ctx context.Context, s *Store) error {
			_, _, err := s.Watch(ctx, "acl/", 0)
			return err
		}},
		{"session create: 403", "session create", func(ctx context.Context, s *Store) error {
			_, err := s.CreateSession(ctx, broker.SessionSpec{TTL: 15 * time.Second})
			return err
		}},
		{"session renew: 403", "session renew", func(ctx context.Context, s *Store) error {
			_, err := s.RenewSession(ctx, sess)
			return err
		}},
		{"session destroy: 403", "session destroy", func(ctx context.Context, s *Store) error {
			return s.DestroySession(ctx, sess)
		}},
		{"session info: filtered", "session info", func(ctx context.Context, s *Store) error {
			_, err := s.Session(ctx, sess)
			return err
		}},
		{"session list: filtered", "session list", func(ctx context.Context, s *Store) error {
			_, err := s.Sessions(ctx)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(ctx, none)
			requireStoreError(t, err, broker.StorePermissionDenied, tt.op)
			assert.ErrorIs(t, err, broker.ErrPermission)
			assert.NotErrorIs(t, err, broker.ErrSessionNotFound)
			assert.NotContains(t, err.Error(), tok.SecretID)
			assert.NotContains(t, err.Error(), managementToken)
			t.Log(err)
		})
	}
	t.Run("unknown token: 403 ACL not found", func(t *testing.T) {
		_, _, err := unknown.List(ctx, "acl/", true)
		requireStoreError(t, err, broker.StorePermissionDenied, "kv list")
		assert.NotContains(t, err.Error(), "6a7f0c7e-1111-4222-8333-944444444444")
		t.Log(err)
	})
	t.Run("nothing to filter: an empty listing is empty", func(t *testing.T) {
		entries, _, err := none.List(ctx, "nothing/", true)
		require.NoError(t, err)
		assert.Empty(t, entries)
	})

	// The admin's state is untouched and reads through its token work.
	entries, _, err := admin.List(ctx, "acl/", true)
	require.NoError(t, err)
	assert.Len(t, entries, 2)
	assert.Equal(t, uint64(len(tests)), gatherResult(t, none, "permission_denied"))
}
