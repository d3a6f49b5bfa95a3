package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// rlsYAML limits users each on their own bucket, one route, and tenants
// each on their own, high enough that every request is admitted: the table
// measures the cost of a decision, not of a refusal. The quota is a year's,
// as redisAdmit's is slow, so that the buckets rlsPrespend spends from stay
// below full, and kept (by the engine and in Redis), all through the run:
// every measured decision updates an existing bucket, as a busy service's
// do. A per-second limit above demand would be full again microseconds
// after each request, and a full bucket is evicted (the Redis store expires
// it), so most decisions would create one instead. 4,000,000 is far above
// what the busiest bucket (the route's, in every request of three
// descriptors) is asked for in a run, and below the capacities the Redis
// store's script computes on in doubles (see redisAdmit).
const rlsYAML = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: year, requests_per_unit: 4000000}
  - key: route
    value: /api
    rate_limit: {unit: year, requests_per_unit: 4000000}
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 4000000}
`

// rlsPrespend is the hits_addend of the warm-up request of each user, each
// of the one and of the three descriptors: at 4,000,000 a year a bucket
// takes over 13 minutes to refill it, longer than the part runs.
const rlsPrespend = 100

// rlsUsers is how many distinct users the requests name (tenants: 37).
const rlsUsers = 1000

// rlsCallers are the concurrent callers each cell is measured at: over gRPC,
// that many unary calls in flight at once on one client connection, each
// its own HTTP/2 stream.
var rlsCallers = []int{1, 64}

// rlsTimes are how long each cell of the envoyrls table runs in each round
// (gRPC and in-process cells), how long each gRPC server is driven before
// the first round (connection, flow-control windows and the server's
// goroutines warmed), and how many interleaved rounds each cell's median is
// taken over.
type rlsTimes struct {
	grpc, local, warm time.Duration
	rounds            int
}

// rlsTimesFor is a variable so that a test can run the part with tiny
// durations.
var rlsTimesFor = func(quick bool) rlsTimes {
	if quick {
		return rlsTimes{grpc: 80 * time.Millisecond, local: 30 * time.Millisecond, warm: 50 * time.Millisecond, rounds: 3}
	}
	return rlsTimes{grpc: 400 * time.Millisecond, local: 150 * time.Millisecond, warm: 200 * time.Millisecond, rounds: 3}
}

// rlsTarget is one RLS server measured: envoyrls on an admitter, or the
// always-OK server, with a gRPC client of its own.
type rlsTarget struct {
	name   string
	srv    rlsv3.RateLimitServiceServer
	client rlsv3.RateLimitServiceClient
	stop   func()
	store  *redisstore.Store // the Redis rows': its Failures are fail-closed answers
}

// rlsRow is one row of each group of the table: a target, called over gRPC
// or in process.
type rlsRow struct {
	target   int
	overGRPC bool
}

// rlsRounds is what the rounds of one cell measured.
type rlsRounds struct {
	rps, p50, p99 []float64
	calls, over   int64
	failures      uint64
}

// alwaysOK is the reference RLS server: it answers every request OK, one OK
// status per descriptor, without looking at it. Over gRPC it costs what the
// protocol does and nothing more.
type alwaysOK struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (alwaysOK) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// serveRLS serves srv with a real grpc-go server on 127.0.0.1:0 and returns
// a grpc-go client of it (one ClientConn: one HTTP/2 connection) and a stop
// that closes the client, stops the server and waits for it.
func serveRLS(srv rlsv3.RateLimitServiceServer) (rlsv3.RateLimitServiceClient, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	served := make(chan struct{})
	go func() { _ = gs.Serve(lis); close(served) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		gs.Stop()
		<-served
		return nil, nil, err
	}
	return rlsv3.NewRateLimitServiceClient(conn), func() { _ = conn.Close(); gs.Stop(); <-served }, nil
}

// rlsRequests returns rlsUsers requests of one limited descriptor (a user)
// and as many of three (a user, the route, a tenant).
func rlsRequests() (one, three []*rlsv3.RateLimitRequest) {
	one = make([]*rlsv3.RateLimitRequest, rlsUsers)
	three = make([]*rlsv3.RateLimitRequest, rlsUsers)
	for i := range rlsUsers {
		user := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: strconv.Itoa(i)}}}
		route := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "route", Value: "/api"}}}
		tenant := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: strconv.Itoa(i % 37)}}}
		one[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{user}}
		three[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{user, route, tenant}}
	}
	return one, three
}

// envoyRLS prints what one envoyrls ShouldRateLimit costs: over gRPC on
// loopback (a grpc-go server and client in this process) beside the same
// calls answered by a server that always says OK, the cost of gRPC alone,
// and called in process; on the engine and, with -redis or -redis-cluster,
// on a Redis store; at 1 and 64 concurrent callers, for requests of one
// limited descriptor and of three. Every request is admitted: a row that met
// a refusal or a fail-closed answer is flagged as a wrong measurement.
func envoyRLS(out io.Writer, cfg config) (err error) {
	times := rlsTimesFor(cfg.quick)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(cfg.procs))
	ctx := context.Background()
	start := time.Now()
	c, err := envoyrls.ParseConfig([]byte(rlsYAML))
	if err != nil {
		return err
	}
	p, err := envoyrls.Policy(1, c)
	if err != nil {
		return err
	}

	var targets []*rlsTarget
	var rdb redis.UniversalClient
	prefix := freshPrefix()
	// Every server stopped and client closed (the Redis store with its
	// server), then the store's keys deleted and the Redis client closed.
	defer func() {
		for _, t := range targets {
			t.stop()
		}
		if rdb == nil {
			return
		}
		n, derr := deletePrefix(ctx, rdb, prefix)
		_ = rdb.Close()
		if derr != nil {
			err = errors.Join(err, fmt.Errorf("envoyrls: deleting the keys under %s: %w", prefix, derr))
		} else if err == nil {
			fmt.Fprintf(out, "envoyrls: deleted the %d keys under %s; the part took %s\n", n, prefix, time.Since(start).Round(100*time.Millisecond))
		}
	}()
	add := func(name string, srv rlsv3.RateLimitServiceServer, release func(), st *redisstore.Store) error {
		client, stop, err := serveRLS(srv)
		if err != nil {
			release()
			return err
		}
		targets = append(targets, &rlsTarget{name: name, srv: srv, client: client, store: st, stop: func() { stop(); release() }})
		return nil
	}
	if err := add("always OK", alwaysOK{}, func() {}, nil); err != nil {
		return err
	}
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		return err
	}
	esrv, err := envoyrls.NewServer(e, c)
	if err != nil {
		_ = e.Close()
		return err
	}
	if err := add("envoyrls on engine", esrv, func() { _ = e.Close() }, nil); err != nil {
		return err
	}
	rows := []rlsRow{{0, true}, {1, true}}
	local := []rlsRow{{1, false}}

	if cfg.redisAddr != "" {
		if rdb, err = newRedisClient(ctx, cfg.redisAddr); err != nil {
			return err
		}
		st, err := newRedisStore(ctx, rdb, prefix, p)
		if err != nil {
			return err
		}
		rsrv, err := envoyrls.NewServer(st, c)
		if err != nil {
			_ = st.Close()
			return err
		}
		if err := add("envoyrls on redisstore", rsrv, func() { _ = st.Close() }, st); err != nil {
			return err
		}
		rows = append(rows, rlsRow{2, true})
		local = append(local, rlsRow{2, false})
	}
	rows = append(rows, local...)

	fmt.Fprintf(out, "envoyrls: ShouldRateLimit over gRPC on loopback (grpc-go server on 127.0.0.1:0 and grpc-go client in this process, sharing the %d cores, GOMAXPROCS %d) and called in process; "+
		"each server has one ClientConn (one HTTP/2 connection), and each caller is a goroutine making unary calls one after another on it, so 64 callers keep up to 64 streams in flight\n",
		runtime.NumCPU(), cfg.procs)
	fmt.Fprintf(out, "envoyrls: %d users, 37 tenants, limits above demand (every request admitted, every bucket pre-spent so it is kept all run); each cell the median of %d interleaved rounds of %s (in process %s); latency per call (HdrHistogram), throughput = calls / wall time\n",
		rlsUsers, times.rounds, times.grpc, times.local)
	if rdb != nil {
		what := "one Redis"
		if n := masters(ctx, rdb); n > 1 || strings.Contains(cfg.redisAddr, ",") {
			what = fmt.Sprintf("a Redis Cluster of %d masters, Redis", n)
		}
		fmt.Fprintf(out, "envoyrls: redisstore on %s %s at %s, under %s: one script call per request (AllowAll), and a Peek of each other descriptor for three\n",
			what, serverVersion(ctx, rdb), cfg.redisAddr, prefix)
	} else {
		fmt.Fprintln(out, "envoyrls: Redis rows skipped; measure them with -redis ADDR or -redis-cluster ADDRS (go run ./bench -parts envoyrls -redis 127.0.0.1:6379)")
	}

	one, three := rlsRequests()
	// Create every bucket, open every connection and warm each server up
	// under load, so that the rounds measure steady-state decisions.
	cfg.prog.mark("envoyrls: warming %d servers up", len(targets))
	for _, t := range targets {
		for _, reqs := range [][]*rlsv3.RateLimitRequest{one, three} {
			for _, r := range reqs {
				pre := &rlsv3.RateLimitRequest{Domain: r.Domain, Descriptors: r.Descriptors, HitsAddend: rlsPrespend}
				resp, err := t.client.ShouldRateLimit(ctx, pre)
				if err != nil {
					return fmt.Errorf("envoyrls: warming %s up: %w", t.name, err)
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					return fmt.Errorf("envoyrls: warming %s up: a request was refused", t.name)
				}
			}
			if _, err := rlsRun(grpcCall(t.client), reqs, 64, times.warm/2); err != nil {
				return fmt.Errorf("envoyrls: warming %s up: %w", t.name, err)
			}
		}
	}

	type group struct {
		callers int
		reqs    []*rlsv3.RateLimitRequest
	}
	var groups []group
	for _, n := range rlsCallers {
		groups = append(groups, group{n, one}, group{n, three})
	}
	res := make([][]rlsRounds, len(groups))
	for gi := range groups {
		res[gi] = make([]rlsRounds, len(rows))
	}
	cells := len(groups) * len(rows)
	for round := range times.rounds {
		cfg.prog.mark("envoyrls: round %d/%d, %d cells", round+1, times.rounds, cells)
		for gi, g := range groups {
			for ri, r := range rows {
				t := targets[r.target]
				cfg.prog.show("envoyrls: round %d/%d, cell %d/%d: %s, %d callers, %d descriptors",
					round+1, times.rounds, gi*len(rows)+ri+1, cells, t.name, g.callers, len(g.reqs[0].Descriptors))
				call, d := localCall(t.srv), times.local
				if r.overGRPC {
					call, d = grpcCall(t.client), times.grpc
				}
				var f0 uint64
				if t.store != nil {
					f0 = t.store.Stats().Failures
				}
				m, err := rlsRun(call, g.reqs, g.callers, d)
				if err != nil {
					return fmt.Errorf("envoyrls: %s, %d callers: %w", t.name, g.callers, err)
				}
				w := &res[gi][ri]
				w.rps = append(w.rps, float64(m.calls)/m.elapsed.Seconds())
				w.p50 = append(w.p50, float64(m.lat.p50))
				w.p99 = append(w.p99, float64(m.lat.p99))
				w.calls += m.calls
				w.over += m.over
				if t.store != nil {
					w.failures += t.store.Stats().Failures - f0
				}
			}
		}
	}

	tw := table.NewWriter()
	tw.SetOutputMirror(out)
	tw.SetTitle("envoyrls ShouldRateLimit: gRPC loopback beside gRPC alone, and in process")
	tw.AppendHeader(table.Row{"callers", "descriptors", "call", "answered by", "requests/s", "p50", "p99", "vs gRPC alone: p50 added, requests/s"})
	var warnings []string
	for gi, g := range groups {
		if gi > 0 {
			tw.AppendSeparator()
		}
		n := len(g.reqs[0].Descriptors)
		ref := &res[gi][0] // the always-OK server over gRPC
		refP50, refRPS := median(ref.p50), median(ref.rps)
		for ri, r := range rows {
			w := &res[gi][ri]
			t := targets[r.target]
			how, vs := "in process", "-"
			p50, rps := median(w.p50), median(w.rps)
			if r.overGRPC {
				how, vs = "gRPC loopback", "ref"
				if ri > 0 {
					vs = fmt.Sprintf("%+.1f µs, %.2fx", (p50-refP50)/1e3, rps/refRPS)
				}
			}
			tw.AppendRow(table.Row{g.callers, n, how, t.name, grouped(rps), micros(p50), micros(median(w.p99)), vs})
			where := fmt.Sprintf("%d callers, %d descriptors, %s, %s", g.callers, n, how, t.name)
			if w.over > 0 {
				warnings = append(warnings, fmt.Sprintf("%s: %d of %d requests not admitted: a wrong measurement", where, w.over, w.calls))
			}
			if w.failures > 0 {
				warnings = append(warnings, fmt.Sprintf("%s: %d decisions answered by the fail-closed rule: a wrong measurement", where, w.failures))
			}
		}
	}
	tw.Render()
	for _, w := range warnings {
		fmt.Fprintln(out, "envoyrls: WARNING:", w)
	}
	return nil
}

// rlsCaller makes one ShouldRateLimit call.
type rlsCaller func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)

func grpcCall(c rlsv3.RateLimitServiceClient) rlsCaller {
	return func(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return c.ShouldRateLimit(ctx, r)
	}
}

func localCall(s rlsv3.RateLimitServiceServer) rlsCaller { return s.ShouldRateLimit }

// rlsMeasure is what one run of a cell measured.
type rlsMeasure struct {
	calls, over int64 // over: answers other than OK
	elapsed     time.Duration
	lat         latency
}

// rlsRun runs callers goroutines, each calling call with reqs round robin
// from its own offset, for about d: each stops after the call in flight when
// d ends, and elapsed runs until the last one has. Each call's latency is
// recorded (HdrHistogram, up to a second: longer calls count as a second).
// The first error any call returns stops the run and is returned.
func rlsRun(call rlsCaller, reqs []*rlsv3.RateLimitRequest, callers int, d time.Duration) (rlsMeasure, error) {
	// A bound on every call, so that a server that stops answering fails
	// the run instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	var stop atomic.Bool
	var calls, over atomic.Int64
	var mu sync.Mutex
	var first error
	hists := make([]*hdrhistogram.Histogram, callers)
	begin := make(chan struct{})
	var wg sync.WaitGroup
	for w := range callers {
		h := hdrhistogram.New(1, int64(time.Second), 3)
		hists[w] = h
		wg.Go(func() {
			<-begin
			var n, o int64
			for i := w * 7919; !stop.Load(); i++ {
				t0 := time.Now()
				resp, err := call(ctx, reqs[i%len(reqs)])
				_ = h.RecordValue(min(int64(time.Since(t0)), int64(time.Second)))
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					stop.Store(true)
					break
				}
				n++
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					o++
				}
			}
			calls.Add(n)
			over.Add(o)
		})
	}
	t0 := time.Now()
	close(begin)
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	wg.Wait()
	elapsed := time.Since(t0)
	timer.Stop()
	if first != nil {
		return rlsMeasure{}, first
	}
	return rlsMeasure{calls: calls.Load(), over: over.Load(), elapsed: elapsed, lat: merged(hists)}, nil
}

// micros formats ns in microseconds: two decimals under 10 µs, else one.
func micros(ns float64) string {
	if us := ns / 1e3; us < 10 {
		return fmt.Sprintf("%.2f µs", us)
	}
	return fmt.Sprintf("%.1f µs", ns/1e3)
}
