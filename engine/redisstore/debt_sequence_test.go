package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

type peeker interface {
	engine.Admitter
	Peek(ctx context.Context, key string) (engine.Decision, error)
}

func debtSequence(t *testing.T, a peeker, clk *clock.Manual) {
	ctx := context.Background()
	s := time.Second
	chk := func(what string, d engine.Decision, err error, want engine.Decision) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if d != want {
			t.Errorf("%s:\n got %+v\nwant %+v", what, d, want)
		}
	}
	d, err := a.Charge(ctx, "k", 16)
	chk("charge 16", d, err, engine.Decision{Allowed: true, Remaining: -6, Version: 1, Limit: 10, ResetAfter: 16 * s})
	clk.Set(int64(s / 2))
	d, err = a.Peek(ctx, "k")
	chk("peek", d, err, engine.Decision{Remaining: -6, RetryAfter: 6500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 15500 * time.Millisecond})
	d, err = a.Allow(ctx, "k", 1)
	chk("allow", d, err, engine.Decision{Remaining: -6, RetryAfter: 6500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 15500 * time.Millisecond})
	d, err = a.Charge(ctx, "k", 1)
	chk("charge 1", d, err, engine.Decision{Allowed: true, Remaining: -7, Version: 1, Limit: 10, ResetAfter: 16500 * time.Millisecond})
	d, err = a.Refund(ctx, "k", 3)
	chk("refund 3", d, err, engine.Decision{Remaining: -4, RetryAfter: 4500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 13500 * time.Millisecond})
	if err := a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 3, TokensPerSecond: 1}, 1); err != nil {
		t.Fatal(err)
	}
	d, err = a.Peek(ctx, "k")
	chk("peek after cutover", d, err, engine.Decision{Remaining: -3, RetryAfter: 4 * s, Version: 2, Limit: 3, ResetAfter: 6 * s})
	n, err := a.EvictFull(ctx)
	if err != nil || n != 0 {
		t.Errorf("evict: %d %v", n, err)
	}
	d, err = a.Refund(ctx, "k", 100)
	chk("refund 100", d, err, engine.Decision{Allowed: true, Remaining: 3, Version: 2, Limit: 3})
}

// TestDebtSequenceBothBackends: a fractional debt on the engine and the
// store reads the same: Remaining floored (-5.5 is -6), RetryAfter and
// ResetAfter counting the repayment, a Charge and a Refund while in debt,
// a cutover clamping to the new floor, EvictFull keeping the key, and a
// Refund capped at capacity.
func TestDebtSequenceBothBackends(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	t.Run("engine", func(t *testing.T) {
		clk := clock.NewManual(0)
		e, err := engine.New(engine.Config{Policy: p, Clock: clk, Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		debtSequence(t, e, clk)
	})
	t.Run("store", func(t *testing.T) {
		clk := clock.NewManual(0)
		debtSequence(t, newStore(t, redisstore.Config{Policy: p}, clk), clk)
	})
}
