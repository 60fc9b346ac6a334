//go:build !linux

package brokertest

import "syscall"

// sysProcAttr puts the broker in its own process group; off Linux there is
// no parent-death signal, so a killed test can leave the broker running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
