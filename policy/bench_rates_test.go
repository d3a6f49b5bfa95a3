package policy_test

import (
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// BenchmarkDecideRefill is BenchmarkDecide for a compact rate that is not a
// whole number per second, 7 tokens every 3 s: the Bucket path whose
// division is by the period, not by the constant 1e9.
func BenchmarkDecideRefill(b *testing.B) {
	l := policy.Limit{Capacity: 1 << 40, Refill: policy.Rate{Tokens: 7 << 20, Per: 3 * time.Second}}
	bk := policy.NewBucket(l, 0)
	bk.Tokens = l.Capacity / 2
	now := int64(0)
	for b.Loop() {
		now += 97
		sinkOutcome = bk.Decide(l, now, 1)
	}
	if !sinkOutcome.Allowed || bk.Tokens >= l.Capacity/2 || bk.Last != now {
		b.Fatalf("bucket %+v after %+v: the benchmark did not measure a refill and a spend", bk, sinkOutcome)
	}
}

// BenchmarkDecideLevels is one decision over a primary band per second and
// three bands per minute, hour and day: RefillLevels and DecideLevels, as
// the engine runs them for a key with bands.
func BenchmarkDecideLevels(b *testing.B) {
	bands, err := policy.NewBands(
		policy.Band{Name: "minute", Capacity: 1 << 40, Refill: policy.PerMinute(60 << 20)},
		policy.Band{Name: "hour", Capacity: 1 << 40, Refill: policy.PerHour(3600 << 20)},
		policy.Band{Name: "day", Capacity: 1 << 40, Refill: policy.PerDay(86400 << 20)},
	)
	if err != nil {
		b.Fatal(err)
	}
	sh := policy.Shape{Primary: policy.Limit{Capacity: 1 << 40, TokensPerSecond: 1 << 20}, Bands: bands}
	lv := make([]policy.Level, sh.Len())
	for i := range lv {
		lv[i].Tokens = sh.Band(i).Capacity / 2
	}
	for b.Loop() {
		policy.RefillLevels(sh, lv, 97)
		sinkOutcome, _ = policy.DecideLevels(sh, lv, 1)
	}
	if !sinkOutcome.Allowed || lv[3].Tokens >= sh.Band(3).Capacity/2 {
		b.Fatalf("levels %+v after %+v: the benchmark did not measure a refill and a spend", lv, sinkOutcome)
	}
}
