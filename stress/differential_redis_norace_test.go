//go:build !race

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// TestDifferentialRedis replays fixed seeds on the Redis store and the
// model, fails with the shrunk reproduction on the first mismatch, and
// checks that the traces reach what they are meant to. It is left out
// under the race detector: one goroutine replays the traces, on a store
// with no lease, so the detector finds nothing there, and it took 47 s of
// CI's race step against 28 s without. `go test work` without -race runs
// it, and so does CI, after the race step.
func TestDifferentialRedis(t *testing.T) {
	rdb, _ := diffRedisClientOf(t, redistest.Alone(t)) // a server of its own: it loads one as a benchmark does
	mk := diffRedisMaker(rdb)
	want := []string{"ErrInvalidKey", "ErrInvalidCost", "ErrCostExceedsCapacity", "ErrStalePolicy", "ErrInvalidConfig", "ErrInvalidPolicy",
		"Allowed:false", "Allowed:true", "t=9223372036854775807 ", "AllowBatch(", "EvictFull() -> 0,", "Overrides: mustOverrides("}
	seen := map[string]int{}
	c := &counters{}
	longest, evicted := 0, 0
	start := time.Now()
	for seed := uint64(1); seed <= diffRedisSeeds; seed++ {
		tr := diffGenerateStore(seed, diffOpsPerTrace)
		out, err := diffReplay(tr, mk, c, true)
		require.NoError(t, err)
		if out.fail != nil {
			// the server may be this test's own, gone once it ends: any
			// server replays the trace
			t.Fatal(diffCheckAs(tr, mk, nil, "-redis ADDR"))
		}
		require.True(t, out.valid, "seed %d", seed)
		longest = max(longest, diffTally(out.lines, want, seen))
		for _, l := range out.lines {
			if strings.Contains(l, "EvictFull() -> ") && !strings.Contains(l, "EvictFull() -> 0,") {
				evicted++
			}
		}
		c.traces.Add(1)
	}
	took := time.Since(start)
	for _, w := range want {
		assert.Positive(t, seen[w], "no trace produced %s", w)
	}
	assert.Positive(t, evicted, "no EvictFull removed a key")
	assert.Greater(t, longest, redisstore.HistoryVersions, "no trace cut over more often than the store keeps history")
	assert.Positive(t, c.overridden.Load(), "no decision under an override")
	t.Logf("%d traces in %v (%.0f/s), decisions %d, longest cutover chain %d, seen %v",
		c.traces.Load(), took.Round(time.Millisecond), float64(c.traces.Load())/took.Seconds(), c.decisions.Load(), longest, seen)
}
