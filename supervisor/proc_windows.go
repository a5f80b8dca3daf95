package supervisor

import "syscall"

// sysProcAttr: Windows has no process groups to put a worker in; Ctrl-C reaches every worker directly.
func sysProcAttr() *syscall.SysProcAttr { return nil }
