package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Each key gets a bucket of 10 tokens refilled at 2 per second. A Manual
// clock makes the output deterministic; production code leaves Clock nil.
func ExampleNew() {
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2},
		Clock:  clk,
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	ctx := context.Background()
	d, _ := e.Allow(ctx, "user:42", 10)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = e.Allow(ctx, "user:42", 1)
	fmt.Println(d.Allowed, d.RetryAfter)

	clk.Advance(d.RetryAfter)
	d, _ = e.Allow(ctx, "user:42", 1)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 0
	// false 500ms
	// true 0
}

// A batch is decided per shard at one clock reading, in request order; it is
// the fast path for callers that have several decisions to make at once.
func ExampleEngine_AllowBatch() {
	e, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	defer e.Close()

	reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 1}, {Key: "a", Cost: 1}, {Key: "", Cost: 1}}
	out := make([]engine.Result, len(reqs))
	if err := e.AllowBatch(context.Background(), reqs, out); err != nil {
		panic(err)
	}
	for _, r := range out {
		fmt.Println(r.Decision.Allowed, r.Decision.Remaining, r.Err)
	}
	// Output:
	// true 1 <nil>
	// true 0 <nil>
	// false 0 <nil>
	// false 0 engine: invalid key
}

// Raising a limit never hands out free tokens: a key keeps what it earned
// under the old policy up to the cutover, then refills at the new rate.
func ExampleEngine_ReplacePolicy() {
	clk := clock.NewManual(0)
	e, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2},
		Clock:  clk,
	})
	defer e.Close()
	ctx := context.Background()

	_, _ = e.Allow(ctx, "user:42", 10) // empty at t=0
	clk.Advance(500 * time.Millisecond)
	next := policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}
	if err := e.ReplacePolicy(ctx, next, 1); err != nil {
		panic(err)
	}
	// 1 token earned at 2/s before the cutover, 1 more at 4/s after it.
	clk.Advance(250 * time.Millisecond)
	d, _ := e.Allow(ctx, "user:42", 2)
	fmt.Println(d.Allowed, d.Remaining, d.Version, d.Limit)

	// A second writer holding the old version is refused.
	err := e.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1}, 1)
	fmt.Println(errors.Is(err, engine.ErrStalePolicy))
	// Output:
	// true 0 2 20
	// true
}

// EvictFull drops only buckets that are full: forgetting them changes no
// answer, while a depleted bucket is kept however old it is.
func ExampleEngine_EvictFull() {
	clk := clock.NewManual(0)
	e, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2},
		Clock:  clk,
	})
	defer e.Close()
	ctx := context.Background()

	_, _ = e.Allow(ctx, "light", 1)
	_, _ = e.Allow(ctx, "heavy", 10)
	clk.Advance(time.Second) // light is full again, heavy holds 2 tokens
	n, _ := e.EvictFull(ctx)
	fmt.Println(n, e.KeyCount())
	// Output:
	// 1 1
}

// Per-key limits: a paying tenant gets a bigger bucket, every login route a
// smaller one, everyone else the default. Each key is resolved once, when it
// is first seen, and again at each cutover; the hot path stays one lookup.
func Example_overrides() {
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "tenant:acme:*", Capacity: 1000, TokensPerSecond: 100},
		policy.Override{Match: "*:login", Capacity: 5, TokensPerSecond: 1},
		policy.Override{Match: "tenant:acme:login", Capacity: 20, TokensPerSecond: 2}, // exact beats patterns
	)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 60, TokensPerSecond: 10, Overrides: set},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	ctx := context.Background()
	for _, key := range []string{"tenant:acme:search", "tenant:acme:login", "tenant:other:login", "tenant:other:search"} {
		d, _ := e.Allow(ctx, key, 1)
		fmt.Printf("%-20s limit %4d, %4d left\n", key, d.Limit, d.Remaining)
	}
	_, err = e.Allow(ctx, "tenant:other:login", 6)
	fmt.Println(errors.Is(err, engine.ErrInvalidCost)) // above that key's own capacity
	// Output:
	// tenant:acme:search   limit 1000,  999 left
	// tenant:acme:login    limit   20,   19 left
	// tenant:other:login   limit    5,    4 left
	// tenant:other:search  limit   60,   59 left
	// true
}

// A restart that hands nobody a fresh burst: the budget a key had spent is
// saved, and the time the service was down counts as refill, no more.
func Example_restart() {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{Policy: p, Clock: clk})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	_, _ = e.Allow(ctx, "user:42", 10) // spends everything

	var saved bytes.Buffer // a file, in a real service
	if err := e.Snapshot(ctx, &saved); err != nil {
		panic(err)
	}
	_ = e.Close()

	// Three seconds later (a Manual clock's wall time is its reading).
	later := clock.NewManual(int64(3 * time.Second))
	e, report, err := engine.Restore(engine.Config{Policy: p, Clock: later}, &saved, engine.RestoreOptions{})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	fmt.Println(report.Restored, report.Elapsed)
	d, _ := e.Allow(ctx, "user:42", 1)
	fmt.Println(d.Allowed, d.Remaining) // 3 tokens earned while down, 1 spent
	// Output:
	// 1 3s
	// true 2
}

