package policy_test

import (
	"testing"

	"github.com/tokenshard/tokenshard/policy"
)

var sinkOutcome policy.Outcome

// BenchmarkDecide is one decision on a half-full bucket that refills a
// tenth of a token between calls and spends one, so it neither fills nor
// empties: the arithmetic of every admission, with nothing around it.
func BenchmarkDecide(b *testing.B) {
	l := policy.Limit{Capacity: 1 << 40, TokensPerSecond: 1 << 20}
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
