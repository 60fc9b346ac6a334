package grpcurl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/readme"
)

// The README's "Using it" blocks, run as written against a real broker
// process and Consul agent. The only changes the test makes: the broker's
// address in place of 127.0.0.1:8700, the SID and TOKEN a real grant
// printed in place of the README's sample ones, and LOCKBROKER_ADDR and
// bin/lockctl pointing at the test's broker and build.

var (
	sessionRE = regexp.MustCompile(`"sessionId": "([0-9a-f-]{36})"`)
	tokenRE   = regexp.MustCompile(`"token": "([0-9]+)"`)
	sampleRE  = regexp.MustCompile(`(?m)^SID=\S+ TOKEN=\S+`)
	guardRE   = regexp.MustCompile(`"guaranteedFor": "([0-9.]+s)"`)
)

// ctrlCBound is how long a hold whose grpcurl got Ctrl-C may stay: the
// largest guarantee the broker sends (14.5 s) + 0.5 s, and slack for a
// loaded machine.
const ctrlCBound = 20 * time.Second

func TestReadmeGrpcurl(t *testing.T) {
	b := brokertest.StartDev(t)
	bin := brokertest.BuildIn(t, filepath.Join(brokertest.RepoRoot(t), "tools", "go"),
		"github.com/fullstorydev/grpcurl/cmd/grpcurl", "grpcurl")
	sh := shell{path: filepath.Dir(bin), addr: b.Addr}
	locks := dialLocks(t, b.Addr)

	t.Run("Explore", func(t *testing.T) {
		out, err := sh.run(t, "set -e\n"+readme.Block(t, "grpcurl-explore"))
		require.NoError(t, err, out)
		assert.Contains(t, out, "lockbroker.v1.LockService\n")
		assert.Contains(t, out, "lockbroker.v1.LockService is a service:")
	})

	// Ctrl-C keeps the hold (to its guarantee); the README's Release with
	// the printed session and token frees it at once.
	t.Run("CtrlCThenRelease", func(t *testing.T) {
		sid, token, _ := holdThenCtrlC(t, sh, locks)
		time.Sleep(time.Second)
		assert.Equal(t, sid, holder(t, locks, "demo/lock"), "the hold is gone 1 s after Ctrl-C")

		release := sampleRE.ReplaceAllString(readme.Block(t, "grpcurl-release"),
			fmt.Sprintf("SID=%s TOKEN=%d", sid, token))
		require.NotEqual(t, readme.Block(t, "grpcurl-release"), release, "the release block sets no sample SID and TOKEN")
		out, err := sh.run(t, release)
		require.NoError(t, err, out)
		assert.Contains(t, out, `"released": true`)
		assert.Empty(t, holder(t, locks, "demo/lock"), "still held after Release")
	})

	// What the README says Ctrl-C costs: the hold stays to its guarantee.
	t.Run("CtrlCKeepsTheHold", func(t *testing.T) {
		sid, _, out := holdThenCtrlC(t, sh, locks)
		start := time.Now()
		guarantee := "none"
		if m := guardRE.FindAllStringSubmatch(out, -1); m != nil {
			guarantee = m[len(m)-1][1]
		}
		require.Eventually(t, func() bool { return holder(t, locks, "demo/lock") != sid },
			ctrlCBound, 50*time.Millisecond, "the hold outlived its guarantee after Ctrl-C")
		kept := time.Since(start)
		t.Logf("Ctrl-C on grpcurl: the hold was kept %.1f s (the last guaranteedFor: %s)", kept.Seconds(), guarantee)
		assert.Greater(t, kept, time.Second, "Ctrl-C freed the lock at once: the README says it does not")
	})

	t.Run("More", func(t *testing.T) {
		for _, line := range readme.Commands(readme.Block(t, "grpcurl-more")) {
			switch {
			case strings.Contains(line, "/Acquire"), strings.Contains(line, "/Watch"):
				p := sh.start(t, "exec "+line)
				require.Eventually(t, func() bool {
					out := p.out.String()
					return strings.Contains(out, `"acquired"`) || strings.Contains(out, `"key": "demo/lock"`)
				}, 10*time.Second, 20*time.Millisecond, "%s: no acquired event or state", line)
				t.Logf("$ %s\n%s", line, p.out.String())
				assert.NotContains(t, p.out.String(), "ERROR")
			default:
				out, err := sh.run(t, line)
				require.NoError(t, err, out)
				assert.Contains(t, out, `"sessionId"`) // the holder of the Acquire above
			}
		}
	})

	// The "Multi-key locks" blocks: three keys granted together, and
	// released together through the last one.
	t.Run("MultiKey", func(t *testing.T) {
		p := sh.start(t, "exec "+readme.Block(t, "grpcurl-multi"))
		var sid string
		var token uint64
		require.Eventually(t, func() bool {
			out := p.out.String()
			s, k := sessionRE.FindStringSubmatch(out), tokenRE.FindStringSubmatch(out)
			if !strings.Contains(out, `"sequencers"`) || s == nil || k == nil {
				return false
			}
			sid = s[1]
			_, err := fmt.Sscan(k[1], &token)
			return err == nil
		}, 10*time.Second, 20*time.Millisecond, "no acquired event: %s", p.out.String())
		assert.Equal(t, 4, strings.Count(p.out.String(), `"key": "demo/`), "the sequencer, then one sequencer per key: %s", p.out.String())
		for _, k := range []string{"demo/orders", "demo/stock", "demo/ledger"} {
			assert.Equal(t, sid, holder(t, locks, k), "%s is held by the one session", k)
		}
		release := sampleRE.ReplaceAllString(readme.Block(t, "grpcurl-multi-release"), fmt.Sprintf("SID=%s TOKEN=%d", sid, token))
		out, err := sh.run(t, release)
		require.NoError(t, err, out)
		assert.Contains(t, out, `"released": true`)
		for _, k := range []string{"demo/orders", "demo/stock", "demo/ledger"} {
			assert.Empty(t, holder(t, locks, k), "%s is free after the Release", k)
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Fatal("grpcurl still running 10 s after the Release")
		}
		assert.Contains(t, p.out.String(), `"released"`)
	})

	t.Run("Cron", func(t *testing.T) {
		out, err := sh.run(t, "set -e\n"+readme.Block(t, "grpcurl-cron")) // every command must succeed
		require.NoError(t, err, out)
		assert.Contains(t, out, `"released": true`, "TryAcquire granted nothing that Release could free")
		assert.Empty(t, holder(t, locks, "demo/cron"))
	})
}

