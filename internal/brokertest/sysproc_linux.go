package brokertest

import "syscall"

// sysProcAttr puts the broker in its own process group (so that Kill ends
// the Consul agent a --dev broker started too) and has the kernel SIGKILL
// it if the test process dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
