//go:build unix && !linux

package supervisor

import "syscall"

// sysProcAttr puts a worker in a process group of its own, so that a Ctrl-C on the terminal reaches only
// the supervisor, which then stops the workers in order.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
