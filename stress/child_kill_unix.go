//go:build unix

package main

import (
	"os"
	"syscall"
)

// kill sends SIGKILL to the process group p leads (see childAttr): p and
// every process it started that is still in its group, such as a
// redis-server's save or rewrite child, which SIGKILL to p alone would
// leave running. Where the group is gone it kills p alone.
func kill(p *os.Process) {
	if syscall.Kill(-p.Pid, syscall.SIGKILL) != nil {
		_ = p.Kill()
	}
}
