//go:build unix && !linux && !freebsd

package main

import "syscall"

// childAttr puts a child in a process group of its own. This system has no
// parent-death signal that Go sets, so a command killed by SIGKILL leaves
// its children running (see startChild).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
