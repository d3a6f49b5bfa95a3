package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/internal/keycopy"
)

// benchKeys builds n keys of 17 bytes before any timer starts.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "tenant:" + strconv.Itoa(1_000_000_000+i)
	}
	return keys
}

// drawLen is how many requests' keys benchDraws lays out.
const drawLen = 1 << 20

var (
	drawsMu sync.Mutex
	draws   = map[int][]string{}
)

// benchDraws returns drawLen uniform picks from keys, built once per key
// count (benchKeys makes the same keys for the same count). Each pick is a
// copy of the key's bytes, and the copies lie in pick order in one string:
// fresh strings, as keys parsed from requests are, read in order, so the
// hardware streams them in. Picking from keys in the timed loop would
// instead charge every call cache misses on its own key, bare hand-off
// included.
func benchDraws(keys []string) []string {
	drawsMu.Lock()
	defer drawsMu.Unlock()
	if d, ok := draws[len(keys)]; ok {
		return d
	}
	r := rand.New(rand.NewPCG(uint64(len(keys)), 0))
	picks := make([]int, drawLen)
	for i := range picks {
		picks[i] = r.IntN(len(keys))
	}
	d := keycopy.Copies(keys, picks)
	draws[len(keys)] = d
	return d
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

// benchAllow calls Allow from 8 goroutines per core, each walking the
// draws from its own place.
func benchAllow(b *testing.B, keys []string, e *engine.Engine) {
	d := benchDraws(keys)
	var start atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(104_729)) % drawLen
		ctx := context.Background()
		for pb.Next() {
			if _, err := e.Allow(ctx, d[i], 1); err != nil {
				b.Error(err)
				return
			}
			if i++; i == drawLen {
				i = 0
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
			d := benchDraws(keys)
			var start atomic.Int64
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				at := int(start.Add(104_729)) % (drawLen - batch)
				ctx := context.Background()
				reqs := make([]engine.Request, batch)
				out := make([]engine.Result, batch)
				for pb.Next() {
					if at += batch; at > drawLen-batch {
						at = 0
					}
					for i := range reqs {
						reqs[i] = engine.Request{Key: d[at+i], Cost: 1}
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

// BenchmarkAllowAllBesideAllows measures AllowAll under saturation beside
// single Allows on its keys: 48 goroutines calling in a loop, on four keys
// that refill far slower than the calls come (capacity 10, 1000 tokens a
// second). With singles=24, 24 goroutines call Allow of cost 1 on one of
// the keys and 24 call AllowAll over all four, of cost each per key; with
// singles=0 all 48 call AllowAll, which then compete on equal terms.
// allowall-admitted-ppm is the AllowAlls admitted per million calls,
// allow-admitted-ppm the single Allows', and allowall-token-share-ppm the
// part of the tokens taken that AllowAlls took, per million. An AllowAll
// whose cost on a key is more than one token must find them built up,
// which single Allows that take each token as it refills never let happen.
func BenchmarkAllowAllBesideAllows(b *testing.B) {
	for _, bc := range []struct{ singles, cost int }{{24, 1}, {24, 2}, {0, 2}} {
		b.Run(fmt.Sprintf("singles=%d/cost=%d", bc.singles, bc.cost), func(b *testing.B) {
			e, err := engine.New(engine.Config{Policy: pol(1, 10, 1000)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = e.Close() })
			admissiontest.BenchAllowAllBeside(b, e, bc.singles, int64(bc.cost))
		})
	}
}
