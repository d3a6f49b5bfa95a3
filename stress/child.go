package main

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"sync"
)

// The redis-servers the checks start are children of the command that no way
// out of it may leave running. Each is started in a process group of its own
// (childAttr), so that an interrupt a terminal sends to the command's group
// reaches the command alone, which cleans up and kills them, rather than the
// servers while the checks still use them. Where the system has it (Linux,
// FreeBSD), a child is also killed by the kernel when the command dies,
// whatever kills it, SIGKILL included; elsewhere a second signal kills the
// children before it ends the command (killChildren), and a command killed
// otherwise leaves them running.
//
// children is the set of children started and not yet reaped; its mutex
// is held across a start, so that killChildren misses none.
var children struct {
	mu     sync.Mutex
	procs  map[*os.Process]struct{}
	killed bool // killChildren ran: the command is ending, nothing more starts
}

// errEnding refuses a start once killChildren has run.
var errEnding = errors.New("stress: the command is ending: no redis-server is started")

// startChild starts cmd with childAttr and reaps it: the channel it returns
// closes once the child has exited and been waited for. One goroutine,
// locked to its OS thread, starts the child and waits for it: Linux sends
// the parent-death signal when the thread that forked the child ends, not
// the process, and the Go runtime ends a thread when a goroutine exits
// while locked to it, which any goroutine that later ran on the forking
// thread could do; locked, the thread runs nothing else until the child
// is gone.
func startChild(cmd *exec.Cmd) (chan struct{}, error) {
	cmd.SysProcAttr = childAttr()
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // after the wait: the child is gone
		children.mu.Lock()
		err := errEnding
		if !children.killed {
			err = cmd.Start()
		}
		if err == nil {
			if children.procs == nil {
				children.procs = map[*os.Process]struct{}{}
			}
			children.procs[cmd.Process] = struct{}{}
		}
		children.mu.Unlock()
		started <- err
		if err != nil {
			return
		}
		_ = cmd.Wait()
		children.mu.Lock()
		delete(children.procs, cmd.Process)
		children.mu.Unlock()
		close(done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// killChildren kills every child startChild started that has not been
// reaped, with the processes of its group (see kill), and refuses later
// starts: the command is about to end without its checks' cleanup.
func killChildren() {
	children.mu.Lock()
	defer children.mu.Unlock()
	children.killed = true
	for p := range children.procs {
		kill(p) // one already exited is reaped by its goroutine
	}
}
