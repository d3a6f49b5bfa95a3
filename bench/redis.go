package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

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
// first in each group: they are the reference of the store's row with the
// same batch.
type redisRow struct {
	name  string
	batch int
	store bool // through redisstore; false: the in-process engine
}

var redisRows = []redisRow{
	{name: "engine Allow", batch: 1},
	{name: "engine AllowBatch 16", batch: 16},
	{name: "engine AllowBatch 128", batch: 128},
	{name: "redisstore Allow", batch: 1, store: true},
	{name: "redisstore AllowBatch 16", batch: 16, store: true},
	{name: "redisstore AllowBatch 128", batch: 128, store: true},
}

// redisTimes are how long the Redis section measures each cell, and warms
// the store of each scenario first (script loaded, connections open).
type redisTimes struct{ store, engine, warm time.Duration }

func redisTimesFor(quick bool) redisTimes {
	if quick {
		return redisTimes{store: 200 * time.Millisecond, engine: 50 * time.Millisecond, warm: 50 * time.Millisecond}
	}
	return redisTimes{store: 500 * time.Millisecond, engine: 300 * time.Millisecond, warm: 100 * time.Millisecond}
}

// redisSection prints decisions per second through redisstore on one Redis
// server beside the in-process engine on the same keys, or one line saying
// how to enable it when no -redis address was given. It writes only under a
// fresh key prefix and deletes it afterwards. Its error is the server's:
// unreachable, or failing outside a decision.
func redisSection(out io.Writer, cfg config) error {
	if cfg.redisAddr == "" {
		fmt.Fprintln(out, "redis: skipped; measure the Redis store with -redis ADDR (go run ./bench -redis 127.0.0.1:6379 -parts redis)")
		return nil
	}
	ctx := context.Background()
	rdb, err := newRedisClient(ctx, cfg.redisAddr)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(cfg.procs))
	start := time.Now()
	prefix := freshPrefix()
	cleaned := false
	defer func() {
		if !cleaned { // an early return: delete what was written, quietly
			_, _ = deletePrefix(ctx, rdb, prefix)
		}
	}()
	times := redisTimesFor(cfg.quick)

	fmt.Fprintf(out, "redis: one Redis %s at %s on loopback, on the same %d-core machine as the client: client and server share the cores (GOMAXPROCS %d); %s per cell (engine rows %s)\n",
		serverVersion(ctx, rdb), cfg.redisAddr, runtime.NumCPU(), cfg.procs, times.store, times.engine)
	fmt.Fprintln(out, "redis: x engine = ns per decision / the engine's with the same batch; "+
		"script = time Redis spent in EVALSHA per decision (INFO commandstats), and its share of the wall time; + flags other clients' scripts")
	rep := &redisReport{t: table.NewWriter()}
	rep.t.SetOutputMirror(out)
	rep.t.SetTitle("decisions per second: redisstore beside the in-process engine, on the same keys")
	rep.t.AppendHeader(table.Row{"scenario", "goroutines", "contender", "decisions/s", "ns/decision", "x engine", "allocs/decision", "admitted", "script ns/decision (Redis busy)"})
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
		// The engine's cost does not depend on the capacity, but its hot key
		// at millions of decisions a second would run dry on the store's, and
		// deny where the store admits: it gets headroom for the run instead.
		ep := s.policy
		if ep == redisAdmit {
			ep.Capacity = 1 << 40
		}
		e := newEngine(ep, s.keys)
		if err := errors.Join(prespend(ctx, st, ks.names), prespend(ctx, e, ks.names)); err != nil {
			_ = st.Close()
			_ = e.Close()
			return fmt.Errorf("redis: warming up: %w", err)
		}
		var errs atomic.Int64
		runFor(ks, 64, 16, times.warm, func() decider { return admitterDecider(st, &errs, 16) })
		errs.Store(0)
		for gi, g := range s.goroutines {
			if si > 0 || gi > 0 {
				rep.t.AppendSeparator()
			}
			cell++
			cfg.prog.show("redis %d/%d: %s, %d goroutines, %d rows", cell, ncells, s.name, g, len(redisRows))
			rep.measure(ctx, rdb, redisCell{s: s, ks: ks, goroutines: g, st: st, e: e, times: times})
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
		fmt.Fprintln(out, "redis: +: other clients ran scripts during the cell: their script time counts in it too")
	}
	ps := rdb.PoolStats()
	pipeConns := uint32(0)
	if ps.PipelineStats != nil {
		pipeConns = ps.PipelineStats.TotalConns
	}
	fmt.Fprintf(out, "redis: redisstore made %d decisions with %d failures and %d retries; go-redis held %d connections + %d for pipelines\n",
		total.Decisions, total.Failures, total.Retries, ps.TotalConns, pipeConns)
	deleted, err := deletePrefix(ctx, rdb, prefix)
	cleaned = true
	if err != nil {
		rep.warnings = append(rep.warnings, fmt.Sprintf("deleting the keys under %s: %v", prefix, err))
	}
	fmt.Fprintf(out, "redis: deleted the %d keys under %s; the section took %s\n", deleted, prefix, time.Since(start).Round(100*time.Millisecond))
	for _, w := range rep.warnings {
		fmt.Fprintln(out, "redis: WARNING:", w)
	}
	return nil
}

