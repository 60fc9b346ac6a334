package main

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// child is the command run under the lock, in its own process group so that
// it and everything it started can be signalled together.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child has exited and been reaped
	err  error         // cmd.Wait's result, set before done is closed
}

// startChild starts path with argv and env, sharing lockctl's standard
// streams.
func startChild(path string, argv, env []string, c *cli) (*child, error) {
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: env,
		Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		ch.err = cmd.Wait()
		close(ch.done)
	}()
	return ch, nil
}

// signal sends sig to the child's process group.
func (ch *child) signal(sig syscall.Signal) {
	_ = syscall.Kill(-ch.cmd.Process.Pid, sig)
}

// stop sends SIGTERM to the process group, then SIGKILL if the child has not
// exited by killAt, and waits until it has. It reports whether SIGKILL was
// needed.
func (ch *child) stop(killAt time.Time) (killed bool) {
	ch.signal(syscall.SIGTERM)
	t := time.NewTimer(time.Until(killAt))
	defer t.Stop()
	select {
	case <-ch.done:
		return false
	case <-t.C:
		ch.signal(syscall.SIGKILL)
		<-ch.done
		return true
	}
}

// exitCode is the child's exit code as a shell reports it: its own, or
// 128+N when it died of signal N. Only valid once done is closed.
func (ch *child) exitCode() int {
	var ee *exec.ExitError
	if ch.err != nil && !errors.As(ch.err, &ee) {
		return exitError
	}
	ps := ch.cmd.ProcessState
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
