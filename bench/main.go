package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

func main() {
	if code, worker := leaseWorkerMain(); worker { // the leases part's worker process
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	quick      bool
	benchtime  time.Duration // how long one measurement of a cell runs
	rounds     int           // measurements of each cell; the table shows their median
	cpus       []int
	keys       int       // keys for the memory and stall measurements
	procs      int       // GOMAXPROCS when the run began: the Redis section's
	redisAddr  string    // the Redis server to measure redisstore on (a cluster's masters, joined by commas); "" skips it
	cpuProfile string    // where the leases part's workers write CPU profiles of their windows; "" for none
	prog       *progress // what is being measured, on stderr; nil reports nothing
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var cpus, parts, redisCluster string
	fs.BoolVar(&cfg.quick, "quick", false, "shorter runs and smaller key sets (under 30 s)")
	fs.StringVar(&parts, "parts", "decisions,memory,latency,allowall,redis", "which tables to measure, comma-separated; envoyrls (the Envoy RLS on the engine) and leases (redisstore's leases, with -redis) run only when named")
	fs.StringVar(&cfg.redisAddr, "redis", "", "measure redisstore on the Redis server at this address (host:port), under a fresh key prefix it deletes afterwards; \"\" skips the Redis table")
	fs.StringVar(&redisCluster, "redis-cluster", "", "measure redisstore on the Redis Cluster whose masters are at these addresses (host:port,host:port,...), as -redis does on one server")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "the leases part's worker processes write a CPU profile of each window to `PREFIX`.<kind>.<processes>x<goroutines>.<process>.pprof (the last round's)")
	fs.StringVar(&cpus, "cpu", "1,2", "GOMAXPROCS values to measure, comma-separated")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected argument %q: the command takes only flags (-h lists them)\n", fs.Arg(0))
		return 2
	}
	switch {
	case redisCluster != "" && cfg.redisAddr != "":
		fmt.Fprintln(stderr, "bench: -redis and -redis-cluster exclude each other")
		return 2
	case redisCluster != "":
		cfg.redisAddr = redisCluster // several addresses: a cluster's (newRedisClient)
	}
	for _, f := range strings.Split(cpus, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "bench: bad -cpu value %q\n", f)
			return 2
		}
		if slices.Contains(cfg.cpus, n) {
			fmt.Fprintf(stderr, "bench: -cpu value %d given twice\n", n)
			return 2
		}
		cfg.cpus = append(cfg.cpus, n)
	}
	tables := map[string]func(io.Writer, config) error{
		"decisions": infallible(decisions), "memory": infallible(memory), "latency": infallible(latencies),
		"allowall": infallible(allowAll), "redis": redisSection, "envoyrls": envoyRLS, "leases": leases,
	}
	for _, p := range strings.Split(parts, ",") {
		if _, ok := tables[strings.TrimSpace(p)]; !ok {
			fmt.Fprintf(stderr, "bench: unknown part %q (have decisions, memory, latency, allowall, redis, envoyrls, leases)\n", p)
			return 2
		}
	}
	// Every cell's 3 rounds, plus setup, stay under 3 minutes.
	cfg.benchtime, cfg.rounds = 100*time.Millisecond, 3
	cfg.keys = 1_000_000
	if cfg.quick {
		cfg.benchtime = 15 * time.Millisecond
		cfg.keys = 100_000
	}
	cfg.procs = runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(cfg.procs)
	cfg.prog = newProgress(stderr)
	defer cfg.prog.clear()
	stdout = cfg.prog.clearing(stdout)

	fmt.Fprintf(stdout, "tokenshard bench: %s, %d cores, %s, 8 goroutines per core\n",
		runtime.Version(), runtime.NumCPU(), map[bool]string{true: "quick", false: "full"}[cfg.quick])
	for _, p := range strings.Split(parts, ",") {
		if err := tables[strings.TrimSpace(p)](stdout, cfg); err != nil {
			cfg.prog.clear()
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	}
	return 0
}

