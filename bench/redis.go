package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// redisScenario is a key set and policy for the Redis section, with the
// goroutine counts it is measured at: a network-bound client needs many
// calls in flight, not 8 per core.
type redisScenario struct {
	scenario
	goroutines []int
}

var redisScenarios = []redisScenario{
	{scenario{name: "hot", keys: 1, policy: redisAdmit}, []int{1, 16, 64}},
	{scenario{name: "uniform", keys: 100_000, policy: redisAdmit}, []int{1, 16, 64}},
	// One key hammered far beyond its limit: almost every answer a denial.
	{scenario{name: "hot-denied", keys: 1, policy: mostlyDenied}, []int{16}},
}

// redisRow is one contender of the Redis section. The engine's rows come
// first in each group: they are the reference of the store's rows with the
// same batch; each redis_rate row follows the store's row of its batch, which
// it is the peer of.
type redisRow struct {
	name  string
	batch int
	kind  rowKind
}

type rowKind int

const (
	inEngine    rowKind = iota // the in-process engine
	inStore                    // redisstore
	inRedisRate                // redis_rate: Allow, or its script pipelined
)

var redisRows = []redisRow{
	{name: "engine Allow", batch: 1},
	{name: "engine AllowBatch 16", batch: 16},
	{name: "engine AllowBatch 128", batch: 128},
	{name: "redisstore Allow", batch: 1, kind: inStore},
	{name: "redis_rate Allow", batch: 1, kind: inRedisRate},
	{name: "redisstore AllowBatch 16", batch: 16, kind: inStore},
	{name: "redis_rate pipelined 16", batch: 16, kind: inRedisRate},
	{name: "redisstore AllowBatch 128", batch: 128, kind: inStore},
	{name: "redis_rate pipelined 128", batch: 128, kind: inRedisRate},
}

// redisTimes are how long the Redis section measures each cell in each
// round, and warms the store of each scenario first (script loaded,
// connections open); rounds is how many interleaved rounds each cell's
// median is taken over.
type redisTimes struct {
	store, engine, warm time.Duration
	rounds              int
}

// redisTimesFor is a variable so that a test can run the section with tiny
// durations.
var redisTimesFor = func(quick bool) redisTimes {
	if quick {
		return redisTimes{store: 150 * time.Millisecond, engine: 30 * time.Millisecond, warm: 50 * time.Millisecond, rounds: 1}
	}
	return redisTimes{store: 300 * time.Millisecond, engine: 150 * time.Millisecond, warm: 100 * time.Millisecond, rounds: 3}
}

