package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/tokenshard/tokenshard/engine"
)

// allowAllShards is the engine's shard count for the AllowAll table: more
// than the 3 keys of a call, so each call holds 3 different shards.
const allowAllShards = 4

// allowAll prints what AllowAll over 3 keys on 3 shards costs beside 3
// Allows of the same keys one after another, and what its holds cost
// single Allows on the same engine.
func allowAll(out io.Writer, cfg config) {
	d := time.Second
	if cfg.quick {
		d = 200 * time.Millisecond
	}
	triples := shardTriples(1000)
	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetTitle("AllowAll over 3 keys on 3 shards")
	t.SetCaption("ns per call, median of 3 rounds; %d shards; 1 caller, and 8 callers per core", allowAllShards)
	t.AppendHeader(table.Row{"GOMAXPROCS", "callers", "AllowAll", "3 x Allow", "ratio"})
	cfg.prog.mark("allowall: %d GOMAXPROCS values", len(cfg.cpus))
	refused := 0
	for _, cpu := range cfg.cpus {
		runtime.GOMAXPROCS(cpu)
		for _, callers := range []int{1, parallelism * cpu} {
			cfg.prog.show("allowall: %s, %d callers", cores(cpu), callers)
			var all, seq []float64
			for range 3 {
				ns, bad := perCall(triples, callers, d/3, allowAllThree)
				all, refused = append(all, ns), refused+bad
				ns, bad = perCall(triples, callers, d/3, allowThree)
				seq, refused = append(seq, ns), refused+bad
			}
			a, s := median(all), median(seq)
			t.AppendRow(table.Row{cpu, callers, fmt.Sprintf("%.0f", a), fmt.Sprintf("%.0f", s), fmt.Sprintf("%.2fx", a/s)})
		}
	}
	t.Render()
	if refused > 0 {
		// A refusal or an error is cheaper than an admission.
		fmt.Fprintf(out, "allowall: WARNING: %d calls were not admitted in full, where the policy admits all: a wrong measurement\n", refused)
	}

	h := table.NewWriter()
	h.SetOutputMirror(out)
	h.SetTitle("single Allow beside AllowAll traffic")
	h.SetCaption("8 Allow callers per core over the same keys; with: one more goroutine calling AllowAll in a loop")
	h.AppendHeader(table.Row{"GOMAXPROCS", "AllowAll traffic", "p50", "p99", "p99.9", "max"})
	for _, cpu := range cfg.cpus {
		runtime.GOMAXPROCS(cpu)
		for _, with := range []bool{false, true} {
			cfg.prog.show("allowall: Allow latency (%s), AllowAll traffic %v", cores(cpu), with)
			l := latencyBeside(triples, d, with)
			h.AppendRow(table.Row{cpu, map[bool]string{false: "none", true: "1 caller"}[with], l.p50, l.p99, l.p999, l.max})
		}
	}
	h.Render()
}

// shardTriples returns n triples of keys, each triple's keys owned by
// three different shards of an engine of allowAllShards shards. The
// engine's hash is seeded per engine, so the triples are found on the
// engine that uses them: see perCall.
func shardTriples(n int) func(e *engine.Engine) [][]string {
	return func(e *engine.Engine) [][]string {
		// Which shard owns a key shows in Stats: the shard whose Peeks
		// count went up.
		peeks := func() []uint64 {
			st := e.Stats()
			out := make([]uint64, len(st.Shards))
			for i, s := range st.Shards {
				out[i] = s.Peeks
			}
			return out
		}
		byShard := make([][]string, allowAllShards)
		for i := 0; ; i++ {
			k := keyName(i)
			before := peeks()
			_, _ = e.Peek(context.Background(), k)
			for s, p := range peeks() {
				if p != before[s] {
					byShard[s] = append(byShard[s], k)
				}
			}
			if min(len(byShard[0]), len(byShard[1]), len(byShard[2])) >= n {
				break
			}
		}
		out := make([][]string, n)
		for i := range out {
			out[i] = []string{byShard[0][i], byShard[1][i], byShard[2][i]}
		}
		return out
	}
}

// allowAllThree is AllowAll over the triple ks, one token each; it reports
// whether all three were admitted.
func allowAllThree(e *engine.Engine, ks []string) bool {
	d, _, err := e.AllowAll(context.Background(), []engine.Request{{Key: ks[0], Cost: 1}, {Key: ks[1], Cost: 1}, {Key: ks[2], Cost: 1}})
	return err == nil && d.Allowed
}

// allowThree is an Allow of each key of ks, one after another; it reports
// whether all three were admitted.
func allowThree(e *engine.Engine, ks []string) bool {
	ok := true
	for _, k := range ks {
		d, err := e.Allow(context.Background(), k, 1)
		ok = ok && err == nil && d.Allowed
	}
	return ok
}

// perCall returns the ns per call of call, made by callers goroutines for
// about d over the triples, on a fresh engine, and how many calls reported
// a request not admitted.
func perCall(triples func(*engine.Engine) [][]string, callers int, d time.Duration, call func(*engine.Engine, []string) bool) (ns float64, refused int) {
	e, err := engine.New(engine.Config{Policy: admitAll, Shards: allowAllShards})
	if err != nil {
		panic(err) // the bench's own configuration is wrong
	}
	defer e.Close()
	ts := triples(e)
	for _, tr := range ts {
		call(e, tr) // create the keys
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	calls := 0
	stop := time.Now().Add(d)
	start := time.Now()
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, bad := 0, 0
			for i := w; ; i++ {
				if n%64 == 0 && time.Now().After(stop) {
					break
				}
				if !call(e, ts[i%len(ts)]) {
					bad++
				}
				n++
			}
			mu.Lock()
			calls += n
			refused += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(time.Since(start).Nanoseconds()) / float64(calls), refused
}

// latencyBeside measures single Allows over the triples' keys, with or
// without a goroutine calling AllowAll over them meanwhile.
func latencyBeside(triples func(*engine.Engine) [][]string, d time.Duration, with bool) latency {
	e, err := engine.New(engine.Config{Policy: admitAll, Shards: allowAllShards})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	ts := triples(e)
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	if with {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				tr := ts[i%len(ts)]
				_, _, _ = e.AllowAll(context.Background(), []engine.Request{{Key: tr[0], Cost: 1}, {Key: tr[1], Cost: 1}, {Key: tr[2], Cost: 1}})
			}
		}()
	}
	workers := parallelism * runtime.GOMAXPROCS(0)
	hists := make([]*hdrhistogram.Histogram, workers)
	for w := range workers {
		hists[w] = hdrhistogram.New(1, int64(time.Second), 3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := w; ; i++ {
				if i%64 == 0 && time.Now().After(stop) {
					return
				}
				t0 := time.Now()
				_, _ = e.Allow(ctx, ts[i%len(ts)][i%3], 1)
				_ = hists[w].RecordValue(int64(time.Since(t0)))
			}
		}()
	}
	wg.Wait()
	return merged(hists)
}