// calibrate returns how many decide calls of rg take about d, from runs of
// ten times as many calls each until one takes a tenth of d. Those runs warm
// the contender up, too.
func calibrate(rg *rig, d time.Duration) int {
	const most = 1 << 30
	for calls := 1; ; calls *= 10 {
		start := time.Now()
		rg.run(calls)
		if took := time.Since(start); took >= d/10 || calls*10 > most {
			return int(min(most, max(1, float64(calls)*float64(d)/float64(max(took, 1)))))
		}
	}
}

// measure times calls decide calls of rg, and returns the nanoseconds and
// the allocations per decision, how many decisions it made and admitted,
// and how many requests got an error (counted as denied). The harness's
// own goroutines and buffers are set up before it starts counting, so the
// allocations are the contender's: one per call of a batch of 128 shows
// as 1/128 per decision.
func measure(rg *rig, calls int) (ns, allocs float64, decisions, allowed, failed int64) {
	start := rg.prepare(calls)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	errs0 := decideErrors.Load()
	t0 := time.Now()
	allowed = start()
	took := time.Since(t0)
	failed = decideErrors.Load() - errs0
	runtime.ReadMemStats(&after)
	decisions = int64(calls * rg.c.batch)
	return float64(took.Nanoseconds()) / float64(decisions), float64(after.Mallocs-before.Mallocs) / float64(decisions), decisions, allowed, failed
}

