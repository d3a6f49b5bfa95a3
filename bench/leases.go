package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The leases part measures redisstore with leases (Config.Leases) beside
// the same store without them, redis_rate and the in-process engine, each
// in worker processes that share one Redis, as the replicas of a service
// do: this binary run again (os.Executable) with the worker's job in an
// environment variable (leasework.go). A row's processes start, warm up,
// and are measured over the same window, which the part brackets with the
// Redis server's INFO.

// leasePolicy is the limit of every key of the part: a quota far above any
// run's demand, so that every request is admitted and a lease is never cut
// short by the bucket's reserve. Its capacity (2^40 tokens) and rate (one
// token a second) keep the store's script on its fast path in doubles (a
// capacity of at most 2^52, a rate under 4.5 million a second): with a rate
// of 2^40 a second too, the store without leases would take the script's
// limb arithmetic, several times slower, and flatter the leased store's
// ratios. At one token a second, a bucket prespent by redisHeadroom tokens
// is never full during the part, so every decision updates a bucket that
// exists, as the Redis section's do.
var leasePolicy = policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}

// leaseKeys is how many keys the processes decide, each request on one of
// them drawn at random: a handful of busy keys, each leased by every
// process.
const leaseKeys = 16

// Kinds of worker: what one decides with.
const (
	kindEngine    = "engine"     // the in-process engine, a bucket per process
	kindLeased    = "leased"     // redisstore with Leases{} (its defaults)
	kindStore     = "store"      // redisstore without leases
	kindRedisRate = "redis_rate" // redis_rate's Limiter.Allow
)

// leaseRow is one contender of the part.
type leaseRow struct {
	name, kind string
}

var (
	leaseLatencyRows = []leaseRow{
		{"engine Allow", kindEngine},
		{"redisstore Allow, leases", kindLeased},
		{"redisstore Allow, no leases", kindStore},
	}
	leaseThroughputRows = []leaseRow{
		{"engine Allow", kindEngine},
		{"redisstore Allow, leases", kindLeased},
		{"redisstore Allow, no leases", kindStore},
		{"redis_rate Allow", kindRedisRate},
	}
)

// leaseLatencyProcs are the process counts the latency table is measured
// at, one goroutine each; the throughput table runs leaseProcs processes of
// leaseGoroutines goroutines each.
var leaseLatencyProcs = []int{1, 4}

const (
	leaseProcs      = 4
	leaseGoroutines = 16
)

// leaseTimes are how long each cell's processes decide before the window
// (a lease sized to their demand, connections open), how long the window
// is, and over how many interleaved rounds each cell's median is taken.
type leaseTimes struct {
	warm, window time.Duration
	rounds       int
}

// leaseTimesFor is a variable so that a test can run the part with tiny
// durations.
var leaseTimesFor = func(quick bool) leaseTimes {
	if quick {
		return leaseTimes{warm: 100 * time.Millisecond, window: 250 * time.Millisecond, rounds: 1}
	}
	return leaseTimes{warm: 500 * time.Millisecond, window: time.Second, rounds: 3}
}

// leaseCell is what one run of a row's processes measured, summed over
// them.
type leaseCell struct {
	rate                float64 // decisions per second: the processes' rates, summed
	decisions, admitted int64
	errs                int64
	local, failures     uint64 // the store's Stats
	mallocs             uint64
	cpu                 float64 // Redis's CPU seconds over the window
	calls               int64   // script calls Redis ran over the window
	info                bool    // INFO answered around the window
	lat                 latency // with one goroutine per process
}

// leaseRounds is what the rounds of one cell measured.
type leaseRounds struct {
	rate, p50, p99, p999, cpu, calls []float64 // cpu and calls per admitted decision
	decisions, admitted, errs        int64
	local, failures, mallocs         uint64
	info                             bool
}