// redisReport is the Redis table being built, and what its footer says.
type redisReport struct {
	t        table.Writer
	warnings []string // wrong measurements: fail-closed answers, errors
	foreign  bool     // other clients ran scripts during a redisstore cell
}

// redisCell is one scenario at one goroutine count: a group of rows.
type redisCell struct {
	s          redisScenario
	ks         *keySet
	goroutines int
	st         *redisstore.Store
	e          *engine.Engine
	times      redisTimes
}

// measure appends a row per contender for c, reading INFO commandstats and
// the store's Stats around each.
func (rep *redisReport) measure(ctx context.Context, rdb *redis.Client, c redisCell) {
	var errs atomic.Int64
	engineNs := map[int]float64{} // batch -> the engine's ns per decision
	for _, r := range redisRows {
		var a engine.Admitter = c.e
		d := c.times.engine
		if r.store {
			a, d = c.st, c.times.store
		}
		stats0 := c.st.Stats()
		cmd0, err0 := readCmdStats(ctx, rdb)
		res := runFor(c.ks, c.goroutines, r.batch, d, func() decider { return admitterDecider(a, &errs, r.batch) })
		cmd1, err1 := readCmdStats(ctx, rdb)
		stats1 := c.st.Stats()

		ns := res.nsPer()
		ratio, script := "ref", "-"
		switch {
		case !r.store:
			engineNs[r.batch] = ns
		case err0 != nil || err1 != nil:
			ratio, script = fmt.Sprintf("%.1fx", ns/engineNs[r.batch]), "? (INFO failed)"
		default:
			ratio = fmt.Sprintf("%.1fx", ns/engineNs[r.batch])
			elapsed := float64(res.elapsed.Microseconds())
			calls, usec := cmd1.evalCalls-cmd0.evalCalls, cmd1.evalUsec-cmd0.evalUsec
			// (Other commands in commandstats are mostly the script's own
			// GET and SET, counted inside EVALSHA's time as well, so they say
			// nothing of other clients; more script calls than ours do.)
			mark := ""
			if ours := res.decisions/int64(r.batch) + int64(stats1.Retries-stats0.Retries); calls > ours+ours/20+5 {
				mark += " +"
				rep.foreign = true
			}
			script = fmt.Sprintf("%s (%.0f%%)%s", grouped(float64(usec)*1000/float64(res.decisions)), 100*float64(usec)/elapsed, mark)
		}
		where := fmt.Sprintf("%s, %d goroutines, %s", c.s.name, c.goroutines, r.name)
		if f := stats1.Failures - stats0.Failures; f > 0 {
			rep.warnings = append(rep.warnings, fmt.Sprintf("%s: %d requests answered by the fail-closed rule: a wrong measurement", where, f))
		}
		if n := errs.Load(); n > 0 {
			rep.warnings = append(rep.warnings, fmt.Sprintf("%s: %d requests got an error: a wrong measurement", where, n))
		}
		errs.Store(0)
		rep.t.AppendRow(table.Row{c.s.name, c.goroutines, r.name, grouped(res.perSecond()), grouped(ns), ratio,
			fmt.Sprintf("%.1f", float64(res.mallocs)/float64(res.decisions)),
			fmt.Sprintf("%.1f%%", 100*float64(res.allowed)/float64(res.decisions)), script})
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