// Wait blocks until the request is admitted, like rate.Limiter.Wait, but
// never past the context's deadline.
func ExampleEngine_Wait() {
	e, err := engine.New(engine.Config{Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 20}})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()

	_, _ = e.Allow(ctx, "job", 1)   // the bucket is empty now
	d, err := e.Wait(ctx, "job", 1) // about 50 ms
	fmt.Println(d.Allowed, err)

	_, err = e.Wait(ctx, "job", 1000) // more than the capacity
	fmt.Println(errors.Is(err, engine.ErrInvalidCost))
	// Output:
	// true <nil>
	// true
}

// Stats counts every request once: allowed, denied or an error of a kind.
// After Close the counts are final.
func ExampleEngine_Stats() {
	e, err := engine.New(engine.Config{Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1}, Clock: clock.NewManual(0)})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		_, _ = e.Allow(ctx, "user:1", 1)
	}
	_, _ = e.Allow(ctx, "", 1)
	_ = e.Close()

	st := e.Stats()
	fmt.Println(st.Total.Allowed, st.Total.Denied, st.Total.Errors.InvalidKey, st.Total.Keys)
	// Output: 2 1 1 1
}

// Config.Events samples decisions for an audit trail, off the hot path.
func ExampleConfig_events() {
	var trail []string
	e, err := engine.New(engine.Config{
		Policy:     policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:      clock.NewManual(0),
		EventEvery: 2, // one decision in two; the default is one in 1,000
		Events: func(ev engine.Event) {
			trail = append(trail, fmt.Sprintf("%s cost %d allowed %v", ev.Key, ev.Cost, ev.Decision.Allowed))
		},
		Shards: 1,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 4 {
		_, _ = e.Allow(ctx, "user:1", 1)
	}
	_ = e.Close() // delivers what was sampled, then returns
	fmt.Println(strings.Join(trail, "\n"))
	// Output:
	// user:1 cost 1 allowed true
	// user:1 cost 1 allowed false
}

// Rates per any period, and several bands per key: 5 per second in bursts
// of 5, and at most 20 a day. Every band must hold the cost, and pays it;
// Decision.Band names the band that bound the answer.
func Example_bands() {
	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	if err != nil {
		panic(err)
	}
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: daily},
		Clock:  clk,
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	ctx := context.Background()
	for range 4 { // 5 a second for 4 seconds: the day's 20
		for range 5 {
			_, _ = e.Allow(ctx, "user:42", 1)
		}
		clk.Advance(time.Second)
	}
	d, _ := e.Allow(ctx, "user:42", 1)
	fmt.Println(d.Allowed, d.Band, d.RetryAfter)

	// 100 a minute, exactly: one token every 600ms.
	perMinute := policy.Policy{Version: 2, Capacity: 10, Refill: policy.PerMinute(100)}
	if err := e.ReplacePolicy(ctx, perMinute, 1); err != nil {
		panic(err)
	}
	for range 10 {
		_, _ = e.Allow(ctx, "user:7", 1)
	}
	d, _ = e.Allow(ctx, "user:7", 1)
	fmt.Println(d.Allowed, d.Band == "", d.RetryAfter)
	// Output:
	// false daily 1h11m56s
	// false true 600ms
}

// One request that must pass several limits: the user's, the tenant's and
// a global one. AllowAll admits all three or none, so a refusal by one
// spends nothing from the others.
func ExampleEngine_AllowAll() {
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "tenant:*", Capacity: 3, TokensPerSecond: 1},
		policy.Override{Match: "global", Capacity: 1000, TokensPerSecond: 100},
	)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: set},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	ctx := context.Background()
	request := func(user string) []engine.Request {
		return []engine.Request{{Key: "user:" + user, Cost: 1}, {Key: "tenant:acme", Cost: 1}, {Key: "global", Cost: 1}}
	}
	for _, user := range []string{"ann", "bob", "cid", "dee"} {
		d, i, err := e.AllowAll(ctx, request(user))
		if err != nil {
			panic(err)
		}
		fmt.Println(user, d.Allowed, i, d.RetryAfter)
	}
	d, _ := e.Peek(ctx, "user:dee")
	fmt.Println("dee still has", d.Remaining)
	// Output:
	// ann true 1 0s
	// bob true 1 0s
	// cid true 1 0s
	// dee false 1 1s
	// dee still has 10
}