func (w *leaseRounds) add(c leaseCell) {
	w.rate = append(w.rate, c.rate)
	w.p50 = append(w.p50, float64(c.lat.p50))
	w.p99 = append(w.p99, float64(c.lat.p99))
	w.p999 = append(w.p999, float64(c.lat.p999))
	if c.info && c.admitted > 0 {
		w.cpu = append(w.cpu, c.cpu*1e9/float64(c.admitted))
		w.calls = append(w.calls, float64(c.calls)/float64(c.admitted))
	}
	w.decisions += c.decisions
	w.admitted += c.admitted
	w.errs += c.errs
	w.local += c.local
	w.failures += c.failures
	w.mallocs += c.mallocs
}

// warnings are what makes the cell a wrong measurement.
func (w *leaseRounds) warnings(where string) []string {
	var out []string
	// A window with no decision had every call still waiting when it
	// closed: its rate of 0 would make the leased store infinitely faster.
	idle := 0
	for _, r := range w.rate {
		if r == 0 {
			idle++
		}
	}
	if idle > 0 {
		out = append(out, fmt.Sprintf("%s: no decision in %d of its %d windows: a wrong measurement", where, idle, len(w.rate)))
	}
	if w.errs > 0 {
		out = append(out, fmt.Sprintf("%s: %d requests got an error: a wrong measurement", where, w.errs))
	}
	if w.failures > 0 {
		out = append(out, fmt.Sprintf("%s: %d requests answered by the failure rule: a wrong measurement", where, w.failures))
	}
	if w.admitted < w.decisions {
		out = append(out, fmt.Sprintf("%s: %d of %d requests denied: the quota ran short, a wrong measurement", where, w.decisions-w.admitted, w.decisions))
	}
	return out
}

// medianOr is the median of v, NaN if it is empty.
func medianOr(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return median(v)
}

