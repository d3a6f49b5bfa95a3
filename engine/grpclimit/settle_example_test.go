package grpclimit_test

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/policy"
)

// Each tenant has a budget of 1,000 model tokens, refilled at 10 a second.
// A call is admitted on an estimate, its "max-tokens" metadata, before the
// model runs; the handler settles the usage the completion reports, prompt
// included: an over-estimate is given back, an under-estimate charged, into
// debt if need be. Here the interceptor is called directly, as a server
// would, and no time passes.
func ExampleSettle() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 1000, Refill: policy.PerSecond(10)},
		Clock:  clock.NewManual(0), // a server leaves Clock nil
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	var maxTokens int64 // what the call declares: read from its metadata by a real server
	l, err := grpclimit.New(e,
		grpclimit.WithKey(func(ctx context.Context, _, _ string) (string, error) {
			// Any client can leave the metadata out: index it unchecked and
			// such a call panics, which grpc-go does not recover. A status
			// error is the call's answer; any other error is Internal.
			tenant := metadata.ValueFromIncomingContext(ctx, "tenant")
			if len(tenant) == 0 {
				return "", status.Error(codes.InvalidArgument, "no tenant metadata")
			}
			return tenant[0], nil
		}),
		grpclimit.WithCost(func(context.Context, string) int64 { return maxTokens }))
	if err != nil {
		panic(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/llm.Completions/Create"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("tenant", "acme"))

	for _, c := range []struct{ maxTokens, used int64 }{{500, 320}, {200, 350}, {300, 900}, {100, 0}} {
		maxTokens = c.maxTokens
		_, err := l.Unary(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			// ... the completion runs, and reports c.used tokens, prompt included
			if err := grpclimit.Settle(ctx, c.used); err != nil {
				// The work is done: a settle that fails (a store out of
				// reach, an engine closing) is the server's to log. Failing
				// the call would have its client retry, and pay again.
				log.Printf("settling: %v", err)
			}
			return nil, nil
		})
		d, _ := e.Peek(context.Background(), "acme")
		fmt.Printf("estimate %d, used %d: %v, %d tokens left\n", c.maxTokens, c.used, status.Code(err), d.Remaining)
	}

	// A call without the tenant metadata has no key: refused, not a crash.
	_, err = l.Unary(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, nil })
	fmt.Println("no tenant:", status.Code(err))
	// Output:
	// estimate 500, used 320: OK, 680 tokens left
	// estimate 200, used 350: OK, 330 tokens left
	// estimate 300, used 900: OK, -570 tokens left
	// estimate 100, used 0: ResourceExhausted, -570 tokens left
	// no tenant: InvalidArgument
}
