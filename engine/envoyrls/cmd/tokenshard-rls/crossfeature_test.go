package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// mixYAML has two enforced limits and a shadow one, each large enough to be
// leased.
const mixYAML = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// mixShapes are a request of mixYAML of each shape, on keys of value v: one
// key (Allow), two (AllowAll), a check-only descriptor (Peek) and a shadow
// one (AllowBatch).
func mixShapes(v string) map[string]*rlsv3.RateLimitRequest {
	return map[string]*rlsv3.RateLimitRequest{
		"one key":    rlstest.Req("d", 0, rlstest.D("a="+v)),
		"two keys":   rlstest.Req("d", 0, rlstest.D("a="+v), rlstest.D("b="+v)),
		"check only": rlstest.Req("d", 0, rlstest.DH(0, "a="+v)),
		"shadow":     rlstest.Req("d", 0, rlstest.D("s="+v)),
	}
}

// TestMixRedisDownEveryShape: with Redis down, every shape of request on a
// key no lease covers is gRPC Unavailable, failing open or closed, with
// leases or without.
func TestMixRedisDownEveryShape(t *testing.T) {
	srv := redistest.Start(t)
	harnesses := map[string]*rlstest.Harness{}
	for _, leases := range []bool{false, true} {
		for _, failOpen := range []bool{false, true} {
			factory := func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
				t.Cleanup(func() { _ = c.Close() })
				cfg := redisstore.Config{Client: c, Policy: p, Clock: clk, FailOpen: failOpen, Timeout: answersTimeout,
					Prefix: fmt.Sprintf("down:%d:", prefixes.Add(1))}
				if leases {
					cfg.Leases = &redisstore.Leases{}
				}
				s, err := redisstore.New(context.Background(), cfg)
				if err != nil {
					t.Fatalf("redisstore.New: %v", err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			combo := fmt.Sprintf("leases=%v/FailOpen=%v", leases, failOpen)
			h := rlstest.Start(t, factory, mixYAML)
			for name, req := range mixShapes("up") {
				if resp := h.Ask(req); resp.OverallCode != rlstest.OK {
					t.Fatalf("%s, %s, Redis up: %v", combo, name, resp)
				}
			}
			harnesses[combo] = h
		}
	}
	srv.Kill()
	defer srv.Restart(t)
	var asks sync.WaitGroup // at once: each takes the store a while to find Redis gone
	for combo, h := range harnesses {
		for name, req := range mixShapes("down") {
			asks.Go(func() {
				resp, err := h.Client.ShouldRateLimit(context.Background(), req)
				if status.Code(err) != codes.Unavailable {
					t.Errorf("%s, %s, Redis down: %v %v, want Unavailable", combo, name, resp, err)
				}
			})
		}
	}
	asks.Wait()
}

// TestMixClosedStoreEveryShape: once the store is closed, every shape of
// request is an error, a key a lease held before the Close included.
func TestMixClosedStoreEveryShape(t *testing.T) {
	for _, leases := range []bool{false, true} {
		t.Run(fmt.Sprintf("leases=%v", leases), func(t *testing.T) {
			f := singleStore
			if leases {
				f = leasedStore
			}
			h := rlstest.Start(t, f, mixYAML)
			for range 200 { // a hot key, leased
				h.Ask(rlstest.Req("d", 0, rlstest.D("a=x")))
			}
			if err := h.A.Close(); err != nil {
				t.Fatal(err)
			}
			for name, req := range mixShapes("x") {
				resp, err := h.Client.ShouldRateLimit(context.Background(), req)
				if err == nil {
					t.Errorf("%s, store closed: %v, want an error", name, resp)
				} else {
					t.Logf("%s: %v", name, err)
				}
			}
		})
	}
}

// TestMixLeasedReplicasReload: two leased replicas on one prefix, both
// holding leases of a key, reload to a raised and to a lowered limit; what
// both admit after it is at most the key's balance, clamped to the new
// limit: the leases they held top nobody up.
func TestMixLeasedReplicasReload(t *testing.T) {
	const base = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1600}
`
	for _, to := range []string{"3200", "500"} {
		t.Run(to, func(t *testing.T) {
			addr := redistest.Addr(t)
			prefix := fmt.Sprintf("envoyrls-mix:%d:%d:", time.Now().UnixNano(), prefixes.Add(1))
			cleaner := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = cleaner.Close() })
			deleteKeys(t, cleaner, prefix)
			shared := func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
				c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = c.Close() })
				s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix, Policy: p, Clock: clk,
					Leases: &redisstore.Leases{}, Timeout: answersTimeout})
				if err != nil {
					t.Fatalf("redisstore.New: %v", err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			a := rlstest.Start(t, shared, base)
			b := rlstest.Start(t, shared, base)
			req := rlstest.Req("d", 0, rlstest.D("a=x"))
			for range 400 {
				a.Ask(req)
				b.Ask(req)
			}
			cfg := rlstest.Parse(t, strings.Replace(base, "1600", to, 1))
			if err := a.Server.Reload(context.Background(), cfg...); err != nil {
				t.Fatal(err)
			}
			if err := b.Server.Reload(context.Background(), cfg...); err != nil {
				t.Fatal(err)
			}
			n := 0
			for range 1000 {
				for _, h := range []*rlstest.Harness{a, b} {
					if h.Ask(req).OverallCode == rlstest.OK {
						n++
					}
				}
			}
			want := 500 // 800 left, clamped to 500
			if to == "3200" {
				want = 800
			}
			t.Logf("admitted %d after the reload, balance %d; stats a %+v", n, want, a.A.(*redisstore.Store).Stats())
			if n > want {
				t.Errorf("admitted %d after the reload to %s, the balance is %d", n, to, want)
			}
		})
	}
}

// TestMixReloadWhileServing: reloads made while requests of every shape
// are served fail none of them, on a single Redis, with leases and on a
// cluster.
func TestMixReloadWhileServing(t *testing.T) {
	const base = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100000}
`
	for _, kind := range []string{"single", "leased", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			f := singleStore
			switch kind {
			case "leased":
				f = leasedStore
			case "cluster":
				f = clusterStore
			}
			h := rlstest.Start(t, f, base)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var errs, oks atomic.Int64
			var first atomic.Value
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					i := 0
					for {
						select {
						case <-stop:
							return
						default:
						}
						i++
						reqs := mixShapes(fmt.Sprint(w, "-", i%50))
						for _, req := range reqs {
							_, err := h.Client.ShouldRateLimit(context.Background(), req)
							if err != nil {
								errs.Add(1)
								first.CompareAndSwap(nil, err.Error())
							} else {
								oks.Add(1)
							}
						}
					}
				}()
			}
			for i := range 20 {
				rpu := fmt.Sprint(100000 + i + 1)
				cfg := rlstest.Parse(t, strings.ReplaceAll(base, "100000", rpu))
				if err := h.Server.Reload(context.Background(), cfg...); err != nil {
					t.Errorf("Reload: %v", err)
				}
			}
			close(stop)
			wg.Wait()
			t.Logf("%d ok, %d errors, first %v", oks.Load(), errs.Load(), first.Load())
			if errs.Load() > 0 {
				t.Errorf("%d requests failed during reloads: %v", errs.Load(), first.Load())
			}
		})
	}
}