// leases prints what leases buy: the latency of a decision at one
// goroutine per process, and decisions per second and Redis CPU per
// admitted decision at leaseProcs processes of leaseGoroutines goroutines,
// beside the store without leases, redis_rate and the engine; then whether
// each of the part's goals was met. Its error is the server's or a
// worker's.
func leases(out io.Writer, cfg config) (err error) {
	if cfg.redisAddr == "" {
		fmt.Fprintln(out, "leases: skipped; measure redisstore's leases with -redis ADDR (go run ./bench -redis 127.0.0.1:6379 -parts leases)")
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("leases: finding this binary to run its workers: %w", err)
	}
	ctx := context.Background()
	rdb, err := newRedisClient(ctx, cfg.redisAddr)
	if err != nil {
		return err
	}
	start := time.Now()
	prefix := freshPrefix()
	defer func() {
		n, derr := deletePrefix(ctx, rdb, prefix)
		rn, rerr := deletePrefix(ctx, rdb, rateKeyPrefix+prefix)
		_ = rdb.Close()
		if derr = errors.Join(derr, rerr); derr != nil {
			err = errors.Join(err, fmt.Errorf("leases: deleting the keys under %s: %w", prefix, derr))
		} else if err == nil {
			fmt.Fprintf(out, "leases: deleted the %d keys under %s (and redis_rate's %d); the part took %s\n", n, prefix, rn, time.Since(start).Round(100*time.Millisecond))
		}
	}()
	times := leaseTimesFor(cfg.quick)
	// Every bucket exists, below full, before the first round.
	names := keyNames(leaseKeys)
	for _, kind := range []string{kindLeased, kindStore} {
		st, err := newRedisStore(ctx, rdb, leasePrefix(prefix, kind), leasePolicy)
		if err != nil {
			return err
		}
		err = errors.Join(prespend(ctx, st, names), st.Close())
		if err != nil {
			return fmt.Errorf("leases: prespending: %w", err)
		}
	}
	rp := &ratePeer{rdb: rdb, limit: gcraLimit(leasePolicy), pfx: leasePrefix(prefix, kindRedisRate)}
	if rp.sha, err = rateSHA(ctx, rdb); err != nil {
		return fmt.Errorf("leases: loading redis_rate's script: %w", err)
	}
	if err := rp.prespend(ctx, names); err != nil {
		return fmt.Errorf("leases: prespending redis_rate's keys: %w", err)
	}

	fmt.Fprintf(out, "leases: worker processes of this binary on one Redis %s at %s, on loopback on the same %d-core machine (GOMAXPROCS %d each): each process has its own store, engine or redis_rate limiter, and all decide the same %d keys at random, capacity %d and %d token/s (every request admitted)\n",
		serverVersion(ctx, rdb), cfg.redisAddr, runtime.NumCPU(), cfg.procs, leaseKeys, leasePolicy.Capacity, leasePolicy.TokensPerSecond)
	fmt.Fprintf(out, "leases: each cell's processes warm up for %s, then are measured over one window of %s; the median of %d interleaved rounds; leases at their defaults (Divisor %d, Horizon %s, MaxAge %s)\n",
		times.warm, times.window, times.rounds, redisstore.DefaultLeaseDivisor, redisstore.DefaultLeaseHorizon, redisstore.DefaultLeaseMaxAge)
	fmt.Fprintln(out, "leases: latency per Allow from one goroutine per process (HdrHistogram); decisions/s = the processes' rates summed; "+
		"local = decided from a lease, without Redis; Redis CPU = the server's used_cpu_sys+used_cpu_user (INFO CPU) over the window per admitted decision, and script calls = EVALSHA, EVAL and FCALL (INFO commandstats) per 1,000")

	type cellKey struct {
		procs, goroutines int
		row               leaseRow
	}
	type cellSpec struct {
		cellKey
		table int // 0 latency, 1 throughput
	}
	var specs []cellSpec
	for _, p := range leaseLatencyProcs {
		for _, r := range leaseLatencyRows {
			specs = append(specs, cellSpec{cellKey{p, 1, r}, 0})
		}
	}
	for _, r := range leaseThroughputRows {
		specs = append(specs, cellSpec{cellKey{leaseProcs, leaseGoroutines, r}, 1})
	}
	res := map[cellKey]*leaseRounds{}
	for _, s := range specs {
		res[s.cellKey] = &leaseRounds{info: true}
	}
	for round := range times.rounds {
		cfg.prog.mark("leases: round %d/%d, %d cells", round+1, times.rounds, len(specs))
		for i, s := range specs {
			cfg.prog.show("leases: round %d/%d, cell %d/%d: %s, %d processes x %d goroutines",
				round+1, times.rounds, i+1, len(specs), s.row.name, s.procs, s.goroutines)
			job := leaseJob{Kind: s.row.kind, Addr: cfg.redisAddr, Prefix: leasePrefix(prefix, s.row.kind), Goroutines: s.goroutines, Window: times.window}
			if cfg.cpuProfile != "" {
				job.CPUProfile = fmt.Sprintf("%s.%s.%dx%d", cfg.cpuProfile, s.row.kind, s.procs, s.goroutines)
			}
			c, err := runLeaseCell(ctx, rdb, exe, job, s.procs, times)
			if err != nil {
				return fmt.Errorf("leases: %s, %d processes x %d goroutines: %w", s.row.name, s.procs, s.goroutines, err)
			}
			w := res[s.cellKey]
			w.add(c)
			w.info = w.info && c.info
		}
	}

	var warnings []string
	lt := table.NewWriter()
	lt.SetOutputMirror(out)
	lt.SetTitle("latency of one Allow, 1 goroutine per process: redisstore with leases beside the engine")
	lt.AppendHeader(table.Row{"processes", "contender", "decisions/s", "p50", "p99", "p99.9", "local", "allocs/decision", "p50 x engine"})
	enginesP50 := map[int]float64{}
	leasedP50, leasedP99 := map[int]float64{}, map[int]float64{}
	for pi, p := range leaseLatencyProcs {
		if pi > 0 {
			lt.AppendSeparator()
		}
		for _, r := range leaseLatencyRows {
			w := res[cellKey{p, 1, r}]
			p50, p99 := median(w.p50), median(w.p99)
			ratio := "ref"
			switch r.kind {
			case kindEngine:
				enginesP50[p] = p50
			case kindLeased:
				leasedP50[p], leasedP99[p] = p50, p99
			}
			if r.kind != kindEngine {
				ratio = "?" // a cell that made no decision has no p50
				if v := ratioOf(p50, enginesP50[p]); !math.IsNaN(v) {
					ratio = fmt.Sprintf("%.2fx", v)
				}
			}
			lt.AppendRow(table.Row{p, r.name, grouped(median(w.rate)), micros(p50), micros(p99), micros(median(w.p999)),
				localShare(r.kind, w), fmt.Sprintf("%.1f", float64(w.mallocs)/float64(max(w.decisions, 1))), ratio})
			warnings = append(warnings, w.warnings(fmt.Sprintf("latency, %d processes, %s", p, r.name))...)
		}
	}
	lt.Render()

	tt := table.NewWriter()
	tt.SetOutputMirror(out)
	tt.SetTitle(fmt.Sprintf("decisions per second, %d processes x %d goroutines, on the same keys", leaseProcs, leaseGoroutines))
	tt.AppendHeader(table.Row{"contender", "decisions/s", "admitted", "local", "allocs/decision", "Redis CPU ns/admitted", "script calls/1k admitted", "leases vs it: decisions/s, Redis CPU"})
	thr := func(kind string) *leaseRounds {
		for _, r := range leaseThroughputRows {
			if r.kind == kind {
				return res[cellKey{leaseProcs, leaseGoroutines, r}]
			}
		}
		return nil
	}
	leased := thr(kindLeased)
	lRate, lCPU := median(leased.rate), medianOr(leased.cpu)
	vsRate, vsCPU := map[string]float64{}, map[string]float64{}
	for _, r := range leaseThroughputRows {
		w := thr(r.kind)
		rate, cpu, calls := median(w.rate), medianOr(w.cpu), medianOr(w.calls)
		cpuS, callsS, vs := "-", "-", "ref"
		if r.kind != kindEngine {
			cpuS, callsS = fmt.Sprintf("%.1f", cpu), fmt.Sprintf("%.1f", calls*1000)
			if !w.info {
				cpuS, callsS = "? (INFO failed)", "?"
			}
		}
		if r.kind != kindLeased {
			// NaN, printed ?, for a window with no decision, or a Redis
			// CPU read on either side that failed or read nothing
			vsRate[r.kind], vsCPU[r.kind] = ratioOf(lRate, rate), math.NaN()
			if w.info && leased.info && rate > 0 && lRate > 0 {
				vsCPU[r.kind] = ratioOf(cpu, lCPU)
			}
			vs = fmt.Sprintf("%.2fx", vsRate[r.kind])
			if math.IsNaN(vsRate[r.kind]) {
				vs = "?"
			}
			if r.kind != kindEngine {
				vs += ", " + oneIn(vsCPU[r.kind])
			}
		}
		tt.AppendRow(table.Row{r.name, grouped(rate), fmt.Sprintf("%.1f%%", 100*float64(w.admitted)/float64(max(w.decisions, 1))),
			localShare(r.kind, w), fmt.Sprintf("%.1f", float64(w.mallocs)/float64(max(w.decisions, 1))), cpuS, callsS, vs})
		warnings = append(warnings, w.warnings(fmt.Sprintf("throughput, %s", r.name))...)
	}
	tt.Render()

	leaseGoalsTable(out, leaseGoals(enginesP50, leasedP50, leasedP99, vsRate, vsCPU))
	for _, w := range warnings {
		fmt.Fprintln(out, "leases: WARNING:", w)
	}
	return nil
}

