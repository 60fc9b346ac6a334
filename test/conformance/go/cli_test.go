package conformance

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// The Go CLI keeps the contract of scenarios.md (S5.3): with stdin on
// /dev/null it holds for the full --seconds, prints acquired then
// released with t on every line; watch --prefix prints the states, then
// snapshot_complete; --mode and --also hold a read-write lock and several
// keys, and say so (mode, keys, tokens).
func TestGoCLIContract(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	key := testKey(t)
	bin := goCLI(t).argv[0]

	run := func(args ...string) []map[string]any {
		t.Helper()
		cmd := exec.Command(bin, args...) // stdin: /dev/null
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		var lines []map[string]any
		s := bufio.NewScanner(out)
		for s.Scan() {
			var m map[string]any
			require.NoError(t, json.Unmarshal(s.Bytes(), &m), "%s", s.Bytes())
			assert.Equal(t, "go", m["lang"])
			assert.IsType(t, float64(0), m["t"])
			lines = append(lines, m)
		}
		require.NoError(t, cmd.Wait(), "%s %v printed %v", bin, args, lines)
		return lines
	}

	start := time.Now()
	hold := run("hold", "--target", b.Addr, "--key", key+"/lock", "--seconds", "1", "--value", "v")
	took := time.Since(start)
	require.Len(t, hold, 2, "%v", hold)
	assert.Equal(t, "acquired", hold[0]["event"])
	assert.NotZero(t, hold[0]["token"])
	assert.NotEmpty(t, hold[0]["session_id"])
	assert.Equal(t, "released", hold[1]["event"])
	assert.Equal(t, hold[0]["token"], hold[1]["token"])
	assert.GreaterOrEqual(t, took, time.Second, "stdin on /dev/null holds the full --seconds")
	assert.Equal(t, "lock", hold[0]["mode"])
	assert.IsType(t, float64(0), hold[1]["release_t"])

	watch := run("watch", "--target", b.Addr, "--key", key, "--prefix", "--seconds", "1")
	require.NotEmpty(t, watch)
	var events []string
	for _, m := range watch {
		events = append(events, m["event"].(string))
	}
	assert.Equal(t, []string{"state", "snapshot_complete"}, events, "the released lock's state, then the marker")
	assert.Equal(t, key+"/lock", watch[0]["key"])

	// --mode read|write: a read-write lock's holds (S10's "mode").
	for _, mode := range []string{"read", "write"} {
		rw := run("hold", "--target", b.Addr, "--key", key+"/rw", "--mode", mode, "--seconds", "0")
		require.Len(t, rw, 2, "%v", rw)
		assert.Equal(t, "acquired", rw[0]["event"])
		assert.Equal(t, mode, rw[0]["mode"])
		assert.Nil(t, rw[0]["tokens"], "one key: no tokens list")
		assert.Equal(t, "released", rw[1]["event"])
	}
	// --also: a multi-key lock, a token per key in order.
	multi := run("hold", "--target", b.Addr, "--key", key+"/m1", "--also", key+"/m2", "--also", key+"/m3", "--seconds", "0")
	require.Len(t, multi, 2, "%v", multi)
	assert.Equal(t, "acquired", multi[0]["event"])
	assert.Equal(t, []any{key + "/m1", key + "/m2", key + "/m3"}, multi[0]["keys"])
	toks, _ := multi[0]["tokens"].([]any)
	require.Len(t, toks, 3)
	assert.Equal(t, multi[0]["token"], toks[0])
}
