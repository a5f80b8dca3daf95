package supervisor

import "syscall"

// sysProcAttr puts a worker in a process group of its own, so that a Ctrl-C on the terminal reaches only
// the supervisor, which then stops the workers in order; and asks the kernel to send the worker SIGTERM if
// the supervisor dies without doing so (SIGKILL, OOM killer), so that no worker outlives it unseen.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
