package policy_test

import (
	"fmt"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// ExampleLimiter sends 10 requests at 999,999,999 ns and 10 more at 1 s to
// three limiters of capacity 10. The fixed window counts afresh from 1 s and
// admits all 20, twice its capacity within 1 ns, as its contract allows. The
// token bucket (10 per second, full at 0) has earned a hundred-millionth of
// a token by 1 s, and the sliding log still sees the first 10 in its window,
// so each admits only 10, and says when the next token or slot comes.
func ExampleLimiter() {
	fw, err := policy.NewFixedWindow(10, time.Second)
	if err != nil {
		panic(err)
	}
	tb, err := policy.NewTokenBucket(policy.Limit{Capacity: 10, TokensPerSecond: 10}, 0)
	if err != nil {
		panic(err)
	}
	sl, err := policy.NewSlidingLog(10, time.Second)
	if err != nil {
		panic(err)
	}

	for _, l := range []struct {
		name string
		policy.Limiter
	}{{"FixedWindow", fw}, {"TokenBucket", tb}, {"SlidingLog", sl}} {
		admitted, retryAfter := 0, int64(0)
		for _, now := range []int64{999_999_999, 1_000_000_000} {
			for range 10 {
				o := l.TryAcquire(now, 1)
				if o.Allowed {
					admitted++
				} else {
					retryAfter = o.RetryAfter
				}
			}
		}
		fmt.Printf("%s admits %d of 20", l.name, admitted)
		if retryAfter > 0 {
			fmt.Printf(", then retry after %v", time.Duration(retryAfter))
		}
		fmt.Println()
	}
	// Output:
	// FixedWindow admits 20 of 20
	// TokenBucket admits 10 of 20, then retry after 99.999999ms
	// SlidingLog admits 10 of 20, then retry after 999.999999ms
}
