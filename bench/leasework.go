package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/keycopy"
)

// A worker of the leases part is this binary run again with its job, in
// JSON, in the environment variable leaseWorkerEnv; main (and the tests'
// TestMain) look for it before anything else. It sets its contender up,
// says "ready" on stdout, and then follows the lines the part writes on its
// stdin: "run" starts its goroutines deciding, "measure" opens the window
// (counts, and a CPU profile if asked), which the worker closes itself once
// the job's Window has passed: a worker the scheduler runs late still
// measures a whole window, where one closed by a second line could read
// both at once and measure nothing. It then writes what the window
// measured, one line of JSON, closes its contender (a leased store gives
// its leases back) and exits. Its stdin closing before "measure" stops it
// too: a worker outlives no part by more than its window.

// leaseWorkerEnv names the variable that makes this binary a worker.
const leaseWorkerEnv = "TOKENSHARD_BENCH_LEASE_WORKER"

// leaseJob is what one worker process does.
type leaseJob struct {
	Kind       string // kindEngine, kindLeased, kindStore or kindRedisRate
	Addr       string // the Redis server (-redis, -redis-cluster)
	Prefix     string // of every key
	Goroutines int
	Index      int    // the process's place in its cell: its draws
	CPUProfile string // if not "", the window's CPU profile goes to CPUProfile.<Index>.pprof
	Window     time.Duration
}

// leaseReport is what a worker's window measured.
type leaseReport struct {
	Decisions, Allowed, Errors int64
	Elapsed                    time.Duration
	Mallocs                    uint64
	Local, Failures            uint64 // a store's Stats, over the window
	Hist                       *hdrhistogram.Snapshot
}

// leaseDraws is how many key draws a worker precomputes; its goroutines
// walk them from different offsets.
const leaseDraws = 1 << 14

// Phases of a worker's goroutines.
const (
	phaseWarm = iota
	phaseMeasure
	phaseStop
)

// leaseWorkerMain runs this process as a worker if leaseWorkerEnv is set,
// and says whether it was, with the exit code.
func leaseWorkerMain() (code int, worker bool) {
	v, ok := os.LookupEnv(leaseWorkerEnv)
	if !ok {
		return 0, false
	}
	var job leaseJob
	if err := json.Unmarshal([]byte(v), &job); err != nil {
		fmt.Fprintf(os.Stderr, "bench worker: bad %s: %v\n", leaseWorkerEnv, err)
		return 2, true
	}
	if err := leaseWork(job, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1, true
	}
	return 0, true
}

