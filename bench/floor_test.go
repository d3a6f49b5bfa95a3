package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/internal/yield"
)

// BenchmarkHandoffFloor is the least a single call can cost on a design
// where one goroutine owns the state: BenchmarkDecide's harness (the same
// callers per core, the hot key's draws) calling a decider that hands each
// key to an owner goroutine and waits for its answer as tokenshard's Allow
// does (a push onto a lock-free list, the owner's take-all, a flag, the
// caller's yields), with nothing decided: no hash, no clock, no map, no
// bucket. The engine's single call is this plus its decision; a peer that
// decides on the caller's goroutine (go-limiter's mutex) pays no hand-off.
// Run beside that peer:
//
//	go test -run '^$' -bench 'HandoffFloor|Decide/scenario=hot/contender=(tokenshard_Allow|go-limiter_memorystore)$' -cpu 1,2 -count 6 ./bench
func BenchmarkHandoffFloor(b *testing.B) {
	var fl handoff
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { fl.own(&stop) })
	defer func() { stop.Store(true); wg.Wait() }()
	ks := keysFor(scenarios[0])
	runtime.GC()
	b.ResetTimer()
	decideParallel(b.N, ks, 1, func() decider { return &handoffCaller{fl: &fl} })
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/decision")
}

// handoff is the owner's mailbox: callers push, the owner takes them all.
type handoff struct{ head atomic.Pointer[handoffCaller] }

type handoffCaller struct {
	fl   *handoff
	next *handoffCaller
	done atomic.Bool
}

// own answers every pushed caller, yielding between takes, until stop.
func (fl *handoff) own(stop *atomic.Bool) {
	for !stop.Load() {
		for c := fl.head.Swap(nil); c != nil; {
			next := c.next
			c.done.Store(true)
			c = next
		}
		yield.Local()
	}
}

func (c *handoffCaller) decide(keys []string) int {
	c.done.Store(false)
	for {
		old := c.fl.head.Load()
		c.next = old
		if c.fl.head.CompareAndSwap(old, c) {
			break
		}
	}
	for !c.done.Load() {
		yield.Local()
	}
	return len(keys)
}
