package consulstore

import (
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestMain fails the package if any test leaves a goroutine behind (an
// open connection shows up as its read and write loops).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// open returns a Store on agent with opts, closed when the test ends.
func open(t *testing.T, agent *consultest.Agent, opts Options) *Store {
	t.Helper()
	return openConfig(t, agent.Config(), opts)
}

// openConfig returns a Store for cfg, closed when the test ends.
func openConfig(t *testing.T, cfg *api.Config, opts Options) *Store {
	t.Helper()
	s, err := Open(cfg, opts)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}
