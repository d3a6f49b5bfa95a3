package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
)

// benchKeys builds n keys of about 16 bytes before any timer starts.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "tenant:" + strconv.Itoa(1_000_000_000+i)
	}
	return keys
}

// benchEngine returns an engine whose policy admits nearly everything, so
// the benchmark measures the decision path rather than denials, with every
// key already tracked.
func benchEngine(b *testing.B, keys []string) *engine.Engine {
	return benchEngineWith(b, keys, engine.Config{})
}

// benchEngineWith is benchEngine with cfg's other fields (Events, say).
func benchEngineWith(b *testing.B, keys []string, cfg engine.Config) *engine.Engine {
	cfg.Policy, cfg.MaxKeys = pol(1, 1<<40, 1<<40), len(keys)
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	reqs := make([]engine.Request, len(keys))
	for i, k := range keys {
		reqs[i] = engine.Request{Key: k, Cost: 1}
	}
	if err := e.AllowBatch(context.Background(), reqs, make([]engine.Result, len(reqs))); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkAllow is one request per call from 8 goroutines per core, as a
// server runs it. transport=bare is the same hand-off with no clock read and
// no bucket work (NewBare): the floor the decision path stands on.
// transport=full+events samples one decision in DefaultEventEvery to a
// consumer that discards it.
func BenchmarkAllow(b *testing.B) {
	for _, n := range []int{1, 100_000} {
		b.Run(fmt.Sprintf("keys=%d/transport=full", n), func(b *testing.B) {
			keys := benchKeys(n)
			benchAllow(b, keys, benchEngine(b, keys))
		})
		b.Run(fmt.Sprintf("keys=%d/transport=full+events", n), func(b *testing.B) {
			keys := benchKeys(n)
			benchAllow(b, keys, benchEngineWith(b, keys, engine.Config{Events: func(engine.Event) {}}))
		})
		b.Run(fmt.Sprintf("keys=%d/transport=bare", n), func(b *testing.B) {
			e, err := engine.NewBare(engine.Config{Policy: pol(1, 1<<40, 1<<40)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = e.Close() })
			benchAllow(b, benchKeys(n), e)
		})
	}
}

func benchAllow(b *testing.B, keys []string, e *engine.Engine) {
	var seed atomic.Uint64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(seed.Add(1), 0))
		ctx := context.Background()
		for pb.Next() {
			if _, err := e.Allow(ctx, keys[r.IntN(len(keys))], 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkAllowBatch sends batches of 64 requests from 8 goroutines per
// core; ns/decision is the figure to compare with BenchmarkAllow.
func BenchmarkAllowBatch(b *testing.B) {
	const batch = 64
	for _, n := range []int{1, 100_000} {
		b.Run(fmt.Sprintf("keys=%d/batch=%d", n, batch), func(b *testing.B) {
			keys := benchKeys(n)
			e := benchEngine(b, keys)
			var seed atomic.Uint64
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(seed.Add(1), 0))
				ctx := context.Background()
				reqs := make([]engine.Request, batch)
				out := make([]engine.Result, batch)
				for pb.Next() {
					for i := range reqs {
						reqs[i] = engine.Request{Key: keys[r.IntN(len(keys))], Cost: 1}
					}
					if err := e.AllowBatch(ctx, reqs, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/decision")
		})
	}
}