// leaseGoals are the goals of leases over what the tables measured: the
// engine's and the leased store's p50 and the leased store's p99 by number
// of processes (0 for a cell that made no decision), and the leased
// store's ratios to each contender, decisions/s and Redis CPU (NaN where a
// cell made no decision or had no Redis CPU read).
func leaseGoals(enginesP50, leasedP50, leasedP99 map[int]float64, vsRate, vsCPU map[string]float64) []leaseGoal {
	var goals []leaseGoal
	for _, p := range leaseLatencyProcs {
		goals = append(goals, leaseGoal{fmt.Sprintf("p50 with leases <= 2x the engine's, %s x 1 goroutine", procsWord(p)),
			ratioOf(leasedP50[p], enginesP50[p]), func(v float64) string { return fmt.Sprintf("%.2fx", v) }, func(v float64) bool { return v <= 2 }})
	}
	for _, p := range leaseLatencyProcs {
		goals = append(goals, leaseGoal{fmt.Sprintf("p99 with leases < 50 µs, %s x 1 goroutine", procsWord(p)),
			ratioOf(leasedP99[p], 1), micros, func(v float64) bool { return v < 50e3 }}) // NaN: the cell made no decision
	}
	fold := func(v float64) string { return fmt.Sprintf("%.1fx", v) }
	atLeast := func(goal float64) func(float64) bool { return func(v float64) bool { return v >= goal } }
	goals = append(goals,
		leaseGoal{fmt.Sprintf("decisions/s with leases >= 20x redis_rate's, %dx%d", leaseProcs, leaseGoroutines), vsRate[kindRedisRate], fold, atLeast(20)},
		leaseGoal{fmt.Sprintf("decisions/s with leases >= 10x without, %dx%d", leaseProcs, leaseGoroutines), vsRate[kindStore], fold, atLeast(10)},
		leaseGoal{"Redis CPU per admitted decision with leases <= 1/20 of without", vsCPU[kindStore], oneIn, atLeast(20)})
	return goals
}

