package policy_test

import (
	"testing"

	"github.com/tokenshard/tokenshard/policy"
)

var sinkOutcome policy.Outcome

// BenchmarkDecide is one decision on a bucket that refills a tenth of a
// token between calls and spends one, so it never fills nor empties: the
// arithmetic of every admission, with nothing around it.
func BenchmarkDecide(b *testing.B) {
	l := policy.Limit{Capacity: 1 << 40, TokensPerSecond: 1 << 20}
	bk := policy.NewBucket(l, 0)
	now := int64(0)
	for b.Loop() {
		now += 97
		sinkOutcome = bk.Decide(l, now, 1)
	}
	if bk.Tokens >= l.Capacity-1 || bk.Frac == 0 {
		b.Fatalf("bucket %+v: the benchmark measured a shortcut, not the refill", bk)
	}
}
