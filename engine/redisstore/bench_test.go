package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// BenchmarkScript is Allow and AllowBatch of 128 from one goroutine on a
// real Redis, on the server's TIME, for a plain policy (the layout and fast
// path every TokensPerSecond policy has), a rate per minute on the fast
// path and on the limbs, and three bands. Besides ns/op, which includes the
// round trip, it reports script-ns/decision: the time Redis itself spent in
// EVALSHA per decision (INFO commandstats), the figure the script's changes
// move. The capacities are large enough that the keys do not run dry.
func BenchmarkScript(b *testing.B) {
	bands, err := policy.NewBands(
		policy.Band{Name: "minute", Capacity: 1 << 30, Refill: policy.PerMinute(1 << 30)},
		policy.Band{Name: "hour", Capacity: 1 << 31, Refill: policy.PerHour(1 << 30)},
		policy.Band{Name: "day", Capacity: 1 << 32, Refill: policy.PerDay(1 << 30)})
	if err != nil {
		b.Fatal(err)
	}
	for _, sc := range []struct {
		name string
		p    policy.Policy
	}{
		{"plain", policy.Policy{Version: 1, Capacity: 1_000_000, TokensPerSecond: 1}},
		{"perMinute-fast", policy.Policy{Version: 1, Capacity: 50_000, Refill: policy.PerMinute(1)}},
		{"perMinute-limbs", policy.Policy{Version: 1, Capacity: 1_000_000, Refill: policy.PerMinute(1)}},
		{"bands3", policy.Policy{Version: 1, Capacity: 1_000_000, TokensPerSecond: 1, Bands: bands}},
	} {
		for _, batch := range []int{1, 128} {
			b.Run(fmt.Sprintf("policy=%s/batch=%d", sc.name, batch), func(b *testing.B) {
				ctx := context.Background()
				c := client(b, redisAddr(b))
				pfx := prefix(b)
				s, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: pfx, Policy: sc.p, Timeout: 5 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					_ = s.Close()
					cleanPrefix(c, pfx)
				})
				reqs := make([]engine.Request, batch)
				for i := range reqs {
					reqs[i] = engine.Request{Key: fmt.Sprint("key", i), Cost: 1}
				}
				out := make([]engine.Result, batch)
				if err := s.AllowBatch(ctx, reqs, out); err != nil { // create the buckets
					b.Fatal(err)
				}
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if err := s.AllowBatch(ctx, reqs, out); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				for i := range out {
					if out[i].Err != nil || !out[i].Decision.Allowed {
						b.Fatalf("request %d: %+v", i, out[i])
					}
				}
				if f := s.Stats().Failures; f > 0 {
					b.Fatalf("%d failures", f)
				}
				b.ReportMetric(scriptNs(b, c)/float64(batch), "script-ns/decision")
			})
		}
	}
}

// scriptNs is the mean time Redis spent in one EVALSHA or FCALL since the last
// CONFIG RESETSTAT, in ns.
func scriptNs(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var calls, usec float64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_fcall") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, err := strconv.ParseFloat(v, 64)
			switch {
			case k != "calls" && k != "usec":
			case err != nil:
				b.Fatal(err)
			case k == "calls":
				calls += x
			default:
				usec += x
			}
		}
	}
	if calls == 0 {
		b.Fatal("no evalsha or fcall in INFO commandstats")
	}
	return usec * 1000 / calls
}

// BenchmarkAllowAll is AllowAll of 3 and of 16 keys from one goroutine on
// a real Redis, on the server's TIME, for a plain policy, beside the same
// keys as AllowBatch (each decided alone) for comparison: one round trip
// and one script call either way.
func BenchmarkAllowAll(b *testing.B) {
	p := policy.Policy{Version: 1, Capacity: 1_000_000, TokensPerSecond: 1} // the fast path, as BenchmarkScript's plain
	for _, n := range []int{3, 16} {
		for _, all := range []bool{true, false} {
			name := fmt.Sprintf("keys=%d/AllowBatch", n)
			if all {
				name = fmt.Sprintf("keys=%d/AllowAll", n)
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				c := client(b, redisAddr(b))
				pfx := prefix(b)
				s, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: pfx, Policy: p, Timeout: 5 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					_ = s.Close()
					cleanPrefix(c, pfx)
				})
				reqs := make([]engine.Request, n)
				for i := range reqs {
					reqs[i] = engine.Request{Key: fmt.Sprint("key", i), Cost: 1}
				}
				out := make([]engine.Result, n)
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if all {
						d, _, err := s.AllowAll(ctx, reqs)
						if err != nil || !d.Allowed {
							b.Fatalf("%+v, %v", d, err)
						}
					} else if err := s.AllowBatch(ctx, reqs, out); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if f := s.Stats().Failures; f > 0 {
					b.Fatalf("%d failures", f)
				}
				b.ReportMetric(scriptNs(b, c), "script-ns/call")
			})
		}
	}
}

// BenchmarkAllowAllBesideAllows is the engine's benchmark of that name on
// a real Redis, on the server's TIME: 48 goroutines on four keys of
// capacity 10 refilled at 100 tokens a second (Redis answers about a tenth
// as many calls as the engine), with singles=24, 24 calling
// Allow of cost 1 on one key and 24 AllowAll over all four, of cost each
// per key; with singles=0 all 48 calling AllowAll. It reports the share of
// AllowAlls admitted (allowall-admitted-ppm), of single Allows
// (allow-admitted-ppm) and of the tokens taken that AllowAlls took
// (allowall-token-share-ppm), each per million.
func BenchmarkAllowAllBesideAllows(b *testing.B) {
	for _, bc := range []struct{ singles, cost int }{{24, 1}, {24, 2}, {0, 2}} {
		b.Run(fmt.Sprintf("singles=%d/cost=%d", bc.singles, bc.cost), func(b *testing.B) {
			c := client(b, redisAddr(b))
			pfx := prefix(b)
			s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: pfx, Timeout: 5 * time.Second,
				Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 100}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				_ = s.Close()
				cleanPrefix(c, pfx)
			})
			admissiontest.BenchAllowAllBeside(b, s, bc.singles, int64(bc.cost))
			if f := s.Stats().Failures; f > 0 {
				b.Fatalf("%d failures", f)
			}
		})
	}
}