// redisSection prints decisions per second through redisstore and through
// redis_rate on one Redis server, beside the in-process engine on the same
// keys, or one line saying how to enable it when no -redis address was
// given. It writes only under a fresh key prefix and deletes it afterwards.
// Its error is the server's: unreachable, or failing outside a decision.
func redisSection(out io.Writer, cfg config) error {
	if cfg.redisAddr == "" {
		fmt.Fprintln(out, "redis: skipped; measure the Redis store with -redis ADDR (go run ./bench -redis 127.0.0.1:6379 -parts redis)")
		return nil
	}
	// Before the client: go-redis sizes its pool by GOMAXPROCS, and a part
	// before this one may have left -cpu's last value.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(cfg.procs))
	ctx := context.Background()
	rdb, err := newRedisClient(ctx, cfg.redisAddr)
	if err != nil {
		return err
	}
	defer rdb.Close()
	start := time.Now()
	prefix := freshPrefix()
	cleaned := false
	defer func() {
		if !cleaned { // an early return: delete what was written, quietly
			_, _ = deletePrefix(ctx, rdb, prefix)
			_, _ = deletePrefix(ctx, rdb, rateKeyPrefix+prefix)
		}
	}()
	times := redisTimesFor(cfg.quick)
	sha, err := rateSHA(ctx, rdb)
	if err != nil {
		return fmt.Errorf("redis: loading redis_rate's script: %w", err)
	}

	what := "one Redis"
	if n := masters(ctx, rdb); n > 1 || strings.Contains(cfg.redisAddr, ",") {
		what = fmt.Sprintf("a Redis Cluster of %d masters (script time and CPU summed over them), Redis", n)
	}
	fmt.Fprintf(out, "redis: %s %s at %s on loopback, on the same %d-core machine as the client: client and server share the cores (GOMAXPROCS %d); each cell the median of %d interleaved rounds of %s (engine rows %s)\n",
		what, serverVersion(ctx, rdb), cfg.redisAddr, runtime.NumCPU(), cfg.procs, times.rounds, times.store, times.engine)
	fmt.Fprintln(out, "redis: x engine = ns per decision / the engine's with the same batch; "+
		"script = time Redis spent in EVALSHA and FCALL per decision (INFO commandstats), and its share of the wall time; "+
		"Redis CPU = the server's used_cpu_sys+used_cpu_user (INFO CPU) per decision; + flags other clients' commands")
	fmt.Fprintln(out, "redis: vs redis_rate = the store's decisions/s / redis_rate's, and its Redis CPU per decision / redis_rate's, on the row below it (redis_rate's own Allow; its script pipelined, as it has no batch)")
	rep := &redisReport{t: table.NewWriter()}
	rep.t.SetOutputMirror(out)
	rep.t.SetTitle("decisions per second: redisstore and redis_rate beside the in-process engine, on the same keys")
	rep.t.AppendHeader(table.Row{"scenario", "goroutines", "contender", "decisions/s", "ns/decision", "x engine", "allocs/decision", "admitted", "script ns/decision (Redis busy)", "Redis CPU ns/decision", "vs redis_rate: decisions/s, CPU"})
	var total redisstore.Stats
	ncells := 0
	for _, s := range redisScenarios {
		ncells += len(s.goroutines)
	}
	cell := 0
	for si, s := range redisScenarios {
		cfg.prog.mark("redis: scenario %d/%d, %s", si+1, len(redisScenarios), s.name)
		ks := newKeySet(s.scenario)
		st, err := newRedisStore(ctx, rdb, prefix+s.name+":", s.policy)
		if err != nil {
			return err
		}
		rp := &ratePeer{rdb: rdb, l: redis_rate.NewLimiter(rdb), limit: gcraLimit(s.policy), sha: sha, pfx: prefix + s.name + ":"}
		// The engine's cost does not depend on the capacity, but its hot key
		// at millions of decisions a second would run dry on the store's, and
		// deny where the store admits: it gets headroom for the run instead.
		ep := s.policy
		if ep == redisAdmit {
			ep.Capacity = 1 << 40
		}
		e := newEngine(ep, s.keys)
		if err := errors.Join(prespend(ctx, st, ks.names), prespend(ctx, e, ks.names), rp.prespend(ctx, ks.names)); err != nil {
			_ = st.Close()
			_ = e.Close()
			return fmt.Errorf("redis: warming up: %w", err)
		}
		var errs atomic.Int64
		runFor(ks, 64, 16, times.warm, func() decider { return admitterDecider(st, &errs, 16) })
		runFor(ks, 64, 16, times.warm, func() decider { return rp.decider(&errs, 16) })
		errs.Store(0)
		for gi, g := range s.goroutines {
			if si > 0 || gi > 0 {
				rep.t.AppendSeparator()
			}
			cell++
			cfg.prog.show("redis %d/%d: %s, %d goroutines, %d rows, %d rounds", cell, ncells, s.name, g, len(redisRows), times.rounds)
			rep.measure(ctx, rdb, redisCell{s: s, ks: ks, goroutines: g, st: st, rp: rp, e: e, times: times})
		}
		ss := st.Stats()
		total.Decisions += ss.Decisions
		total.Failures += ss.Failures
		total.Retries += ss.Retries
		_ = st.Close()
		_ = e.Close()
	}
	rep.t.Render()
	if rep.foreign {
		fmt.Fprintln(out, "redis: +: other clients ran commands during the cell: their time counts in it too")
	}
	ps := rdb.PoolStats()
	pipeConns := uint32(0)
	if ps.PipelineStats != nil {
		pipeConns = ps.PipelineStats.TotalConns
	}
	fmt.Fprintf(out, "redis: redisstore made %d decisions with %d failures and %d retries; go-redis held %d connections + %d for pipelines\n",
		total.Decisions, total.Failures, total.Retries, ps.TotalConns, pipeConns)
	deleted, err := deletePrefix(ctx, rdb, prefix)
	rdeleted, rerr := deletePrefix(ctx, rdb, rateKeyPrefix+prefix)
	cleaned = true
	if err = errors.Join(err, rerr); err != nil {
		rep.warnings = append(rep.warnings, fmt.Sprintf("deleting the keys under %s: %v", prefix, err))
	}
	fmt.Fprintf(out, "redis: deleted the %d keys under %s (and redis_rate's %d); the section took %s\n", deleted, prefix, rdeleted, time.Since(start).Round(100*time.Millisecond))
	for _, w := range rep.warnings {
		fmt.Fprintln(out, "redis: WARNING:", w)
	}
	return nil
}

