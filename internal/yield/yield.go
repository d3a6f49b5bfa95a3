//go:build !purego

// Package yield lets a goroutine give up its processor briefly without
// taking the scheduler's global lock.
//
// runtime.Gosched puts the yielding goroutine on the global run queue, under
// a lock every processor contends for, and wakes an idle processor to take
// it: with callers and shards yielding to each other on two cores, that lock
// took much of the CPU time (package bench's Performance notes give the
// figure). The runtime's goyield puts it at the back of its own processor's
// queue instead, and the runtime keeps it for packages that link to it
// (go.dev/issue/67401). The price: no idle processor is woken for the
// yielder, which waits behind whatever its own processor has queued (traces
// show these yields as preemptions). Built with -tags purego, Local is
// runtime.Gosched.
package yield

import _ "unsafe" // for go:linkname

// Local yields the processor to the goroutines queued on it and resumes
// after them, like runtime.Gosched but on the processor's own run queue.
//
//go:linkname Local runtime.goyield
func Local()
