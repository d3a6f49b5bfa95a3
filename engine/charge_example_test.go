package engine_test

import (
	"context"
	"fmt"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// A handler reserves an estimate of 4 tokens with Allow, does the work, and
// learns that it cost 16: it charges the other 12. The key is then 6 tokens
// in debt, and the next request waits until the debt is repaid and one
// token has refilled: 7 seconds at 1 per second.
func ExampleEngine_Charge() {
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		Clock:  clk,
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	ctx := context.Background()
	d, _ := e.Allow(ctx, "tenant:7", 4)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = e.Charge(ctx, "tenant:7", 16-4)
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = e.Allow(ctx, "tenant:7", 1)
	fmt.Println(d.Allowed, d.RetryAfter)

	clk.Advance(d.RetryAfter)
	d, _ = e.Allow(ctx, "tenant:7", 1)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 6
	// true -6 16s
	// false 7s
	// true 0
}
