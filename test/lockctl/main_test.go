// Package lockctl_test runs the lockctl binary against a real broker and a
// real Consul agent (see internal/brokertest) and checks what a user of the
// command relies on: mutual exclusion of the commands it runs, exit codes,
// and what happens to the command when the lock is lost.
package lockctl_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary act as the command run under the lock
// instead of running tests (see recordHold).
const helperEnv = "LOCKCTL_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "record" {
		os.Exit(recordHold())
	}
	goleak.VerifyTestMain(m)
}

// recordHold is the child of `lockctl lock` in the overlap test: it appends
// "start NANOS TOKEN SESSION KEY LOCK_INDEX" to $LOCKCTL_TEST_FILE, sleeps
// $LOCKCTL_TEST_HOLD, then appends "end NANOS TOKEN".
func recordHold() int {
	file := os.Getenv("LOCKCTL_TEST_FILE")
	hold, err := time.ParseDuration(os.Getenv("LOCKCTL_TEST_HOLD"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "recordHold:", err)
		return 2
	}
	token := os.Getenv("LOCKBROKER_TOKEN")
	if err := appendLine(file, fmt.Sprintf("start %d %s %s %s %s", time.Now().UnixNano(), token,
		os.Getenv("LOCKBROKER_SESSION"), os.Getenv("LOCKBROKER_KEY"), os.Getenv("LOCKBROKER_LOCK_INDEX"))); err != nil {
		fmt.Fprintln(os.Stderr, "recordHold:", err)
		return 2
	}
	time.Sleep(hold)
	if err := appendLine(file, fmt.Sprintf("end %d %s", time.Now().UnixNano(), token)); err != nil {
		fmt.Fprintln(os.Stderr, "recordHold:", err)
		return 2
	}
	return 0
}

// appendLine appends line and a newline to the file at path in one write.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
