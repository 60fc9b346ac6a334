//go:build !linux

package consultest

import "syscall"

// sysProcAttr returns nil off Linux: there is no parent-death signal, so an
// agent can outlive a parent that is killed without running Stop.
func sysProcAttr() *syscall.SysProcAttr { return nil }
