package pause

import (
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var spun atomic.Int64

// TestMain turns the test binary into a spinning Go process with several
// running threads when PAUSE_SPIN is set.
func TestMain(m *testing.M) {
	if os.Getenv("PAUSE_SPIN") != "" {
		runtime.GOMAXPROCS(4)
		for range 4 {
			go func() {
				for n := 0; ; n++ {
					spun.Store(int64(n))
				}
			}()
		}
		select {}
	}
	os.Exit(m.Run())
}

// A process with several threads, all running, is reported stopped only
// after Stop, and no longer after SIGCONT.
func TestStopWaitsForEveryThread(t *testing.T) {
	for i := range 20 {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "PAUSE_SPIN=1")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		pid := cmd.Process.Pid

		stopped, err := Stopped(pid)
		require.NoError(t, err)
		require.False(t, stopped, "iteration %d: a spinning process counted as stopped", i)

		require.NoError(t, Stop(pid))
		stopped, err = Stopped(pid)
		require.NoError(t, err)
		require.True(t, stopped)

		require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		require.Eventually(t, func() bool { s, _ := Stopped(pid); return !s }, time.Second, time.Millisecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

func TestStopOfAnExitedProcessFails(t *testing.T) {
	cmd := exec.Command("/bin/true")
	require.NoError(t, cmd.Run())
	require.Error(t, Stop(cmd.Process.Pid))
}
