package main

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jedib0t/go-pretty/v6/table"

	"github.com/tokenshard/tokenshard/internal/redistest"
)

// BenchmarkRedisStore is redisstore's Allow and AllowBatch of 128 on a real
// Redis, from 8 goroutines per core (16 at -cpu 2), under a fresh key prefix
// deleted afterwards. The server is redistest.Addr's: $TOKENSHARD_REDIS_ADDR,
// else one answering on 127.0.0.1:6379, else a private redis-server; with
// none the benchmark is skipped with a message saying how to run it. Compare
// with BenchmarkDecide's tokenshard rows, or run `go run ./bench -redis ADDR`
// for both in one table.
func BenchmarkRedisStore(b *testing.B) {
	addr := redistest.Addr(b)
	ctx := context.Background()
	rdb, err := newRedisClient(ctx, addr)
	if err != nil {
		b.Fatal(err)
	}
	prefix := freshPrefix()
	b.Cleanup(func() {
		_, _ = deletePrefix(ctx, rdb, prefix)
		_ = rdb.Close()
	})
	calls := []struct {
		name  string
		batch int
	}{{"Allow", 1}, {"AllowBatch128", 128}}
	for _, s := range redisScenarios[:2] { // hot and uniform, admitting
		ks := keysFor(s.scenario)
		st, err := newRedisStore(ctx, rdb, prefix+s.name+":", s.policy)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		if err := prespend(ctx, st, ks.names); err != nil {
			b.Fatal(err)
		}
		for _, c := range calls {
			b.Run("scenario="+s.name+"/call="+c.name, func(b *testing.B) {
				var errs atomic.Int64
				failures := st.Stats().Failures
				b.ReportAllocs()
				b.ResetTimer()
				decideParallel(b.N, ks, c.batch, func() decider { return admitterDecider(st, &errs, c.batch) })
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.batch), "ns/decision")
				if f := st.Stats().Failures - failures; f > 0 {
					b.Errorf("%d requests were answered by the fail-closed rule, not by Redis: the figure is wrong", f)
				}
				if n := errs.Load(); n > 0 {
					b.Errorf("%d requests got an error", n)
				}
			})
		}
	}
}

// TestRedisSection runs the Redis table end to end on the quick setting,
// after the latency part at -cpu 1: every row measured, no fail-closed
// answer, no error, every key it wrote deleted, and its client's pool made
// for the GOMAXPROCS the table runs at (go-redis holds 10 connections per
// GOMAXPROCS), not for the -cpu value the part before it left behind: 10
// connections for the table's 64 goroutines, where it runs at 2.
func TestRedisSection(t *testing.T) {
	skipUnderRace(t)
	addr := redistest.Alone(t)
	tinyRedisTimes(t)
	var out bytes.Buffer
	if code := run([]string{"-quick", "-parts", "latency,redis", "-cpu", "1", "-redis", addr}, &out, &out); code != 0 {
		t.Fatalf("bench -parts latency,redis exited %d:\n%s", code, out.String())
	}
	got := out.String()
	if runtime.GOMAXPROCS(0) >= 2 { // else -cpu 1 is the GOMAXPROCS the table runs at
		_, after, ok := strings.Cut(got, "go-redis held ")
		held, err := strconv.Atoi(strings.Fields(after + " x")[0])
		if !ok || err != nil {
			t.Fatalf("output does not say how many connections go-redis held:\n%s", got)
		}
		if held <= 10 {
			t.Errorf("go-redis held %d connections at 64 goroutines: a pool made for GOMAXPROCS 1, where the table runs at %d:\n%s", held, runtime.GOMAXPROCS(0), got)
		}
	}
	for _, r := range redisRows {
		if strings.Count(got, "| "+r.name+" ") != 7 {
			t.Errorf("output lacks a row %q for each of the 7 scenario and goroutine cells:\n%s", r.name, got)
		}
	}
	if strings.Contains(got, "WARNING") || !strings.Contains(got, "with 0 failures") {
		t.Errorf("the run met failures or errors:\n%s", got)
	}
	// The prefix is printed in the last line; nothing may be left under it,
	// nor under redis_rate's.
	requireNothingLeft(t, got, addr, rateKeyPrefix)
}

// tinyRedisTimes makes the Redis section's cells last milliseconds for the
// test: the table's shape is checked, not its figures.
func tinyRedisTimes(t *testing.T) {
	old := redisTimesFor
	redisTimesFor = func(bool) redisTimes {
		return redisTimes{store: 20 * time.Millisecond, engine: 5 * time.Millisecond, warm: 10 * time.Millisecond, rounds: 1}
	}
	t.Cleanup(func() { redisTimesFor = old })
}

