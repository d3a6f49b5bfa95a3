//go:build !unix && !windows

package main

import "syscall"

// childAttr is nil: this system has no process groups to put a child in.
func childAttr() *syscall.SysProcAttr { return nil }
