//go:build !unix

package main

import "os"

// kill ends p (on Windows with TerminateProcess). These systems have no
// process group a signal could reach.
func kill(p *os.Process) { _ = p.Kill() }
