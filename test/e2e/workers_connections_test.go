package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Short holds of many distinct keys — the workers pattern, one lock per
// task — must not use up Consul's per-client connection limit
// (http_max_conns_per_client, default 200), which DESIGN.md's scale
// section says the broker stays below. Each hold's key watch stops when
// the hold ends; Consul keeps serving a blocking query whose client has
// hung up until the query's wait time runs out, so a watch that is stopped
// by closing its connection still holds a connection slot in Consul.
func TestWorkersShortHoldsLeaveConsulConnectionsFree(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	cl := client.New(r.Conn(t))
	const holds = 250
	start := time.Now()
	for i := range holds {
		ctx := wtCtx(t)
		lease, err := cl.TryLock(ctx, fmt.Sprintf("short/task-%03d", i),
			client.WithDeleteBehavior(), client.WithTTL(10*time.Second), client.WithLockDelay(0))
		require.NoError(t, err, "hold %d of %d; Consul sockets: %s", i, holds, wtConsulSockets(agent))
		require.NoError(t, lease.Release(ctx), "hold %d", i)
	}
	t.Logf("%d holds taken and released in %s; Consul sockets: %s", holds, time.Since(start).Round(time.Millisecond), wtConsulSockets(agent))

	// A new connection to Consul from this host is still served.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + agent.HTTPAddr() + "/v1/status/leader")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "Consul refuses new connections from the broker's host after %d short holds; Consul sockets: %s", holds, wtConsulSockets(agent))
}

// wtConsulSockets describes the TCP sockets on the agent's HTTP port, on
// the agent's side, by state (Linux only): CLOSE_WAIT ones are requests
// whose client hung up while Consul still serves them.
func wtConsulSockets(agent *consultest.Agent) string {
	addr := agent.HTTPAddr()
	var port int
	if _, err := fmt.Sscanf(addr[strings.LastIndexByte(addr, ':')+1:], "%d", &port); err != nil {
		return "unknown"
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "unknown"
	}
	local := fmt.Sprintf(":%04X", port)
	states := map[string]string{"01": "ESTABLISHED", "08": "CLOSE_WAIT"}
	count := map[string]int{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1], local) {
			if name, ok := states[f[3]]; ok {
				count[name]++
			}
		}
	}
	return fmt.Sprintf("%d ESTABLISHED, %d CLOSE_WAIT", count["ESTABLISHED"], count["CLOSE_WAIT"])
}
