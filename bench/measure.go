package main

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// parallelism is goroutines per core, as a busy server runs.
const parallelism = 8

// warm makes one decision for every key so that every contender starts with
// its state built: the benchmark measures deciding, not creating.
func warm(d decider, ks *keySet, batch int) {
	for i := 0; i < len(ks.names); i += batch {
		d.decide(ks.names[i:min(i+batch, len(ks.names))])
	}
}

// rig is one contender set up and warmed for one scenario, kept for every
// measurement of it (the rounds testing.B makes of one benchmark, the
// interleaved rounds of the command): they measure deciding, and building
// and warming the contender again for each of them was most of a short
// run's time. Every key is tracked after warm-up, so a round starts from the
// same steady state whichever round it is.
type rig struct {
	c    contender
	s    scenario
	keys func() *keySet // called once, by the first round
	ks   *keySet
	inst *instance
}

func newRig(c contender, s scenario, keys func() *keySet) *rig {
	return &rig{c: c, s: s, keys: keys}
}

// close releases the contender, if a round set it up.
func (r *rig) close() {
	if r.inst != nil {
		r.inst.close()
	}
}

// ready sets the contender up and warms it, the first time it is called.
func (r *rig) ready() {
	if r.inst == nil {
		r.ks = r.keys()
		inst := r.c.setup(r.s.policy, max(r.s.keys, 1))
		warm(inst.forWorker(), r.ks, max(r.c.batch, 1))
		r.inst = &inst
	}
}

// bench is the benchmark body for `go test -bench`: b.N decide calls of
// the contender's batch size (see run). It reports ns/decision.
func (r *rig) bench(b *testing.B) {
	if r.inst == nil {
		r.ready()
		// Setting up left garbage: collect it now, so no collection of
		// it lands in a timed round, as the command does.
		runtime.GC()
	}
	b.ReportAllocs()
	b.ResetTimer()
	r.run(b.N)
	b.StopTimer()
	// For batch contenders one op is one batch; report per decision so every
	// row compares.
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*r.c.batch), "ns/decision")
}

// run makes calls decide calls of r's batch size: from one goroutine for a
// sequential contender, else as decideParallel does. It returns how many
// of the decisions admitted.
func (r *rig) run(calls int) (allowed int64) { return r.prepare(calls)() }

// prepare sets up run's calls and returns what makes them: the workers,
// their deciders and their cursors exist when it returns, so that a
// measurement of the returned func times and counts the allocations of
// deciding alone.
func (r *rig) prepare(calls int) (start func() (allowed int64)) {
	r.ready()
	c := r.c
	if !c.sequential {
		return prepareParallel(calls, r.ks, c.batch, r.inst.forWorker)
	}
	d, cur := r.inst.forWorker(), newDrawCursor(r.ks, 0, c.batch)
	return func() (allowed int64) {
		for range calls {
			allowed += int64(d.decide(cur.next()))
		}
		return allowed
	}
}

// decideParallel makes calls decide calls of batch draws of ks each from 8
// goroutines per core, as a busy server runs, each with its own decider
// from newDecider and its own place in the draws, taking calls from a
// shared count up to 100 at a time. It returns how many of the decisions
// admitted.
func decideParallel(calls int, ks *keySet, batch int, newDecider func() decider) int64 {
	return prepareParallel(calls, ks, batch, newDecider)()
}

// prepareParallel starts decideParallel's workers, waiting, and returns
// what lets them go and waits for them.
func prepareParallel(calls int, ks *keySet, batch int, newDecider func() decider) (start func() (allowed int64)) {
	workers := parallelism * runtime.GOMAXPROCS(0)
	grain := int64(max(1, min(100, calls/(workers*10))))
	var left, allowed atomic.Int64
	left.Store(int64(calls))
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for w := range workers {
		d, cur := newDecider(), newDrawCursor(ks, (w+1)*104_729, batch)
		wg.Go(func() {
			mine := 0
			defer func() { allowed.Add(int64(mine)) }()
			<-gate
			for {
				n := min(grain, left.Add(-grain)+grain)
				if n <= 0 {
					return
				}
				for range n {
					mine += d.decide(cur.next())
				}
			}
		})
	}
	return func() int64 {
		close(gate)
		wg.Wait()
		return allowed.Load()
	}
}

// drawCursor walks ks.draws in runs of batch keys from a start, wrapping
// around at the end.
type drawCursor struct {
	ks         *keySet
	pos, batch int
}

func newDrawCursor(ks *keySet, start, batch int) drawCursor {
	return drawCursor{ks: ks, pos: start % (drawLen - batch), batch: batch}
}

func (c *drawCursor) next() []string {
	if c.pos+c.batch > drawLen {
		c.pos = 0
	}
	keys := c.ks.draws[c.pos : c.pos+c.batch]
	c.pos += c.batch
	return keys
}

