//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"
)

// endBy ends the process by sig, with its default effect, as a shell
// expects of a program it interrupted; where sig is ignored, with the
// status a shell gives a process sig ended.
func endBy(sig os.Signal) {
	n := sig.(syscall.Signal)
	signal.Reset(n)
	_ = syscall.Kill(os.Getpid(), n) // the process ends by it,
	time.Sleep(time.Second)          // on whichever thread takes it
	os.Exit(128 + int(n))
}