// median returns the median of v, which it sorts.
func median(v []float64) float64 {
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// infallible adapts a table that cannot fail to the tables' signature.
func infallible(f func(io.Writer, config)) func(io.Writer, config) error {
	return func(out io.Writer, cfg config) error { f(out, cfg); return nil }
}

// decisions prints ns per decision for every contender, scenario and
// GOMAXPROCS, with each contender's ratio to the best peer in that column.
func decisions(out io.Writer, cfg config) {
	type cell struct {
		ns     float64
		allocs float64
		share  float64 // of all its rounds' decisions, admitted
	}
	results := map[string]map[string]cell{} // contender -> column -> cell
	var columns, warnings []string
	ncols := len(scenarios) * len(cfg.cpus)
	cells, done := ncols*len(contenders), 0 // for the progress line
	for _, s := range scenarios {
		sc := s
		if cfg.quick && sc.keys > 100_000 {
			sc.keys = 100_000
		}
		cfg.prog.show("decisions: building the key set of %s", s.name)
		ks := newKeySet(sc)
		for _, cpu := range cfg.cpus {
			runtime.GOMAXPROCS(cpu)
			col := fmt.Sprintf("%s cpu=%d", s.name, cpu)
			columns = append(columns, col)
			cfg.prog.mark("decisions: column %d/%d, %s (%s): %d contenders, %d rounds",
				len(columns), ncols, s.name, cores(cpu), len(contenders), cfg.rounds)
			// Every contender is measured once per round, rounds
			// interleaved, and a cell is the median of its rounds: a
			// burst of noise on the shared machine that hits one round
			// of a cell does not make the cell.
			// All of a column's contenders stay set up until its last
			// round: at 1M keys about 1 GiB of heap between them, idle
			// but for the one being measured.
			rigs := make([]*rig, len(contenders))
			for i, c := range contenders {
				cfg.prog.show("setting up %d/%d: %s / %s (%s)", i+1, len(contenders), s.name, c.name, cores(cpu))
				rigs[i] = newRig(c, sc, func() *keySet { return ks })
				rigs[i].ready()
			}
			// Setting them all up left garbage; collect it now, so no
			// collection of it lands in a round (none allocates much).
			runtime.GC()
			calls := make([]int, len(contenders))
			for i, c := range contenders {
				cfg.prog.show("calibrating %d/%d: %s / %s (%s)", i+1, len(contenders), s.name, c.name, cores(cpu))
				calls[i] = calibrate(rigs[i], cfg.benchtime)
			}
			ns := make([][]float64, len(contenders))
			allocs := make([]float64, len(contenders))
			admitted := make([]float64, len(contenders)) // the least share in a round
			made, allowed, failed := make([]int64, len(contenders)), make([]int64, len(contenders)), make([]int64, len(contenders))
			for i := range admitted {
				admitted[i] = 1
			}
			for round := range cfg.rounds {
				// Each round runs the contenders in an order of its own
				// (seeded, so a run can be repeated), so that none always
				// runs first, or right after the same other one.
				order := rand.New(rand.NewPCG(uint64(len(columns)), uint64(round))).Perm(len(contenders))
				for j, i := range order {
					c := contenders[i]
					cfg.prog.show("measuring %d/%d: %s / %s (%s), round %d/%d",
						done+j+1, cells, s.name, c.name, cores(cpu), round+1, cfg.rounds)
					t, a, n, ok, bad := measure(rigs[i], calls[i])
					ns[i] = append(ns[i], t)
					allocs[i] = max(allocs[i], a)
					admitted[i] = min(admitted[i], float64(ok)/float64(n))
					made[i], allowed[i], failed[i] = made[i]+n, allowed[i]+ok, failed[i]+bad
				}
			}
			for i, c := range contenders {
				if s.policy == admitAll && admitted[i] < 1 {
					// Denying is cheaper than admitting: such a cell is no
					// comparison with the others.
					warnings = append(warnings, fmt.Sprintf("%s / %s admitted %.1f%% of its decisions in a round, where every contender should admit all", c.name, col, 100*admitted[i]))
				}
				if s.policy == allDenied && allowed[i] > 0 {
					warnings = append(warnings, fmt.Sprintf("%s / %s admitted %d of its decisions, where every contender should deny all", c.name, col, allowed[i]))
				}
				if failed[i] > 0 {
					// Counted as denials, and an error is cheaper still.
					warnings = append(warnings, fmt.Sprintf("%s / %s: %d requests got an error, counted as denied: a wrong measurement", c.name, col, failed[i]))
				}
				rigs[i].close()
				if results[c.name] == nil {
					results[c.name] = map[string]cell{}
				}
				results[c.name][col] = cell{ns: median(ns[i]), allocs: allocs[i], share: float64(allowed[i]) / float64(made[i])}
			}
			done += len(contenders)
		}
	}
	// A single request is compared with the best peer deciding one request
	// a call; a batch with the best peer of either kind, since a caller with
	// a batch could use either.
	best := map[bool]map[string]float64{false: {}, true: {}}
	for _, c := range contenders {
		if !c.peer {
			continue
		}
		for _, col := range columns {
			v := results[c.name][col].ns
			for _, batch := range []bool{false, true} {
				if (c.batch == 1 || batch) && (best[batch][col] == 0 || v < best[batch][col]) {
					best[batch][col] = v
				}
			}
		}
	}
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetTitle(fmt.Sprintf("ns per decision, median of %d interleaved rounds (x = ratio to the best peer in the column, for a single request of one deciding single requests; < 1 is faster), most allocs per decision in a round", cfg.rounds))
	header := table.Row{"contender"}
	for _, col := range columns {
		header = append(header, col)
	}
	t.AppendHeader(append(header, "allocs"))
	for _, c := range contenders {
		row := table.Row{c.name}
		var allocs float64
		for _, col := range columns {
			r := results[c.name][col]
			row = append(row, fmt.Sprintf("%.0f (%.2fx)", r.ns, r.ns/best[c.batch > 1][col]))
			allocs = max(allocs, r.allocs)
		}
		t.AppendRow(append(row, fmt.Sprintf("%.2f", allocs)))
	}
	t.Render()
	// What each contender decided, beside what it cost: one that denies
	// more than the others is faster for it, not better. Where the policy
	// refills during the run, a faster contender makes more decisions per
	// refill, so a smaller share of them admits.
	a := table.NewWriter()
	a.SetOutputMirror(out)
	a.SetTitle("share of decisions admitted, all rounds")
	a.AppendHeader(header)
	for _, c := range contenders {
		row := table.Row{c.name}
		for _, col := range columns {
			row = append(row, fmt.Sprintf("%.2f%%", 100*results[c.name][col].share))
		}
		a.AppendRow(row)
	}
	a.Render()
	for _, w := range warnings {
		fmt.Fprintln(out, "decisions: WARNING:", w)
	}
}

// memory prints retained heap bytes per tracked key.
func memory(out io.Writer, cfg config) {
	t := table.NewWriter()
	t.SetOutputMirror(out)
	// Short titles: go-pretty wraps a title to the table's width, mid-word.
	t.SetTitle("retained heap per tracked key")
	t.SetCaption("at %d keys of 17 bytes, the keys included", cfg.keys)
	t.AppendHeader(table.Row{"contender", "bytes/key"})
	var kept []contender
	for _, c := range contenders {
		if c.keepsState {
			kept = append(kept, c)
		}
	}
	cfg.prog.mark("memory: retained heap of %d contenders at %d keys", len(kept), cfg.keys)
	for i, c := range kept {
		cfg.prog.show("memory %d/%d: %s at %d keys", i+1, len(kept), c.name, cfg.keys)
		t.AppendRow(table.Row{c.name, fmt.Sprintf("%.0f", retainedPerKey(c, cfg.keys))})
	}
	t.Render()
}

// latencies prints the single-Allow latency distribution and the longest
// admission stalls during a sweep and a cutover.
func latencies(out io.Writer, cfg config) {
	d := 2 * time.Second
	if cfg.quick {
		d = 300 * time.Millisecond
	}
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetTitle("tokenshard Allow latency")
	t.SetCaption("8 goroutines per core, uniform 100,000 keys")
	t.AppendHeader(table.Row{"GOMAXPROCS", "p50", "p99", "p99.9", "max"})
	cfg.prog.mark("latency: single Allow, %s per GOMAXPROCS", d)
	ks := newKeySet(scenario{keys: 100_000})
	for _, cpu := range cfg.cpus {
		runtime.GOMAXPROCS(cpu)
		cfg.prog.show("latency: single Allow (%s), %s", cores(cpu), d)
		l := allowLatency(ks, d)
		t.AppendRow(table.Row{cpu, l.p50, l.p99, l.p999, l.max})
	}
	t.Render()

	s := table.NewWriter()
	s.SetOutputMirror(out)
	s.SetTitle(fmt.Sprintf("longest single Allow while an admin call covers %d keys", cfg.keys))
	s.AppendHeader(table.Row{"GOMAXPROCS", "admin call", "admin took", "longest Allow overlapping it", "longest Allow after it (baseline)"})
	admins := []struct {
		name string
		call func(e *engine.Engine) error
	}{
		{"EvictFull", func(e *engine.Engine) error {
			_, err := e.EvictFull(context.Background())
			return err
		}},
		{"ReplacePolicy", func(e *engine.Engine) error {
			return e.ReplacePolicy(context.Background(), policy.Policy{Version: 2, Capacity: 3, TokensPerSecond: 2}, 1)
		}},
		// The snapshot's writer discards: what is measured is the copying
		// and encoding beside admission, not a disk.
		{"Snapshot", func(e *engine.Engine) error {
			return e.Snapshot(context.Background(), io.Discard)
		}},
		// More cutovers than a shard keeps history for, with no sweep:
		// untouched buckets are converted by background passes.
		{"ReplacePolicy x70", func(e *engine.Engine) error {
			for v := int64(2); v <= 71; v++ {
				next := policy.Policy{Version: v, Capacity: 2 + v%3, TokensPerSecond: 1 + v%2}
				if err := e.ReplacePolicy(context.Background(), next, v-1); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	cfg.prog.mark("stalls: %d admin calls at %d keys", len(cfg.cpus)*len(admins), cfg.keys)
	for ci, cpu := range cfg.cpus {
		runtime.GOMAXPROCS(cpu)
		for ai, a := range admins {
			cfg.prog.show("stalls %d/%d: %s at %d keys (%s)", ci*len(admins)+ai+1, len(cfg.cpus)*len(admins), a.name, cfg.keys, cores(cpu))
			worst, baseline, took, err := stall(cfg.keys, a.call)
			s.AppendRow(table.Row{cpu, a.name, took.Round(time.Microsecond), errOr(worst, err), baseline.Round(time.Microsecond)})
		}
	}
	s.Render()
}

func errOr(d time.Duration, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return d.Round(time.Microsecond).String()
}
