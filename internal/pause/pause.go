// Package pause stops a process with SIGSTOP and waits until it has
// stopped.
//
// kill(2) returns once SIGSTOP is queued, not once the process is stopped:
// each thread stops when it next enters the kernel or is interrupted, and
// on a loaded machine a thread already running can go on for milliseconds,
// long enough to answer a request its test believes goes unanswered. Stop
// waits until every thread of the process shows the stopped state in
// /proc.
package pause

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// settle bounds the wait for the threads to stop.
const settle = 5 * time.Second

// Stop sends SIGSTOP to the process pid and returns once all its threads
// are stopped, or an error if they are not within 5 s or the process is
// gone.
func Stop(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause: SIGSTOP %d: %w", pid, err)
	}
	deadline := time.Now().Add(settle)
	for {
		stopped, err := Stopped(pid)
		if err != nil {
			return err
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pause: process %d not stopped %v after SIGSTOP", pid, settle)
		}
		time.Sleep(time.Millisecond)
	}
}

// Stopped reports whether every thread of the process pid is stopped
// (state T or t in /proc/<pid>/task/<tid>/stat).
func Stopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, fmt.Errorf("pause: process %d: %w", pid, err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "task", task.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses
		// and may itself hold ") ".
		i := strings.LastIndex(string(stat), ") ")
		if i < 0 || i+2 >= len(stat) {
			return false, fmt.Errorf("pause: unreadable stat of %d/%s", pid, task.Name())
		}
		switch stat[i+2] {
		case 'T', 't':
		case 'Z', 'X':
			return false, fmt.Errorf("pause: process %d has exited", pid)
		default:
			return false, nil
		}
	}
	return len(tasks) > 0, nil
}