// TestMixManyExactEntries: exact entries have no bound of their own; a
// store serves 20,000 of them, and reloads them all.
func TestMixManyExactEntries(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	for i := range 20000 {
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", i, 1+i%7)
	}
	f := singleStore
	start := time.Now()
	h := rlstest.Start(t, f, b.String())
	t.Logf("start %v", time.Since(start))
	start = time.Now()
	resp := h.Ask(rlstest.Req("big", 3, rlstest.D("k=v19998")))
	t.Logf("ask %v: %v", time.Since(start), resp.Statuses[0])
	if resp.Statuses[0].GetLimitRemaining() != 4 || resp.OverallCode != rlstest.OK {
		t.Errorf("v19999 (limit 7), cost 3: %v", resp)
	}
	cfg := rlstest.Parse(t, strings.ReplaceAll(b.String(), "hour", "minute"))
	start = time.Now()
	if err := h.Server.Reload(context.Background(), cfg...); err != nil {
		t.Fatal(err)
	}
	t.Logf("reload %v", time.Since(start))
	resp = h.Ask(rlstest.Req("big", 0, rlstest.D("k=v19998")))
	if resp.Statuses[0].GetLimitRemaining() != 3 || resp.OverallCode != rlstest.OK {
		t.Errorf("after reload: %v", resp)
	}
}

