package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jedib0t/go-pretty/v6/progress"
	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/tokenshard/tokenshard/engine"
)

// Violation is a broken invariant, explained: which check, key and
// operation, what the contract wanted and what the engine gave.
type Violation struct {
	Check  string
	Key    string
	Op     string
	Want   string
	Got    string
	Seed   uint64
	Detail string // a reproduction or a history excerpt, when there is one
}

func (v *Violation) Error() string {
	s := fmt.Sprintf("%s violation (seed %d): key %q, op %s: want %s, got %s", v.Check, v.Seed, v.Key, v.Op, v.Want, v.Got)
	if v.Detail != "" {
		s += "\n" + v.Detail
	}
	return s
}

// errKind indexes counters.errs.
type errKind int

const (
	kindInvalidKey errKind = iota
	kindInvalidCost
	kindKeyCapacity
	kindStalePolicy
	kindClockRegression
	kindClosed
	kindContext
	kindAllowAllSize
	kindOther
	numKinds
)

var kindNames = [numKinds]string{"key", "cost", "capacity", "stale", "regression", "closed", "context", "allowall-size", "other"}

func kindOf(err error) errKind {
	switch {
	case errors.Is(err, engine.ErrInvalidKey):
		return kindInvalidKey
	case errors.Is(err, engine.ErrInvalidCost):
		return kindInvalidCost
	case errors.Is(err, engine.ErrKeyCapacity):
		return kindKeyCapacity
	case errors.Is(err, engine.ErrStalePolicy):
		return kindStalePolicy
	case errors.Is(err, engine.ErrClockRegression):
		return kindClockRegression
	case errors.Is(err, engine.ErrClosed):
		return kindClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return kindContext
	case errors.Is(err, engine.ErrAllowAllSize):
		return kindAllowAllSize
	}
	return kindOther
}

// counters are what every check reports as it goes; the progress line and the
// summary read them. All fields are atomics: checks update them from many
// goroutines.
type counters struct {
	decisions    atomic.Int64
	allowed      atomic.Int64
	denied       atomic.Int64
	errs         [numKinds]atomic.Int64
	keys         atomic.Int64 // keys tracked by the conservation engine, last read
	cutovers     atomic.Int64 // successful ReplacePolicy calls
	stale        atomic.Int64 // ReplacePolicy calls refused as stale, on purpose
	evictions    atomic.Int64 // keys removed by EvictFull
	histories    atomic.Int64 // linearizability histories checked
	linTimeouts  atomic.Int64 // histories porcupine could not decide in time (not violations)
	traces       atomic.Int64 // differential traces replayed
	floodKeys    atomic.Int64 // distinct keys offered by the flood
	overridden   atomic.Int64 // decisions under a key's own limit (an override), where a check knows it
	limitMoves   atomic.Int64 // keys a successful cutover gave another limit, where a check knows it
	multiBand    atomic.Int64 // decisions under a limit of several bands, where a check knows it
	bandBound    atomic.Int64 // of those, decisions a band other than the primary bound
	otherPeriod  atomic.Int64 // decisions under a limit with a rate not per second, where a check knows it
	bandMoves    atomic.Int64 // bands a successful cutover added, dropped or reshaped for a key, where a check knows it
	allAdmitted  atomic.Int64 // AllowAll calls admitted, where a check makes them
	allRefused   atomic.Int64 // AllowAll calls refused (decided, not an error)
	allSpread    atomic.Int64 // decided AllowAll calls over keys of several shards, where a check knows it
	holdsAborted atomic.Int64 // AllowAll holds given up for a cutover, sweep or Close (the call tried again), where a check reads them
	charges      atomic.Int64 // Charge calls answered, where a check makes them
	debts        atomic.Int64 // of those, charges that left the binding band in debt
	restores     atomic.Int64 // engines restored from a snapshot mid-trace
	peakHeap     atomic.Uint64
	report       atomic.Pointer[string] // a measurement's table, printed after the summary
}