// retainedPerKey measures the heap a contender keeps per tracked key once n
// keys are tracked: live heap after GC, before and after. Each key is made
// afresh just before it is first decided, as a request's key is, so a
// contender that keeps the caller's string is charged for that string and
// one that copies the key is charged for its copy.
func retainedPerKey(c contender, n int) float64 {
	batch := max(c.batch, 1)
	keys := make([]string, batch)
	before := liveHeap()
	inst := c.setup(admitAll, n)
	d := inst.forWorker()
	for i := 0; i < n; i += batch {
		run := keys[:min(batch, n-i)]
		for j := range run {
			run[j] = keyName(i + j)
		}
		d.decide(run)
	}
	clear(keys)
	after := liveHeap()
	runtime.KeepAlive(d) // the decider holds the state of in-process contenders
	inst.close()
	return float64(int64(after)-int64(before)) / float64(n)
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC() // the second cycle frees what the first one's finalizers released
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// latency is the distribution of single Allow calls under parallelism
// goroutines per core, for d.
type latency struct{ p50, p99, p999, max time.Duration }

func allowLatency(ks *keySet, d time.Duration) latency {
	e := newEngine(admitAll, len(ks.names))
	defer e.Close()
	warm(allowDecider{e}, ks, 1)
	workers := parallelism * runtime.GOMAXPROCS(0)
	hists := make([]*hdrhistogram.Histogram, workers)
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for w := range workers {
		hists[w] = hdrhistogram.New(1, int64(time.Second), 3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			pos := (w * 104_729) % drawLen
			for i := 0; ; i++ {
				if i%256 == 0 && time.Now().After(stop) {
					return
				}
				t0 := time.Now()
				_, _ = e.Allow(ctx, ks.draws[pos], 1)
				_ = hists[w].RecordValue(int64(time.Since(t0)))
				pos = (pos + 1) % drawLen
			}
		}()
	}
	wg.Wait()
	return merged(hists)
}

// merged returns the distribution of every call the per-worker histograms
// recorded.
func merged(hists []*hdrhistogram.Histogram) latency {
	all := hdrhistogram.New(1, int64(time.Second), 3)
	for _, h := range hists {
		all.Merge(h)
	}
	return latency{
		p50:  time.Duration(all.ValueAtQuantile(50)),
		p99:  time.Duration(all.ValueAtQuantile(99)),
		p999: time.Duration(all.ValueAtQuantile(99.9)),
		max:  time.Duration(all.Max()),
	}
}

// stall measures the longest single Allow whose call overlaps admin, on an
// engine tracking n keys with parallelism callers per core hammering it.
// baseline is the longest Allow that starts after admin returns, over an
// equally long window: on a noisy machine only the difference means
// anything. Each call is classified by its own interval, so a call held up
// by admin counts as during even if it returns after.
func stall(n int, admin func(e *engine.Engine) error) (worst, baseline, took time.Duration, err error) {
	// Capacity 2 and one token spent per key: nothing is full, so a sweep
	// visits every bucket and evicts none.
	p := policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1}
	e := newEngine(p, n)
	defer e.Close()
	ks := &keySet{names: keyNames(n)}
	warm(&batchDecider{e: e, reqs: make([]engine.Request, 0, 128), out: make([]engine.Result, 128)}, ks, 128)

	base := time.Now()
	since := func() int64 { return int64(time.Since(base)) }
	const unset = int64(1<<63 - 1)
	var during, after, calls, adminStart, adminEnd atomic.Int64
	adminStart.Store(unset)
	adminEnd.Store(unset)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range parallelism * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := w; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				t0 := since()
				_, _ = e.Allow(ctx, ks.names[(i*7919)%n], 1)
				t1 := since()
				switch end := adminEnd.Load(); {
				case t1 >= adminStart.Load() && t0 <= end:
					raise(&during, t1-t0)
				case t0 > end:
					raise(&after, t1-t0)
				}
				calls.Add(1)
			}
		}()
	}
	// Let every caller reach steady state before measuring anything.
	for calls.Load() < 100_000 {
		runtime.Gosched()
	}
	adminStart.Store(since())
	err = admin(e)
	adminEnd.Store(since())
	took = time.Duration(adminEnd.Load() - adminStart.Load())
	// Then the same length of time again, with no admin call, as the baseline.
	window := max(took, 10*time.Millisecond)
	for start := time.Now(); time.Since(start) < window; {
		runtime.Gosched()
	}
	close(done)
	wg.Wait()
	return time.Duration(during.Load()), time.Duration(after.Load()), took, err
}

// raise sets *a to v if v is larger, without losing a concurrent larger value.
func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}
