package consultest

import "syscall"

// sysProcAttr puts the agent in its own process group, so a terminal's
// Ctrl-C reaches only the parent (which then stops the agent deliberately),
// and asks the kernel to SIGKILL the agent if the parent dies first.
//
// Pdeathsig fires when the OS thread that forked the child exits, not the
// whole parent process. The Go runtime only retires a thread when a goroutine
// exits while locked to it (runtime.LockOSThread); this package never does
// that, but if other code does it on the forking thread the agent dies early.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