// record counts one decision or error.
func (c *counters) record(d engine.Decision, err error) {
	switch {
	case err != nil:
		c.errs[kindOf(err)].Add(1)
	case d.Allowed:
		c.decisions.Add(1)
		c.allowed.Add(1)
	default:
		c.decisions.Add(1)
		c.denied.Add(1)
	}
}

// sampleHeap raises peakHeap to the current live heap.
func (c *counters) sampleHeap() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for {
		p := c.peakHeap.Load()
		if ms.HeapAlloc <= p || c.peakHeap.CompareAndSwap(p, ms.HeapAlloc) {
			return
		}
	}
}

func (c *counters) line(elapsed time.Duration, decisionsPerSec float64) string {
	var errs []string
	for k := range numKinds {
		if n := c.errs[k].Load(); n > 0 {
			errs = append(errs, fmt.Sprintf("%s=%d", kindNames[k], n))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, "none")
	}
	return fmt.Sprintf("%5.1fs  %9.0f decisions/s  allowed %d  denied %d  errors %s  keys %d  cutovers %d  evicted %d  histories %d",
		elapsed.Seconds(), decisionsPerSec, c.allowed.Load(), c.denied.Load(), strings.Join(errs, " "),
		c.keys.Load(), c.cutovers.Load(), c.evictions.Load(), c.histories.Load())
}

// outcome is how one check ended.
type outcome struct {
	name string
	err  error
	took time.Duration
	// interrupted: the check ended after the caller's context did (an
	// interrupt or SIGTERM, in the command), so what it could not do is
	// not a failure.
	interrupted bool
}

// runChecks runs the selected checks side by side for o.duration, reporting
// progress every second, then checks that they left no goroutine running
// (leak.go) and prints the summary. It returns 1 if any check found a
// violation or could not run, or a goroutine was left, 0 otherwise. A check that ends after
// ctx has ended (the command's signal) is reported interrupted, and fails
// the run only by a violation: one stopped early does not have to say it
// could not run.
func runChecks(ctx context.Context, o options, out io.Writer) int {
	stopped := ctx
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	fmt.Fprintf(out, "stress: seed %d, checks %s, duration %v, GOMAXPROCS %d\n",
		o.seed, strings.Join(o.checks, ","), o.duration, runtime.GOMAXPROCS(0))

	c := &counters{}
	base := leakBaseline()
	results := make(chan outcome, len(o.checks))
	start := time.Now()
	started := 0 // each check runs once, however often o.checks names it
	for _, ch := range checks {
		if !slices.Contains(o.checks, ch.name) {
			continue
		}
		started++
		go func() {
			t0 := time.Now()
			err := ch.run(ctx, o, c)
			if err != nil {
				cancel() // the first violation stops everything
			}
			results <- outcome{name: ch.name, err: err, took: time.Since(t0), interrupted: stopped.Err() != nil}
		}()
	}

	p := newProgress(out, o.duration)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var done []outcome
	lastDecisions, lastTick := int64(0), start
	for len(done) < started {
		select {
		case r := <-results:
			done = append(done, r)
		case now := <-tick.C:
			c.sampleHeap()
			d := c.decisions.Load()
			rate := float64(d-lastDecisions) / now.Sub(lastTick).Seconds()
			lastDecisions, lastTick = d, now
			p.update(now.Sub(start), c.line(now.Sub(start), rate))
		}
	}
	p.stop()
	c.sampleHeap()
	took := time.Since(start)
	leak := outcome{name: leakCheckName, interrupted: stopped.Err() != nil}
	t0 := time.Now()
	if v := checkLeaks(base, o.seed); v != nil {
		leak.err = v
	}
	leak.took = time.Since(t0)
	return summarize(out, o, c, append(done, leak), took)
}

// progressView prints one line a second, or drives a progress bar when
// stdout is a terminal.
type progressView struct {
	out     io.Writer
	pw      progress.Writer
	tracker *progress.Tracker
	wg      sync.WaitGroup
}

