package admissiontest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
)

// BenchAllowAllBeside runs, on a, AllowAll under saturation beside single
// Allows on its keys: 48 goroutines calling in a loop b.N calls in all, on
// the keys "a" to "d", which a's policy must refill far slower than the
// calls come. The first singles goroutines call Allow of cost 1 on one key
// each; the others call AllowAll over the four, of cost on each. It reports
// allowall-admitted-ppm (the AllowAlls admitted per million),
// allow-admitted-ppm (the single Allows') and allowall-token-share-ppm (the
// part of the tokens taken that AllowAlls took, per million). An error
// fails b. Backends' BenchmarkAllowAllBesideAllows call it, so their
// figures are of one storm.
func BenchAllowAllBeside(b *testing.B, a engine.Admitter, singles int, cost int64) {
	const goroutines = 48
	keys := []string{"a", "b", "c", "d"}
	all := make([]engine.Request, len(keys))
	for i, k := range keys {
		all[i] = engine.Request{Key: k, Cost: cost}
	}
	var next, allCalls, allAdmitted, oneCalls, oneAdmitted atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range goroutines {
		wg.Go(func() {
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				if g < singles {
					d, err := a.Allow(ctx, keys[g%len(keys)], 1)
					if err != nil {
						b.Error(err)
						return
					}
					oneCalls.Add(1)
					if d.Allowed {
						oneAdmitted.Add(1)
					}
					continue
				}
				d, _, err := a.AllowAll(ctx, all)
				if err != nil {
					b.Error(err)
					return
				}
				allCalls.Add(1)
				if d.Allowed {
					allAdmitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if n := allCalls.Load(); n > 0 {
		b.ReportMetric(float64(allAdmitted.Load()*1_000_000/n), "allowall-admitted-ppm")
	}
	if n := oneCalls.Load(); n > 0 {
		b.ReportMetric(float64(oneAdmitted.Load()*1_000_000/n), "allow-admitted-ppm")
	}
	byAll := allAdmitted.Load() * int64(len(keys)) * cost
	if taken := byAll + oneAdmitted.Load(); taken > 0 {
		b.ReportMetric(float64(byAll*1_000_000/taken), "allowall-token-share-ppm")
	}
}