// leaseWork is a worker's life: job set up, then the lines of in followed.
func leaseWork(job leaseJob, in io.Reader, out io.Writer) (err error) {
	ctx := context.Background()
	var errs atomic.Int64
	var newDecider func() decider
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			err = errors.Join(err, closers[i]())
		}
	}()
	stats := func() redisstore.Stats { return redisstore.Stats{} }
	var rdb redis.UniversalClient
	if job.Kind != kindEngine {
		if rdb, err = newRedisClient(ctx, job.Addr); err != nil {
			return err
		}
		closers = append(closers, rdb.Close)
	}
	switch job.Kind {
	case kindEngine:
		e, err := engine.New(engine.Config{Policy: leasePolicy})
		if err != nil {
			return err
		}
		closers = append(closers, e.Close)
		newDecider = func() decider { return admitterDecider(e, &errs, 1) }
	case kindLeased, kindStore:
		c := redisstore.Config{Client: rdb, Prefix: job.Prefix, Policy: leasePolicy, Timeout: redisTimeout}
		if job.Kind == kindLeased {
			c.Leases = &redisstore.Leases{}
		}
		st, err := redisstore.New(ctx, c)
		if err != nil {
			return err
		}
		closers = append(closers, st.Close)
		stats = st.Stats
		newDecider = func() decider { return admitterDecider(st, &errs, 1) }
	case kindRedisRate:
		rp := &ratePeer{rdb: rdb, l: redis_rate.NewLimiter(rdb), limit: gcraLimit(leasePolicy), pfx: job.Prefix}
		newDecider = func() decider { return rp.decider(&errs, 1) }
	default:
		return fmt.Errorf("unknown kind %q", job.Kind)
	}

	r := rand.New(rand.NewSource(int64(job.Index) + 1))
	picks := make([]int, leaseDraws)
	for i := range picks {
		picks[i] = r.Intn(leaseKeys)
	}
	draws := keycopy.Copies(keyNames(leaseKeys), picks)

	lines := bufio.NewScanner(in)
	expect := func(want string) error {
		if !lines.Scan() {
			return errors.Join(fmt.Errorf("stdin closed before %q", want), lines.Err())
		}
		if got := strings.TrimSpace(lines.Text()); got != want {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	if err := expect("run"); err != nil {
		return err
	}
	var phase atomic.Int32
	counts := make([][2]int64, job.Goroutines) // decisions and admitted in the window
	hists := make([]*hdrhistogram.Histogram, job.Goroutines)
	var wg sync.WaitGroup
	defer func() { phase.Store(phaseStop); wg.Wait() }() // an early return
	for g := range job.Goroutines {
		d := newDecider()
		if job.Goroutines == 1 {
			hists[g] = hdrhistogram.New(1, int64(time.Second), 3)
		}
		h := hists[g]
		wg.Go(func() {
			pos := (g * 1021) % len(draws)
			var n, a int64
			for {
				ph := phase.Load()
				if ph == phaseStop {
					break
				}
				k := draws[pos : pos+1]
				if pos++; pos == len(draws) {
					pos = 0
				}
				switch {
				case ph != phaseMeasure:
					d.decide(k)
					continue
				case h != nil:
					t0 := time.Now()
					a += int64(d.decide(k))
					_ = h.RecordValue(min(int64(time.Since(t0)), int64(time.Second)))
				default:
					a += int64(d.decide(k))
				}
				n++
			}
			counts[g] = [2]int64{n, a}
		})
	}

	if err := expect("measure"); err != nil {
		return err
	}
	var prof *os.File
	if job.CPUProfile != "" {
		if prof, err = os.Create(fmt.Sprintf("%s.%d.pprof", job.CPUProfile, job.Index)); err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(prof); err != nil {
			_ = prof.Close()
			return err
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	s0 := stats()
	errs.Store(0)
	t0 := time.Now()
	phase.Store(phaseMeasure)
	time.Sleep(job.Window) // the measurement window, on the real clock
	phase.Store(phaseStop)
	elapsed := time.Since(t0)
	wg.Wait()
	if prof != nil {
		pprof.StopCPUProfile()
		err = errors.Join(err, prof.Close())
	}
	if err != nil {
		return err
	}
	runtime.ReadMemStats(&m1)
	s1 := stats()
	rep := leaseReport{Elapsed: elapsed, Errors: errs.Load(), Mallocs: m1.Mallocs - m0.Mallocs,
		Local: s1.Local - s0.Local, Failures: s1.Failures - s0.Failures}
	for _, c := range counts {
		rep.Decisions += c[0]
		rep.Allowed += c[1]
	}
	if hists[0] != nil {
		rep.Hist = hists[0].Export()
	}
	return json.NewEncoder(out).Encode(rep)
}

// leaseProc is a running worker, seen from the part.
type leaseProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan string   // its stdout's lines
	read   chan struct{} // closed when its stdout is read to the end
	stderr bytes.Buffer  // read once it has exited
}

// line is the worker's next line of output, within timeout.
func (p *leaseProc) line(timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", errors.New("a worker exited")
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("a worker did not answer in %s", timeout)
	}
}

// leaseAnswer bounds how long a worker may take to answer: to set up,
// or to report once the window is closed (a store's calls to Redis in
// flight, under the race detector).
const leaseAnswer = time.Minute

// runLeaseCell runs procs workers of job over one window, bracketed by
// the Redis server's INFO, and sums what they measured. Every worker has
// exited when it returns.
func runLeaseCell(ctx context.Context, rdb redis.UniversalClient, exe string, job leaseJob, procs int, times leaseTimes) (c leaseCell, err error) {
	quit := make(chan struct{})
	var ps []*leaseProc
	defer func() {
		close(quit)
		var tails []string
		for i, p := range ps {
			_ = p.in.Close() // the worker's way out, if it is still waiting
			t := time.NewTimer(leaseAnswer)
			select {
			case <-p.read:
			case <-t.C:
				_ = p.cmd.Process.Kill()
				<-p.read
			}
			t.Stop()
			if werr := p.cmd.Wait(); werr != nil {
				tails = append(tails, fmt.Sprintf("worker %d: %v: %s", i, werr, strings.TrimSpace(p.stderr.String())))
			}
		}
		if len(tails) > 0 {
			err = errors.Join(err, errors.New(strings.Join(tails, "; ")))
		}
	}()
	for i := range procs {
		j := job
		j.Index = i
		b, err := json.Marshal(j)
		if err != nil {
			return c, err
		}
		p := &leaseProc{cmd: exec.Command(exe), lines: make(chan string), read: make(chan struct{})}
		p.cmd.Env = append(os.Environ(), leaseWorkerEnv+"="+string(b))
		p.cmd.Stderr = &p.stderr
		if p.in, err = p.cmd.StdinPipe(); err != nil {
			return c, err
		}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return c, err
		}
		if err := p.cmd.Start(); err != nil {
			return c, err
		}
		ps = append(ps, p)
		go func() {
			defer close(p.read)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(nil, 16<<20) // a histogram's snapshot is one long line
			for sc.Scan() {
				select {
				case p.lines <- sc.Text():
				case <-quit:
				}
			}
		}()
	}
	say := func(cmd string) error {
		for _, p := range ps {
			if _, err := fmt.Fprintln(p.in, cmd); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range ps {
		if l, err := p.line(leaseAnswer); err != nil || l != "ready" {
			return c, errors.Join(fmt.Errorf("setting a worker up: said %q", l), err)
		}
	}
	if err := say("run"); err != nil {
		return c, err
	}
	time.Sleep(times.warm)
	cmd0, err0 := readCmdStats(ctx, rdb)
	cpu0, err1 := redisCPU(ctx, rdb)
	if err := say("measure"); err != nil {
		return c, err
	}
	time.Sleep(times.window)
	cpu1, err2 := redisCPU(ctx, rdb)
	cmd1, err3 := readCmdStats(ctx, rdb)
	c.info = errors.Join(err0, err1, err2, err3) == nil
	c.cpu, c.calls = cpu1-cpu0, cmd1.calls-cmd0.calls
	var snaps []*hdrhistogram.Snapshot
	for _, p := range ps {
		l, err := p.line(leaseAnswer + times.window)
		if err != nil {
			return c, err
		}
		var r leaseReport
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			return c, fmt.Errorf("a worker's report: %w", err)
		}
		c.rate += float64(r.Decisions) / r.Elapsed.Seconds()
		c.decisions += r.Decisions
		c.admitted += r.Allowed
		c.errs += r.Errors
		c.local += r.Local
		c.failures += r.Failures
		c.mallocs += r.Mallocs
		snaps = append(snaps, r.Hist)
	}
	if job.Goroutines == 1 {
		c.lat = mergedSnapshots(snaps)
	}
	return c, nil
}
