package consultest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// helperEnv, when set to a data directory, turns the test binary into the
// parent process used by TestNoOrphanAgent.
const helperEnv = "CONSULTEST_ORPHAN_HELPER"

// TestMain fails the package if any test leaves a goroutine behind.
func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		orphanHelper(dir)
		return
	}
	goleak.VerifyTestMain(m)
}

// orphanHelper starts an agent, prints its pid and waits to be killed. The
// data dir comes from the test, as a killed helper cannot remove a temp dir.
func orphanHelper(dataDir string) {
	p, err := StartProcess(context.Background(), ProcessConfig{DataDir: dataDir})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("PID", p.cmd.Process.Pid)
	time.Sleep(time.Minute)
	os.Exit(2)
}

// putGet writes key=val through c and reads it back.
func putGet(t *testing.T, c *api.Client, key, val string) {
	t.Helper()
	_, err := c.KV().Put(&api.KVPair{Key: key, Value: []byte(val)}, nil)
	require.NoError(t, err)
	pair, _, err := c.KV().Get(key, nil)
	require.NoError(t, err)
	require.NotNil(t, pair)
	require.Equal(t, val, string(pair.Value))
}

func TestStartKV(t *testing.T) {
	t.Parallel()
	a := Start(t)
	require.True(t, a.Running())
	require.Regexp(t, `^127\.0\.0\.1:\d+$`, a.HTTPAddr())
	putGet(t, a.Client(), "consultest/hello", "world")
	leader, err := a.Client().Status().Leader()
	require.NoError(t, err)
	require.NotEmpty(t, leader)
}

func TestStopThenKVFails(t *testing.T) {
	t.Parallel()
	a := Start(t)
	c := a.Client()
	putGet(t, c, "k", "v")
	a.Stop()
	require.False(t, a.Running())
	_, _, err := c.KV().Get("k", nil)
	require.Error(t, err)
	a.Stop() // idempotent
}

func TestRestartSameAddress(t *testing.T) {
	t.Parallel()
	a := Start(t)
	addr, c := a.HTTPAddr(), a.Client()
	putGet(t, c, "before", "1")

	a.Stop()
	a.Restart()
	require.True(t, a.Running())
	require.Equal(t, addr, a.HTTPAddr())
	pair, _, err := c.KV().Get("before", nil)
	require.NoError(t, err)
	require.Nil(t, pair, "dev mode keeps no state across restarts")
	putGet(t, c, "after", "2")

	a.Restart() // also works without a prior Stop
	require.Equal(t, addr, a.HTTPAddr())
	putGet(t, a.Client(), "again", "3")
}

func TestParallelAgentsDistinctPorts(t *testing.T) {
	t.Parallel()
	a, b := Start(t), Start(t)
	seen := map[int]bool{}
	for _, p := range []ports{a.current().ports, b.current().ports} {
		for _, n := range []int{p.HTTP, p.Server, p.SerfLAN, p.SerfWAN} {
			require.False(t, seen[n], "port %d used twice", n)
			seen[n] = true
		}
	}
	putGet(t, a.Client(), "only-in-a", "x")
	pair, _, err := b.Client().KV().Get("only-in-a", nil)
	require.NoError(t, err)
	require.Nil(t, pair, "agents must not share state")
}

func TestWithHCL(t *testing.T) {
	t.Parallel()
	// The default session_ttl_min is 10s, so a 1s TTL only works if applied.
	a := Start(t, WithHCL(`session_ttl_min = "1s"`))
	id, _, err := a.Client().Session().Create(&api.SessionEntry{TTL: "1s"}, nil)
	require.NoError(t, err)
	require.NotEmpty(t, id)
}

func TestStartProcess(t *testing.T) {
	t.Parallel()
	port := freeTCPPort(t)
	p, err := StartProcess(context.Background(), ProcessConfig{HTTPPort: port})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:"+strconv.Itoa(port), p.HTTPAddr())
	require.DirExists(t, p.dataDir)
	wait := p.Wait()

	require.NoError(t, p.Stop())
	require.NoError(t, <-wait, "exit caused by Stop is not an error")
	require.NoError(t, <-p.Wait(), "Wait after exit")
	require.NoDirExists(t, p.dataDir, "temp data dir removed")
	require.NoError(t, p.Stop())
}

func TestProcessUnexpectedExit(t *testing.T) {
	t.Parallel()
	p, err := StartProcess(context.Background(), ProcessConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Stop()) })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case err := <-p.Wait():
		require.ErrorContains(t, err, "exited unexpectedly")
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not report the exit")
	}
	require.False(t, p.running())
}

func TestStartProcessPortTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = StartProcess(context.Background(), ProcessConfig{HTTPPort: port})
	t.Logf("expected error:\n%v", err)
	require.ErrorIs(t, err, errBind)
	require.ErrorContains(t, err, "gave up after 3 attempts")
	require.ErrorContains(t, err, "address already in use", "error quotes agent output")
}

// A port the harness picked that the caller's configuration also gives to
// another listener (a test that picks its own HTTPS port can get the port
// the harness then picks for HTTP; TestTLSFromEnvironment did in CI) is a
// conflict to retry with fresh ports, like a taken one. Here the HTTP port
// is fixed, so every retry conflicts again.
func TestStartProcessPortGivenTwice(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	_, err = StartProcess(context.Background(), ProcessConfig{HTTPPort: port, HCL: []string{fmt.Sprintf("ports { https = %d }", port)}})
	t.Logf("expected error:\n%v", err)
	require.ErrorIs(t, err, errBind)
	require.ErrorContains(t, err, "gave up after 3 attempts")
	require.ErrorContains(t, err, "already configured for", "error quotes agent output")
}

func TestBinary(t *testing.T) {
	bin, err := Binary()
	require.NoError(t, err)
	require.FileExists(t, bin)

	t.Setenv(EnvBinary, bin)
	got, err := Binary()
	require.NoError(t, err)
	require.Equal(t, bin, got)

	t.Setenv(EnvBinary, "/nonexistent/consul")
	_, err = Binary()
	require.ErrorContains(t, err, EnvBinary)
}

func TestRepoRoot(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	root, ok := repoRoot(wd)
	require.True(t, ok)
	require.Equal(t, modulePath, goModModule(root+"/go.mod"))
	_, ok = repoRoot(t.TempDir())
	require.False(t, ok)
}

// freeTCPPort returns a loopback TCP port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestNoOrphanAgent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("parent-death signal is Linux-only")
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+t.TempDir())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	pidStr, ok := strings.CutPrefix(strings.TrimSpace(line), "PID ")
	require.True(t, ok, "helper said %q", line)
	pid, err := strconv.Atoi(pidStr)
	require.NoError(t, err)
	require.True(t, alive(pid))

	require.NoError(t, cmd.Process.Kill()) // parent dies without calling Stop
	_ = cmd.Wait()
	require.Eventually(t, func() bool { return !alive(pid) }, 5*time.Second, 20*time.Millisecond,
		"consul agent %d outlived its parent", pid)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestStopKillsHungAgent(t *testing.T) {
	t.Parallel()
	p, err := StartProcess(context.Background(), ProcessConfig{})
	require.NoError(t, err)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP)) // SIGTERM now stays pending
	start := time.Now()
	require.NoError(t, p.Stop())
	require.GreaterOrEqual(t, time.Since(start), stopGrace, "SIGKILL only after the grace period")
	require.False(t, p.running())
}