func newProgress(out io.Writer, total time.Duration) *progressView {
	p := &progressView{out: out}
	f, ok := out.(*os.File)
	if !ok {
		return p
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return p
	}
	p.pw = progress.NewWriter()
	p.pw.SetOutputWriter(out)
	p.pw.SetUpdateFrequency(200 * time.Millisecond)
	p.pw.SetTrackerLength(30)
	p.pw.SetMessageLength(140)
	elapsed := progress.Units{Formatter: func(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }}
	p.tracker = &progress.Tracker{Message: "starting", Total: int64(total / time.Millisecond), Units: elapsed}
	p.pw.AppendTracker(p.tracker)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pw.Render()
	}()
	return p
}

func (p *progressView) update(elapsed time.Duration, line string) {
	if p.pw == nil {
		fmt.Fprintln(p.out, line)
		return
	}
	p.tracker.UpdateMessage(line)
	p.tracker.SetValue(min(int64(elapsed/time.Millisecond), p.tracker.Total))
}

func (p *progressView) stop() {
	if p.pw == nil {
		return
	}
	p.tracker.MarkAsDone()
	p.pw.Stop()
	p.wg.Wait()
}

// summarize prints the final table and the first violation, and returns the
// exit status.
func summarize(out io.Writer, o options, c *counters, done []outcome, took time.Duration) int {
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.AppendHeader(table.Row{"check", "result", "time"})
	status := 0
	var first *Violation
	for _, r := range done {
		result := "ok"
		var v *Violation
		switch {
		case errors.As(r.err, &v):
			result = "VIOLATION"
			status = 1
			if first == nil {
				first = v
			}
		case r.interrupted && r.err != nil:
			result = "interrupted: " + r.err.Error()
		case r.interrupted:
			result = "interrupted"
		case r.err != nil:
			result = "failed: " + r.err.Error()
			status = 1
		}
		t.AppendRow(table.Row{r.name, result, r.took.Round(time.Millisecond)})
	}
	t.Render()

	s := table.NewWriter()
	s.SetOutputMirror(out)
	s.AppendHeader(table.Row{"measure", "value"})
	s.AppendRows([]table.Row{
		{"decisions", c.decisions.Load()},
		{"decisions/s", fmt.Sprintf("%.0f", float64(c.decisions.Load())/took.Seconds())},
		{"allowed", c.allowed.Load()},
		{"denied", c.denied.Load()},
	})
	for k := range numKinds {
		s.AppendRow(table.Row{"errors: " + kindNames[k], c.errs[k].Load()})
	}
	s.AppendRows([]table.Row{
		{"cutovers (stale refused)", fmt.Sprintf("%d (%d)", c.cutovers.Load(), c.stale.Load())},
		{"keys evicted", c.evictions.Load()},
		{"linearizability histories", c.histories.Load()},
		{"linearizability timeouts (not violations)", c.linTimeouts.Load()},
		{"differential traces", c.traces.Load()},
		{"decisions under an override", c.overridden.Load()},
		{"keys given another limit by a cutover", c.limitMoves.Load()},
		{"decisions under several bands (bound by a band beside the primary)", fmt.Sprintf("%d (%d)", c.multiBand.Load(), c.bandBound.Load())},
		{"decisions under a rate not per second", c.otherPeriod.Load()},
		{"bands added, dropped or reshaped by a cutover", c.bandMoves.Load()},
		{"AllowAll admitted, refused (over several shards)", fmt.Sprintf("%d, %d (%d)", c.allAdmitted.Load(), c.allRefused.Load(), c.allSpread.Load())},
		{"AllowAll holds given up to a cutover or sweep (the call tried again)", c.holdsAborted.Load()},
		{"charges (leaving a debt), snapshot restores", fmt.Sprintf("%d (%d), %d", c.charges.Load(), c.debts.Load(), c.restores.Load())},
		{"flood keys offered", c.floodKeys.Load()},
		{"peak heap", fmt.Sprintf("%.1f MiB", float64(c.peakHeap.Load())/(1<<20))},
	})
	s.Render()
	if r := c.report.Load(); r != nil {
		fmt.Fprintln(out, *r)
	}
	if first != nil {
		fmt.Fprintln(out, "FIRST VIOLATION:", first.Error())
	}
	return status
}