// requireNothingLeft reads from a Redis part's output the prefix it says it
// deleted ("keys under PREFIX"), and checks that no key is left under it,
// nor under each of more followed by it.
func requireNothingLeft(t *testing.T, got, addr string, more ...string) {
	t.Helper()
	_, after, ok := strings.Cut(got, "keys under ")
	prefix := after
	if i := strings.IndexAny(after, " ;"); i >= 0 {
		prefix = after[:i]
	}
	if !ok || !strings.HasPrefix(prefix, "tsbench:") {
		t.Fatalf("output does not name the deleted prefix:\n%s", got)
	}
	rdb, err := newRedisClient(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for _, m := range append([]string{""}, more...) {
		if n, err := deletePrefix(context.Background(), rdb, m+prefix); err != nil || n != 0 {
			t.Errorf("%d keys were left under %s (err %v)", n, m+prefix, err)
		}
	}
}

func TestGrouped(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {123456.4, "123,456"}, {1234567, "1,234,567"}, {-1234, "-1,234"}} {
		if got := grouped(c.in); got != c.want {
			t.Errorf("grouped(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestRateTopUp: redis_rate's hot key is brought back before each of its
// runs, as the store's is, so neither runs dry beside the other.
func TestRateTopUp(t *testing.T) {
	ctx := context.Background()
	rdb, err := newRedisClient(ctx, redistest.Alone(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	sha, err := rateSHA(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	pfx := freshPrefix()
	defer func() { _, _ = deletePrefix(ctx, rdb, rateKeyPrefix+pfx) }()
	// 1,000 tokens: prespend leaves 400, and 500 requests drain them. A
	// token an hour, so that no refill lands among the 500 calls, however
	// long a loaded machine takes over them.
	rp := &ratePeer{rdb: rdb, l: redis_rate.NewLimiter(rdb), limit: redis_rate.Limit{Rate: 1, Burst: 1000, Period: time.Hour}, sha: sha, pfx: pfx}
	names := []string{"hot"}
	var errs atomic.Int64
	d := rp.decider(&errs, 1)
	keys := make([]string, 500)
	for i := range keys {
		keys[i] = "hot"
	}
	for round := range 2 {
		if err := rp.topUp(ctx, names); err != nil {
			t.Fatal(err)
		}
		if got := d.decide(keys); got < 399 || got > 401 || errs.Load() != 0 {
			t.Errorf("round %d: admitted %d of 500 after topUp (errors %d), want the 400 prespend left", round, got, errs.Load())
		}
	}
}

// TestRedisCellClusterOwnCalls: on a Redis Cluster no other client uses,
// no row of a cell is flagged as carrying other clients' commands. The
// store's AllowBatch sends one script call per virtual shard its keys fall
// in, not one per batch: 16 keys of 1,000 reach about 10 of the 16 shards,
// and counting one call a batch took the rest for another client's.
func TestRedisCellClusterOwnCalls(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t)
	rdb, err := newRedisClient(ctx, strings.Join(c.Addrs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	sha, err := rateSHA(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	s := redisScenario{scenario{name: "uniform", keys: 1000, policy: redisAdmit}, []int{8}}
	ks := newKeySet(s.scenario)
	prefix := freshPrefix()
	st, err := newRedisStore(ctx, rdb, prefix, s.policy)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rp := &ratePeer{rdb: rdb, l: redis_rate.NewLimiter(rdb), limit: gcraLimit(s.policy), sha: sha, pfx: prefix}
	e := newEngine(s.policy, s.keys)
	defer e.Close()
	if err := errors.Join(prespend(ctx, st, ks.names), prespend(ctx, e, ks.names), rp.prespend(ctx, ks.names)); err != nil {
		t.Fatal(err)
	}
	rep := &redisReport{t: table.NewWriter()}
	rep.measure(ctx, rdb, redisCell{s: s, ks: ks, goroutines: 8, st: st, rp: rp, e: e,
		times: redisTimes{store: 50 * time.Millisecond, engine: 10 * time.Millisecond, rounds: 1}})
	if rep.foreign {
		t.Errorf("a row was flagged as carrying other clients' commands on a cluster only this test uses:\n%s", rep.t.Render())
	}
	if len(rep.warnings) > 0 {
		t.Errorf("warnings: %q", rep.warnings)
	}
}
