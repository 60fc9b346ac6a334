package bench

import (
	"testing"
	"time"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// startBroker runs an in-process replica configured as the broker binary
// runs one (the session pool on), and waits until the pool is filled so
// that measurements start from the steady state.
func startBroker(t testing.TB, agent *consultest.Agent) *brokertest.Replica {
	t.Helper()
	r := brokertest.Start(t, agent, brokertest.WithBrokerOptions(broker.WithSessionPool()))
	waitPool(t, agent)
	return r
}

// waitPool waits (up to 10 s) until the agent has the sessions of a
// filled pool.
func waitPool(t testing.TB, agent *consultest.Agent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ss, _, err := agent.Client().Session().List(nil)
		if err == nil && len(ss) >= 16 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
