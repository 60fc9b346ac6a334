package testbroker

import "syscall"

// sysProcAttr puts the broker in its own process group (so Stop can kill
// what it leaves behind) and has the kernel SIGKILL it if the test process
// dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