// redisReport is the Redis table being built, and what its footer says.
type redisReport struct {
	t        table.Writer
	warnings []string // wrong measurements: fail-closed answers, errors
	foreign  bool     // other clients ran commands during a Redis cell
}

// redisCell is one scenario at one goroutine count: a group of rows.
type redisCell struct {
	s          redisScenario
	ks         *keySet
	goroutines int
	st         *redisstore.Store
	rp         *ratePeer
	e          *engine.Engine
	times      redisTimes
}

// rowRounds is what the rounds of one row measured.
type rowRounds struct {
	ns, script, cpu, busy []float64 // per decision, but busy: the script's share of the wall time
	decisions, allowed    int64
	mallocs               float64 // the most per decision in a round
	info                  bool    // INFO answered around every round
}

// measure appends a row per contender for c: rounds interleaved (every row
// once per round), each row the median of its rounds, with INFO
// commandstats and CPU and the store's Stats read around each.
func (rep *redisReport) measure(ctx context.Context, rdb redis.UniversalClient, c redisCell) {
	var errs atomic.Int64
	rows := make([]rowRounds, len(redisRows))
	for i := range rows {
		rows[i].info = true
	}
	for range c.times.rounds {
		for i, r := range redisRows {
			d := c.times.store
			newDecider := func() decider { return c.rp.decider(&errs, r.batch) }
			switch r.kind {
			case inEngine:
				d = c.times.engine
				newDecider = func() decider { return admitterDecider(c.e, &errs, r.batch) }
			case inStore:
				newDecider = func() decider { return admitterDecider(c.st, &errs, r.batch) }
			}
			if r.kind != inEngine && c.s.policy == redisAdmit && len(c.ks.names) <= maxTopUp {
				// A hot key drains: a denying contender beside an admitting
				// one would be no comparison (a denial skips the write).
				// Every run of the store and of redis_rate starts as the
				// first did: redis_rate's hot key takes as many decisions
				// over a full run as its capacity holds.
				var err error
				switch r.kind {
				case inStore:
					err = topUp(ctx, c.st, c.ks.names)
				case inRedisRate:
					err = c.rp.topUp(ctx, c.ks.names)
				}
				if err != nil {
					rep.warnings = append(rep.warnings, fmt.Sprintf("topping up %s's keys: %v", c.s.name, err))
				}
			}
			stats0 := c.st.Stats()
			cmd0, err0 := readCmdStats(ctx, rdb)
			cpu0, err1 := redisCPU(ctx, rdb)
			res := runFor(c.ks, c.goroutines, r.batch, d, newDecider)
			cpu1, err2 := redisCPU(ctx, rdb)
			cmd1, err3 := readCmdStats(ctx, rdb)
			stats1 := c.st.Stats()

			w := &rows[i]
			w.ns = append(w.ns, res.nsPer())
			w.decisions += res.decisions
			w.allowed += res.allowed
			w.mallocs = max(w.mallocs, float64(res.mallocs)/float64(res.decisions))
			if r.kind == inEngine {
				continue
			}
			if errors.Join(err0, err1, err2, err3) != nil {
				w.info = false
			} else {
				calls, usec := cmd1.calls-cmd0.calls, cmd1.usec-cmd0.usec
				w.script = append(w.script, float64(usec)*1000/float64(res.decisions))
				w.busy = append(w.busy, 100*float64(usec)/float64(res.elapsed.Microseconds()))
				w.cpu = append(w.cpu, (cpu1-cpu0)*1e9/float64(res.decisions))
				// Our script calls: at most one per request (Allow, and
				// redis_rate's pipelines) or per batch, and one per retry;
				// the store's combined Allows make fewer. On a cluster a
				// batch makes one per virtual shard its keys fall in. More
				// is another client's.
				perBatch := int64(1)
				if _, ok := rdb.(*redis.ClusterClient); ok {
					perBatch = int64(min(r.batch, redisstore.DefaultVirtualShards))
				}
				ours := res.decisions/int64(r.batch)*perBatch + int64(stats1.Retries-stats0.Retries)
				if r.kind == inRedisRate || r.batch == 1 {
					ours = res.decisions + int64(stats1.Retries-stats0.Retries)
				}
				if calls > ours+ours/20+5 {
					rep.foreign = true
					w.busy[len(w.busy)-1] = -w.busy[len(w.busy)-1] // marked: another client's too
				}
			}
			where := fmt.Sprintf("%s, %d goroutines, %s", c.s.name, c.goroutines, r.name)
			if f := stats1.Failures - stats0.Failures; r.kind == inStore && f > 0 {
				rep.warnings = append(rep.warnings, fmt.Sprintf("%s: %d requests answered by the fail-closed rule: a wrong measurement", where, f))
			}
			if n := errs.Load(); n > 0 {
				rep.warnings = append(rep.warnings, fmt.Sprintf("%s: %d requests got an error: a wrong measurement", where, n))
			}
			errs.Store(0)
		}
	}
	engineNs := map[int]float64{} // batch -> the engine's ns per decision
	var storeNs, storeCPU float64 // of the store's row just above a redis_rate row
	vs := make([]string, len(redisRows))
	for i, r := range redisRows {
		w := &rows[i]
		ns := median(w.ns)
		cpu := math.NaN()
		if w.info && len(w.cpu) > 0 {
			cpu = median(w.cpu)
		}
		switch r.kind {
		case inEngine:
			engineNs[r.batch] = ns
		case inStore:
			storeNs, storeCPU = ns, cpu
		case inRedisRate:
			if i > 0 && redisRows[i-1].kind == inStore {
				vs[i-1] = fmt.Sprintf("%.2fx, %.2fx", ns/storeNs, storeCPU/cpu)
			}
		}
	}
	for i, r := range redisRows {
		w := &rows[i]
		if c.s.policy == redisAdmit && w.allowed < w.decisions {
			rep.warnings = append(rep.warnings, fmt.Sprintf("%s, %d goroutines, %s admitted %d of %d decisions, where every contender should admit all", c.s.name, c.goroutines, r.name, w.allowed, w.decisions))
		}
		ns := median(w.ns)
		ratio, script, cpu := "ref", "-", "-"
		if r.kind != inEngine {
			ratio = fmt.Sprintf("%.1fx", ns/engineNs[r.batch])
			if !w.info || len(w.script) == 0 {
				script, cpu = "? (INFO failed)", "?"
			} else {
				mark := ""
				for k, b := range w.busy {
					if b < 0 {
						mark, w.busy[k] = " +", -b
					}
				}
				script = fmt.Sprintf("%s (%.0f%%)%s", grouped(median(w.script)), median(w.busy), mark)
				cpu = grouped(median(w.cpu)) + mark
			}
		}
		rep.t.AppendRow(table.Row{c.s.name, c.goroutines, r.name, grouped(1e9 / ns), grouped(ns), ratio,
			fmt.Sprintf("%.1f", w.mallocs),
			fmt.Sprintf("%.1f%%", 100*float64(w.allowed)/float64(max(w.decisions, 1))), script, cpu, vs[i]})
	}
}

// grouped formats v rounded to an integer with thousands separators.
func grouped(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
