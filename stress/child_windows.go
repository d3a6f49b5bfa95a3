package main

import "syscall"

// childAttr starts a child in a process group of its own, which a Ctrl-C
// at the console does not reach.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
}