// leaseGoal is one row of the goals of leases: the goal, the value
// measured, how it prints and whether it meets the goal.
type leaseGoal struct {
	name string
	v    float64 // NaN or infinite: nothing was measured (see ratioOf)
	show func(float64) string
	met  func(float64) bool
}

// leaseGoalsTable prints whether each goal was met. A value that is NaN or
// infinite, a ratio over a cell that made no decision or had no Redis CPU
// read, prints "?" and meets no goal.
func leaseGoalsTable(out io.Writer, goals []leaseGoal) {
	gt := table.NewWriter()
	gt.SetOutputMirror(out)
	gt.SetTitle("goals of leases")
	gt.AppendHeader(table.Row{"goal", "measured", "met"})
	for _, g := range goals {
		shown, met := "?", "? (no measurement)"
		if !math.IsNaN(g.v) && !math.IsInf(g.v, 0) {
			shown, met = g.show(g.v), map[bool]string{true: "yes", false: "NO"}[g.met(g.v)]
		}
		gt.AppendRow(table.Row{g.name, shown, met})
	}
	gt.Render()
}

// ratioOf is a / b for figures measured as positive, NaN if either is
// not: a latency of 0 is a cell that made no decision.
func ratioOf(a, b float64) float64 {
	if !(a > 0 && b > 0) {
		return math.NaN()
	}
	return a / b
}

// procsWord is n processes in words: "1 process", "4 processes".
func procsWord(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}

// leasePrefix is the key prefix of kind's rows: the rows of one kind share
// their keys across processes and rounds, as a service's replicas do.
func leasePrefix(prefix, kind string) string { return prefix + kind + ":" }

// localShare is the share of w's decisions a lease made, for the leased
// rows; "-" for others.
func localShare(kind string, w *leaseRounds) string {
	if kind != kindLeased {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(w.local)/float64(max(w.decisions, 1)))
}

// oneIn formats a ratio r of the others' cost to the leased store's as
// "1/r".
func oneIn(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "1/?"
	}
	if r >= 10 {
		return fmt.Sprintf("1/%.0f", r)
	}
	return fmt.Sprintf("1/%.1f", r)
}

// mergedSnapshots is the distribution of every call the workers'
// histograms recorded.
func mergedSnapshots(snaps []*hdrhistogram.Snapshot) latency {
	var hs []*hdrhistogram.Histogram
	for _, s := range snaps {
		if s != nil {
			hs = append(hs, hdrhistogram.Import(s))
		}
	}
	return merged(hs)
}