// TestMixLeasedCommandGivesBackAtShutdown: a leased command gives its
// leases back when it stops, so the next one on the prefix admits exactly
// what is left.
func TestMixLeasedCommandGivesBackAtShutdown(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := "envoyrls-mix-leased:" + time.Now().Format("150405.000000000") + ":"
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	deleteKeys(t, c, prefix)
	yaml := strings.Replace(limitsYAML, "unit: minute, requests_per_unit: 2", "unit: year, requests_per_unit: 1000", 1)
	args := []string{"-redis", addr, "-redis-prefix", prefix, "-leases", "-redis-timeout", slowMachine}
	count := func(cmd *command, n int) int {
		ok := 0
		for range n {
			if overall(cmd.ask("gw", "route=/hot")) == "OK" {
				ok++
			}
		}
		return ok
	}
	first := startCommandWith(t, yaml, args...)
	if n := count(first, 300); n != 300 {
		t.Fatalf("first: %d of 300", n)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	second := startCommandWith(t, yaml, args...)
	if n := count(second, 800); n != 700 {
		t.Errorf("after a restart: %d of 800 admitted, want the 700 left; stderr %s", n, first.stderr)
	}
}

// TestMixLeasedBigCostRefusedTakesNothing: a cost above what is left of a
// leased key is refused, alone, beside another key and split over two
// descriptors of the key, and takes nothing, neither from Redis nor from
// the lease.
func TestMixLeasedBigCostRefusedTakesNothing(t *testing.T) {
	h := rlstest.Start(t, leasedStore, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	one := rlstest.Req("d", 0, rlstest.D("a=x"))
	for range 300 {
		h.Ask(one)
	}
	// 700 left: a cost of 701 is refused, alone and beside another key, and takes nothing.
	for _, req := range []*rlsv3.RateLimitRequest{
		rlstest.Req("d", 701, rlstest.D("a=x")),
		rlstest.Req("d", 0, rlstest.DH(701, "a=x"), rlstest.D("b=y")),
		rlstest.Req("d", 0, rlstest.DH(400, "a=x"), rlstest.DH(301, "a=x")),
	} {
		if resp := h.Ask(req); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%v: %v, want OVER_LIMIT", req.Descriptors, resp)
		}
	}
	// A top-up on its way is in neither Redis nor the lease: a check may
	// read low by it, never high.
	if resp := h.Ask(rlstest.Req("d", 0, rlstest.DH(0, "a=x"))); resp.Statuses[0].GetLimitRemaining() > 700 {
		t.Errorf("check: %v, want at most 700 left", resp.Statuses[0])
	}
	n := 0
	for range 800 {
		if h.Ask(one).OverallCode == rlstest.OK {
			n++
		}
	}
	if n != 700 {
		t.Errorf("%d admitted, want the 700 left", n)
	}
}

// TestMixReplicaBeforeItsReloadToZero: when one replica takes a limit to 0,
// another that has not reloaded yet asks the entry's bucket, one token a
// year, as envoyrls.Server.CheckPolicy says: each key passes one request
// more, and no second.
func TestMixReplicaBeforeItsReloadToZero(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := fmt.Sprintf("envoyrls-mix-zero:%d:", time.Now().UnixNano())
	cleaner := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = cleaner.Close() })
	deleteKeys(t, cleaner, prefix)
	shared := func(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix, Policy: p, Clock: clk, Timeout: answersTimeout})
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	const y = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	a := rlstest.Start(t, shared, y)
	b := rlstest.Start(t, shared, y)
	if err := a.Server.Reload(context.Background(), rlstest.Parse(t, strings.Replace(y, "requests_per_unit: 5", "requests_per_unit: 0", 1))...); err != nil {
		t.Fatal(err)
	}
	req := rlstest.Req("d", 0, rlstest.D("user=u"))
	if resp := b.Ask(req); resp.OverallCode != rlstest.OK {
		t.Errorf("replica b, first request: %v, want the bucket's one token", resp)
	}
	if resp := b.Ask(req); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("replica b, second request: %v, want OVER_LIMIT", resp)
	}
	if resp := a.Ask(req); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("replica a: %v, want OVER_LIMIT", resp)
	}
	if err := b.Server.CheckPolicy(); err == nil {
		t.Error("replica b's CheckPolicy: nil, want a mismatch")
	}
}
