//go:build unix

package redistest

import "syscall"

// kill, freeze and thaw send SIGKILL, SIGSTOP and SIGCONT to a node.
func kill(pid int) error   { return syscall.Kill(pid, syscall.SIGKILL) }
func freeze(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }
func thaw(pid int) error   { return syscall.Kill(pid, syscall.SIGCONT) }
