package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jedib0t/go-pretty/v6/table"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/policy"
)

// rlsYAML limits users each on their own bucket, one route, and tenants
// each on their own, high enough that every request is admitted: the table
// measures the cost of a decision, not of a refusal.
const rlsYAML = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: route
    value: /api
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// rlsUsers is how many distinct users (and tenants) the requests name.
const rlsUsers = 1000

// envoyRLS prints what one envoyrls ShouldRateLimit costs on the engine,
// called in process and over gRPC on loopback, for a request of one limited
// descriptor (one Allow's worth, decided by AllowAll) and of three (AllowAll
// over three keys, then a Peek of the two that did not bind).
func envoyRLS(out io.Writer, cfg config) error {
	d := 300 * time.Millisecond
	if cfg.quick {
		d = 60 * time.Millisecond
	}
	c, err := envoyrls.ParseConfig([]byte(rlsYAML))
	if err != nil {
		return err
	}
	p, err := envoyrls.Policy(1, c)
	if err != nil {
		return err
	}
	one := make([]*rlsv3.RateLimitRequest, rlsUsers)
	three := make([]*rlsv3.RateLimitRequest, rlsUsers)
	for i := range rlsUsers {
		u := strconv.Itoa(i)
		user := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}}
		route := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "route", Value: "/api"}}}
		tenant := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: strconv.Itoa(i % 37)}}}
		one[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{user}}
		three[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{user, route, tenant}}
	}

	t := table.NewWriter()
	t.SetOutputMirror(out)
	t.SetTitle("envoyrls ShouldRateLimit on the engine")
	t.SetCaption("ns per request, median of 3 rounds; %d users; 8 callers per core; every request admitted", rlsUsers)
	t.AppendHeader(table.Row{"GOMAXPROCS", "descriptors", "in process", "gRPC loopback", "engine Allow x descriptors"})
	cfg.prog.mark("envoyrls: %d GOMAXPROCS values", len(cfg.cpus))
	for _, cpu := range cfg.cpus {
		runtime.GOMAXPROCS(cpu)
		callers := parallelism * cpu
		for _, reqs := range [][]*rlsv3.RateLimitRequest{one, three} {
			n := len(reqs[0].Descriptors)
			cfg.prog.show("envoyrls: %s, %d descriptors", cores(cpu), n)
			var local, remote, allow []float64
			for range 3 {
				ns, err := rlsPerRequest(p, c, reqs, callers, d/3, false)
				if err != nil {
					return err
				}
				local = append(local, ns)
				if ns, err = rlsPerRequest(p, c, reqs, callers, d/3, true); err != nil {
					return err
				}
				remote = append(remote, ns)
				if ns, err = allowPerRequest(p, n, callers, d/3); err != nil {
					return err
				}
				allow = append(allow, ns)
			}
			t.AppendRow(table.Row{cpu, n, fmt.Sprintf("%.0f", median(local)), fmt.Sprintf("%.0f", median(remote)), fmt.Sprintf("%.0f", median(allow))})
		}
	}
	t.Render()
	return nil
}

// rlsPerRequest runs callers goroutines sending reqs, round robin, for d,
// to a fresh server on a fresh engine: directly, or through a gRPC client
// on loopback. It returns the ns per request.
func rlsPerRequest(p policy.Policy, c *envoyrls.Config, reqs []*rlsv3.RateLimitRequest, callers int, d time.Duration, overGRPC bool) (float64, error) {
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		return 0, err
	}
	defer e.Close()
	srv, err := envoyrls.NewServer(e, c)
	if err != nil {
		return 0, err
	}
	var call func(*rlsv3.RateLimitRequest) error
	if !overGRPC {
		call = func(r *rlsv3.RateLimitRequest) error {
			_, err := srv.ShouldRateLimit(context.Background(), r)
			return err
		}
	} else {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		gs := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(gs, srv)
		served := make(chan struct{})
		go func() { _ = gs.Serve(lis); close(served) }()
		defer func() { gs.Stop(); <-served }()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		client := rlsv3.NewRateLimitServiceClient(conn)
		call = func(r *rlsv3.RateLimitRequest) error {
			_, err := client.ShouldRateLimit(context.Background(), r)
			return err
		}
	}
	for _, r := range reqs {
		if err := call(r); err != nil { // create the keys, warm up
			return 0, err
		}
	}
	return perRequest(callers, d, func(i int) error { return call(reqs[i%len(reqs)]) })
}

// allowPerRequest is the floor: n engine Allows per request, one after
// another, on users' keys.
func allowPerRequest(p policy.Policy, n, callers int, d time.Duration) (float64, error) {
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		return 0, err
	}
	defer e.Close()
	keys := make([]string, rlsUsers)
	for i := range keys {
		keys[i] = "user" + strconv.Itoa(i)
	}
	return perRequest(callers, d, func(i int) error {
		for j := range n {
			if _, err := e.Allow(context.Background(), keys[(i+j)%len(keys)], 1); err != nil {
				return err
			}
		}
		return nil
	})
}

// perRequest runs call from callers goroutines for d and returns the ns per
// call, or the first error.
func perRequest(callers int, d time.Duration, call func(i int) error) (float64, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	calls := 0
	var first error
	stop := time.Now().Add(d)
	start := time.Now()
	for w := range callers {
		wg.Go(func() {
			n := 0
			var err error
			for i := w; err == nil; i += callers {
				if n%16 == 0 && time.Now().After(stop) {
					break
				}
				err = call(i)
				n++
			}
			mu.Lock()
			calls += n
			if first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return float64(time.Since(start).Nanoseconds()) / float64(max(calls, 1)), nil
}
