package lockctl_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/hashicorp/consul/api"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// resumeScript is the locked command of the resume tests: it writes its
// session and token to $0, notes a SIGTERM in $0.term, and exits 0 once
// $0.go exists (at most after 60 s).
const resumeScript = `trap 'echo TERM > "$0.term"' TERM
echo "$LOCKBROKER_SESSION $LOCKBROKER_TOKEN" > "$0"
i=0
while [ ! -e "$0.go" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo done > "$0.done"`

// TestLockResumes: `lockctl lock` with two brokers keeps running its
// command when the broker its hold is on goes away, by resuming the hold
// (same session, same token) on the other one, as the client libraries
// do: the broker is killed (SIGKILL), drains for a restart (SIGTERM), is
// stopped (SIGSTOP: its stream falls silent; it continues after the
// move) or is cut off from Consul (its link refuses: it says `lost:
// REPLICA_CUT_OFF` once it counts as cut off). The command is never signalled, finishes, and lockctl exits with
// its code, 0. When the other broker refuses the resume (the session was
// destroyed meanwhile), the hold is lost: the command is stopped and
// lockctl exits 75. Real broker processes on one Consul agent.
func TestLockResumes(t *testing.T) {
	lockctl := brokertest.Build(t, "./cmd/lockctl", "lockctl")
	agent := consultest.Start(t)
	h := &harness{lockctl: lockctl}
	kv := agent.Client().KV()

	holder := func(key string) string {
		e, _, err := kv.Get(key, &api.QueryOptions{RequireConsistent: true})
		if err != nil || e == nil {
			return ""
		}
		return e.Session
	}

	for _, tt := range []struct {
		name  string
		stop  func(a *brokertest.Process, link *toxiproxy.Proxy)
		after func(a *brokertest.Process) // once the hold moved
		cut   bool                        // A reaches Consul through link
	}{
		{"killed", func(a *brokertest.Process, _ *toxiproxy.Proxy) { a.Kill() }, nil, false},
		{"draining", func(a *brokertest.Process, _ *toxiproxy.Proxy) { a.Signal(syscall.SIGTERM) }, nil, false},
		// A wakes after the move: its copy of the hold must leave it alone.
		{"stopped", func(a *brokertest.Process, _ *toxiproxy.Proxy) { a.Stop(); t.Cleanup(a.Cont) }, func(a *brokertest.Process) { a.Cont() }, false},
		{"cut-off", func(_ *brokertest.Process, link *toxiproxy.Proxy) { link.Stop() }, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var link *toxiproxy.Proxy
			startA := brokertest.StartProcess
			if tt.cut {
				link = toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), t.Name(), "127.0.0.1:0", agent.HTTPAddr())
				require.NoError(t, link.Start())
				t.Cleanup(link.Stop)
				startA = func(t testing.TB, _ *consultest.Agent, opts ...brokertest.ProcessOption) *brokertest.Process {
					return brokertest.StartProcessAt(t, link.Listen, opts...)
				}
			}
			a, b := startA(t, agent), brokertest.StartProcess(t, agent)
			key := "lockctl-test/resume/" + tt.name
			file := filepath.Join(t.TempDir(), "child")
			// The default --grace: the command would get SIGTERM 6 s after
			// the last word from A (the end of the 9 s guarantee less a
			// third of it), 1.95 s after a stopped A counts as stalled
			// (4.05 s, see stallAfter).
			p := h.start(t, nil, "--addr", a.Addr+","+b.Addr, "lock", "-v", "--ttl", "10s", key, "--", "sh", "-c", resumeScript, file)
			got := p.waitFile(t, file)
			session, token := got[0], got[1]
			require.Equal(t, session, holder(key))

			tt.stop(a, link)
			stopped := time.Now()
			require.Eventually(t, func() bool { return strings.Contains(p.stderr.String(), "lockctl: resumed on "+b.Addr) },
				15*time.Second, 20*time.Millisecond, "no resume on B; stderr: %s", p.stderr.String())
			t.Logf("resumed on B %v after A was %s", time.Since(stopped).Round(time.Millisecond), tt.name)
			assert.Contains(t, p.stderr.String(), "token "+token, "the same grant")
			assert.Equal(t, session, holder(key), "the same session holds the key")
			if tt.after != nil {
				tt.after(a)
			}

			// Still held, and renewed by B, past the first broker's TTL.
			time.Sleep(11 * time.Second)
			assert.Equal(t, session, holder(key), "the hold outlived its first broker's TTL")
			select {
			case <-p.done:
				t.Fatalf("lockctl exited %d; stderr: %s", p.cmd.ProcessState.ExitCode(), p.stderr.String())
			default:
			}

			require.NoError(t, os.WriteFile(file+".go", nil, 0o644))
			assert.Equal(t, 0, p.wait(t, 15*time.Second), "stderr: %s", p.stderr.String())
			assert.FileExists(t, file+".done", "the command finished")
			assert.NoFileExists(t, file+".term", "the command was never signalled")
			assert.Eventually(t, func() bool { return holder(key) == "" }, 10*time.Second, 20*time.Millisecond, "released at the end")
		})
	}

	t.Run("refused", func(t *testing.T) {
		a, b := brokertest.StartProcess(t, agent), brokertest.StartProcess(t, agent)
		key := "lockctl-test/resume/refused"
		file := filepath.Join(t.TempDir(), "child")
		p := h.start(t, nil, "--addr", a.Addr+","+b.Addr, "lock", "-v", "--ttl", "10s", "--grace", "1s", key, "--", "sh", "-c", resumeScript, file)
		session := p.waitFile(t, file)[0]

		// A stops, so it cannot tell the hold is gone; the session ends
		// behind its back; the resume on B finds it gone.
		a.Stop()
		t.Cleanup(a.Cont)
		_, err := agent.Client().Session().Destroy(session, nil)
		require.NoError(t, err)
		assert.Equal(t, exitLost, p.wait(t, 20*time.Second), "stderr: %s", p.stderr.String())
		assert.Contains(t, p.stderr.String(), "refused to resume the hold")
		assert.FileExists(t, file+".term", "the command was stopped")
		assert.NoFileExists(t, file+".done")
	})
}

