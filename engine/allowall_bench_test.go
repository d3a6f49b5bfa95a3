package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
)

// BenchmarkAllowAllThree is AllowAll over 3 keys on 3 of 4 shards beside
// three Allows of the same keys one after another (op=allows), from one
// caller and from 8 per core: the figures bench's allowall table prints.
func BenchmarkAllowAllThree(b *testing.B) {
	for _, par := range []int{0, 8} {
		for _, op := range []string{"allowall", "allows"} {
			b.Run(fmt.Sprintf("callers=%d/op=%s", max(par, 1), op), func(b *testing.B) {
				e, err := engine.New(engine.Config{Policy: pol(1, 1<<40, 1<<40), Shards: 4})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = e.Close() })
				triples := shardTriples(e, 1000)
				ctx := context.Background()
				call := func(ks []string) {
					if op == "allows" {
						for _, k := range ks {
							if _, err := e.Allow(ctx, k, 1); err != nil {
								b.Error(err)
							}
						}
						return
					}
					if _, _, err := e.AllowAll(ctx, []engine.Request{{Key: ks[0], Cost: 1}, {Key: ks[1], Cost: 1}, {Key: ks[2], Cost: 1}}); err != nil {
						b.Error(err)
					}
				}
				for _, t := range triples {
					call(t)
				}
				b.ReportAllocs()
				// On a machine others load, CPU time per call is steadier
				// than time per call.
				if c0 := cpuNanos(); c0 >= 0 {
					defer func() { b.ReportMetric(float64(cpuNanos()-c0)/float64(b.N), "cpu-ns/op") }()
				}
				b.ResetTimer()
				if par == 0 {
					for i := range b.N {
						call(triples[i%len(triples)])
					}
					return
				}
				var start atomic.Int64
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					for i := int(start.Add(1)); pb.Next(); i++ {
						call(triples[i%len(triples)])
					}
				})
			})
		}
	}
}

// shardTriples returns n triples of keys owned by shards 0, 1 and 2 of e.
func shardTriples(e *engine.Engine, n int) [][]string {
	var by [3][]string
	for i := 0; min(len(by[0]), len(by[1]), len(by[2])) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if s := e.ShardOf(k); s < 3 {
			by[s] = append(by[s], k)
		}
	}
	out := make([][]string, n)
	for i := range out {
		out[i] = []string{by[0][i], by[1][i], by[2][i]}
	}
	return out
}
