//go:build !purego

// Package yield lets a goroutine give up its processor briefly without
// taking the scheduler's global lock.
//
// runtime.Gosched puts the yielding goroutine on the global run queue, under
// a lock every processor contends for, and wakes an idle processor to take
// it. The runtime's goyield puts it at the back of its own processor's queue
// instead, and the runtime keeps it for packages that link to it
// (go.dev/issue/67401). The price: no idle processor is woken for the
// yielder, which waits behind whatever its own processor has queued (traces
// show these yields as preemptions). Where callers and shards yield to each
// other, one request at a time, it pays: BenchmarkDecide's tokenshard_Allow
// rows in package bench, or engine's BenchmarkAllow, built with and without
// -tags purego, which makes Local runtime.Gosched, compare the two (package
// bench's Performance notes give the figures).
package yield

import _ "unsafe" // for go:linkname

// Local yields the processor to the goroutines queued on it and resumes
// after them, like runtime.Gosched but on the processor's own run queue.
//
//go:linkname Local runtime.goyield
func Local()