// TestLockWaitMoves: a `lockctl lock` that waits for a key goes on waiting
// at the next broker when the one it waits at dies (SIGKILL: the stream
// fails UNAVAILABLE) or stops (SIGSTOP: three `queued` heartbeats of
// silence), and gets the key there once its holder lets it go: its command
// runs and lockctl exits 0.
func TestLockWaitMoves(t *testing.T) {
	lockctl := brokertest.Build(t, "./cmd/lockctl", "lockctl")
	agent := consultest.Start(t)
	h := &harness{lockctl: lockctl}
	for _, tt := range []struct {
		name string
		stop func(a *brokertest.Process)
		n    string // -n: 1 a lock; more, a semaphore with that many slots, each held
	}{
		{"killed", func(a *brokertest.Process) { a.Kill() }, "1"},
		{"stopped", func(a *brokertest.Process) { a.Stop(); t.Cleanup(a.Cont) }, "1"},
		{"semaphore killed", func(a *brokertest.Process) { a.Kill() }, "2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := brokertest.StartProcess(t, agent), brokertest.StartProcess(t, agent)
			key := "lockctl-test/wait-moves/" + strings.ReplaceAll(tt.name, " ", "-")
			dir := t.TempDir()
			held := filepath.Join(dir, "holder")
			var holders []*proc
			slots, err := strconv.Atoi(tt.n)
			require.NoError(t, err)
			for i := range slots {
				f := held + string(rune('0'+i))
				p := h.start(t, nil, "--addr", b.Addr, "lock", "-n", tt.n, key, "--", "sh", "-c", resumeScript, f)
				p.waitFile(t, f)
				holders = append(holders, p)
			}

			ran := filepath.Join(dir, "waiter")
			waiter := h.start(t, nil, "--addr", a.Addr+","+b.Addr, "lock", "-v", "-n", tt.n, key, "--", "sh", "-c", `echo "$LOCKBROKER_SESSION" > "$0"`, ran)
			require.Eventually(t, func() bool { return strings.Contains(waiter.stderr.String(), "lockctl: waiting: ") },
				15*time.Second, 20*time.Millisecond, "the waiter never queued; stderr: %s", waiter.stderr.String())
			queuedWith := ""
			if tt.n != "1" { // the semaphore's contender entry that no holder has
				ps, _, err := agent.Client().KV().List(key+"/", nil)
				require.NoError(t, err)
				lock := ""
				for _, p := range ps {
					if p.Key == key+"/.lock" {
						lock = string(p.Value) // {"Limit":2,"Holders":{"<session>":true,…}}
					}
				}
				for _, p := range ps {
					if p.Session != "" && p.Key != key+"/.lock" && !strings.Contains(lock, p.Session) {
						queuedWith = p.Session
					}
				}
				require.NotEmpty(t, queuedWith, "no waiting contender entry under %s", key)
			}

			tt.stop(a)
			stopped := time.Now()
			require.Eventually(t, func() bool { return strings.Contains(waiter.stderr.String(), "waiting at "+b.Addr+" instead") },
				15*time.Second, 20*time.Millisecond, "the wait did not move to B; stderr: %s", waiter.stderr.String())
			t.Logf("the wait moved to B %v after A was %s", time.Since(stopped).Round(time.Millisecond), tt.name)

			for i, p := range holders {
				f := held + string(rune('0'+i))
				require.NoError(t, os.WriteFile(f+".go", nil, 0o644))
				assert.Equal(t, 0, p.wait(t, 15*time.Second), "holder: %s", p.stderr.String())
			}
			assert.Equal(t, 0, waiter.wait(t, 30*time.Second), "waiter: %s", waiter.stderr.String())
			assert.FileExists(t, ran, "the waiter's command ran")
			if queuedWith != "" {
				// It resumed its wait, with its place: same session.
				got, err := os.ReadFile(ran)
				require.NoError(t, err)
				assert.Equal(t, queuedWith, strings.TrimSpace(string(got)), "the moved semaphore wait was granted on another session")
			}
		})
	}
}