// holdThenCtrlC runs the README's try-once Acquire, waits for its grant
// and sends grpcurl SIGINT, as Ctrl-C does. It returns the grant's session
// and token, and what grpcurl printed.
func holdThenCtrlC(t *testing.T, sh shell, locks lockbrokerv1.LockServiceClient) (string, uint64, string) {
	t.Helper()
	p := sh.start(t, "exec "+readme.Block(t, "grpcurl-hold"))
	var sid string
	var token uint64
	require.Eventually(t, func() bool {
		out := p.out.String()
		s, k := sessionRE.FindStringSubmatch(out), tokenRE.FindStringSubmatch(out)
		if s == nil || k == nil {
			return false
		}
		sid = s[1]
		_, err := fmt.Sscan(k[1], &token)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "no acquired event: %s", p.out.String())
	require.Equal(t, sid, holder(t, locks, "demo/lock"))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("grpcurl still running 10 s after SIGINT")
	}
	return sid, token, p.out.String()
}

// holder returns the session that holds key, or "".
func holder(t *testing.T, locks lockbrokerv1.LockServiceClient, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: key})
	require.NoError(t, err)
	if h := resp.GetState().GetHolders(); len(h) > 0 {
		return h[0].GetSessionId()
	}
	return ""
}

// dialLocks is a LockService client of the broker at addr.
func dialLocks(t *testing.T, addr string) lockbrokerv1.LockServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return lockbrokerv1.NewLockServiceClient(conn)
}

func TestReadmeLockctl(t *testing.T) {
	b := brokertest.StartDev(t)
	bin := brokertest.Build(t, "./cmd/lockctl", "lockctl")
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "bin", "lockctl")))
	sh := shell{path: os.Getenv("PATH"), addr: b.Addr, dir: dir}

	out, err := sh.run(t, "set -e\n"+readme.Block(t, "lockctl"))
	require.NoError(t, err, out)
	assert.Contains(t, out, "holding demo/job\n")
	assert.Contains(t, out, "got it\n")
}
