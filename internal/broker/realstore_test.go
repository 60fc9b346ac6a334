package broker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// startStore starts a real Consul agent for t and opens a Store on it,
// closed when the test ends.
func startStore(t *testing.T, opts consulstore.Options) (*consultest.Agent, *consulstore.Store) {
	t.Helper()
	agent := consultest.Start(t)
	store, err := consulstore.Open(agent.Config(), opts)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return agent, store
}
