package main

import "syscall"

// childAttr puts a child in a process group of its own, and has the
// kernel kill it with SIGKILL when the thread that started it ends (see
// startChild), which it does when the command dies, however it dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
