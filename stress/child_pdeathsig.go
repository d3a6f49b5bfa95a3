//go:build linux || freebsd

package main

import "syscall"

// childAttr puts a child in a process group of its own, and has the
// kernel kill it with SIGKILL when its parent dies (on Linux, when the
// thread that started it ends: see startChild), however the command dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
