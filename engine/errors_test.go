package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Every bad input of the package doc's Units and refill and Errors sections
// and of ReplacePolicy, each with its named error, the zero Decision, and a
// following call that proves nothing changed. Names here carry an errs
// prefix because other files of this package are written alongside.

// errsClock is a Clock that a test may move backwards, which clock.Manual
// refuses to do: the engine must answer such a reading with
// ErrClockRegression.
type errsClock struct{ now atomic.Int64 }

var _ clock.Clock = (*errsClock)(nil)

func (c *errsClock) Now() int64       { return c.now.Load() }
func (c *errsClock) Set(t int64)      { c.now.Store(t) }
func newErrsClock(t int64) *errsClock { c := &errsClock{}; c.Set(t); return c }

// errsCtx names the context a call is made with.
type errsCtx int

const (
	errsLive errsCtx = iota
	errsCanceled
	errsDeadline
)

func (k errsCtx) make(t *testing.T) context.Context {
	switch k {
	case errsCanceled:
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		return ctx
	case errsDeadline:
		ctx, cancel := context.WithDeadline(t.Context(), time.Unix(0, 0))
		t.Cleanup(cancel)
		return ctx
	}
	return t.Context()
}

// Clock readings of the Allow and ReplacePolicy tables: state is set up at
// errsSetup, the bad call is made at errsLater (or errsEarlier, a regression
// for every shard that saw errsSetup), and the probe runs at errsProbe. The
// probe is before errsLater on purpose: had the bad call advanced its
// shard's observed time, the probe would get ErrClockRegression.
const (
	errsEarlier int64 = 500_000_000
	errsSetup   int64 = 1_000_000_000
	errsProbe   int64 = 1_500_000_000
	errsLater   int64 = 2_000_000_000
)

// errsAllowCase is one bad Allow. Rows are in the error order of the package
// doc's Errors section; rows that combine two faults check that the earlier
// step wins.
type errsAllowCase struct {
	name   string
	key    string
	cost   int64
	at     int64 // clock reading of the call; 0 means errsLater
	full   bool  // the engine tracks MaxKeys keys before the call
	closed bool  // the engine is closed before the call
	ctx    errsCtx
	want   error
}

var errsLongKey = strings.Repeat("x", engine.DefaultMaxKeyBytes+1)

var errsAllowCases = []errsAllowCase{
	// 1. Key, then cost: checked by the caller, before anything else.
	{name: "empty key", key: "", cost: 1, want: engine.ErrInvalidKey},
	{name: "space key", key: " ", cost: 1, want: engine.ErrInvalidKey},
	{name: "tab newline key", key: "\t\n", cost: 1, want: engine.ErrInvalidKey},
	{name: "ascii whitespace key", key: " \v\f\r\t\n ", cost: 1, want: engine.ErrInvalidKey},
	{name: "unicode whitespace key", key: "\u00a0\u2003\u3000\u0085", cost: 1, want: engine.ErrInvalidKey},
	{name: "key of MaxKeyBytes+1", key: errsLongKey, cost: 1, want: engine.ErrInvalidKey},
	{name: "invalid key with invalid cost", key: "", cost: 0, want: engine.ErrInvalidKey},
	{name: "invalid key with MinInt64 cost", key: " ", cost: math.MinInt64, want: engine.ErrInvalidKey},
	{name: "invalid key with cost above capacity", key: errsLongKey, cost: 11, want: engine.ErrInvalidKey},
	{name: "invalid key on closed engine", key: "\t", cost: 1, closed: true, want: engine.ErrInvalidKey},
	{name: "invalid key with done context", key: "", cost: 1, ctx: errsCanceled, want: engine.ErrInvalidKey},
	{name: "cost 0", key: "k", cost: 0, want: engine.ErrInvalidCost},
	{name: "cost -1", key: "k", cost: -1, want: engine.ErrInvalidCost},
	{name: "cost MinInt64", key: "k", cost: math.MinInt64, want: engine.ErrInvalidCost},
	{name: "cost 0 on a new key", key: "new", cost: 0, want: engine.ErrInvalidCost},
	{name: "invalid cost on closed engine", key: "k", cost: 0, closed: true, want: engine.ErrInvalidCost},
	{name: "invalid cost with done context", key: "k", cost: -1, ctx: errsCanceled, want: engine.ErrInvalidCost},
	{name: "invalid cost at MaxKeys", key: "new", cost: 0, full: true, want: engine.ErrInvalidCost},
	// 2. Closed.
	{name: "closed", key: "k", cost: 1, closed: true, want: engine.ErrClosed},
	{name: "closed with done context", key: "k", cost: 1, closed: true, ctx: errsCanceled, want: engine.ErrClosed},
	{name: "closed with expired deadline", key: "k", cost: 1, closed: true, ctx: errsDeadline, want: engine.ErrClosed},
	{name: "closed with cost above capacity", key: "k", cost: 11, closed: true, want: engine.ErrClosed},
	{name: "closed with clock regression", key: "k", cost: 1, at: errsEarlier, closed: true, want: engine.ErrClosed},
	{name: "closed at MaxKeys", key: "new", cost: 1, full: true, closed: true, want: engine.ErrClosed},
	// 3. Context already done.
	{name: "canceled context", key: "k", cost: 1, ctx: errsCanceled, want: context.Canceled},
	{name: "expired deadline", key: "k", cost: 1, ctx: errsDeadline, want: context.DeadlineExceeded},
	{name: "canceled context on a new key", key: "new", cost: 1, ctx: errsCanceled, want: context.Canceled},
	{name: "canceled context with cost above capacity", key: "k", cost: 11, ctx: errsCanceled, want: context.Canceled},
	{name: "canceled context with clock regression", key: "k", cost: 1, at: errsEarlier, ctx: errsCanceled, want: context.Canceled},
	{name: "expired deadline at MaxKeys", key: "new", cost: 1, full: true, ctx: errsDeadline, want: context.DeadlineExceeded},
	// 4. Cost above the capacity in force, decided by the shard.
	{name: "cost capacity+1", key: "k", cost: 11, want: engine.ErrCostExceedsCapacity},
	{name: "cost MaxInt64", key: "k", cost: math.MaxInt64, want: engine.ErrCostExceedsCapacity},
	{name: "cost above capacity on a new key", key: "new", cost: 11, want: engine.ErrCostExceedsCapacity},
	{name: "cost above capacity on a new key at MaxKeys", key: "new", cost: 11, full: true, want: engine.ErrCostExceedsCapacity},
	{name: "cost above capacity with clock regression", key: "k", cost: 11, at: errsEarlier, want: engine.ErrCostExceedsCapacity},
	// 5. Clock regression.
	{name: "clock regression", key: "k", cost: 1, at: errsEarlier, want: engine.ErrClockRegression},
	{name: "clock regression at MaxKeys", key: "k", cost: 1, at: errsEarlier, full: true, want: engine.ErrClockRegression},
	// 6. Key bound (regression before the bound, on one shard, is in
	// TestErrorsAllowOrderInOneShard: here the new key's shard is unknown).
	{name: "new key at MaxKeys", key: "new", cost: 1, full: true, want: engine.ErrKeyCapacity},
}

// errsKeyValid reports whether key passes the key check: not blank after
// strings.TrimSpace, and at most DefaultMaxKeyBytes long.
func errsKeyValid(key string) bool {
	return strings.TrimSpace(key) != "" && len(key) <= engine.DefaultMaxKeyBytes
}

// errsAllowSetup starts an engine for one row: capacity 10, 2/s, MaxKeys 2;
// "k" spent 3 of its 10 tokens at errsSetup; with full, "other" fills the
// bound.
func errsAllowSetup(t *testing.T, shards int, full bool) (*engine.Engine, *errsClock) {
	t.Helper()
	clk := newErrsClock(errsSetup)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), MaxKeys: 2, Shards: shards, Clock: clk})
	d, err := e.Allow(t.Context(), "k", 3)
	require.NoError(t, err)
	require.Equal(t, int64(7), d.Remaining)
	if full {
		_, err := e.Allow(t.Context(), "other", 1)
		require.NoError(t, err)
		require.Equal(t, 2, e.KeyCount())
	}
	return e, clk
}

// errsProbeUnchanged proves that nothing changed since errsAllowSetup: at
// errsProbe, "k" has earned exactly 1 token on top of its 7 (so its balance,
// its last reading and its shard's observed time are as set up), and
// key, unless it is "k" or invalid, is still unknown or still refused.
func errsProbeUnchanged(t *testing.T, e *engine.Engine, clk *errsClock, key string, full bool) {
	t.Helper()
	keys := e.KeyCount()
	clk.Set(errsProbe)
	d, err := e.Allow(t.Context(), "k", 1)
	require.NoError(t, err, "probe on k")
	assert.Equal(t,
		engine.Decision{Allowed: true, Remaining: 7, Version: 1, Limit: 10, ResetAfter: 1_500_000_000},
		d, "probe on k: 7 tokens at 1s plus 1 earned by 1.5s, minus 1")
	if !errsKeyValid(key) || key == "k" {
		return
	}
	d, err = e.Allow(t.Context(), key, 1)
	if full {
		// Still at the bound (nothing was created) and the key's shard did
		// not move its clock past errsProbe (that would be a regression).
		assert.ErrorIs(t, err, engine.ErrKeyCapacity, "probe on %q", key)
		assert.Equal(t, keys, e.KeyCount())
		return
	}
	require.NoError(t, err, "probe on %q", key)
	assert.Equal(t,
		engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: 500_000_000},
		d, "probe on %q: created now, full", key)
	assert.Equal(t, keys+1, e.KeyCount())
}

func TestErrorsAllow(t *testing.T) {
	for _, tc := range errsAllowCases {
		t.Run(tc.name, func(t *testing.T) {
			behavEachShards(t, func(t *testing.T, shards int) {
				e, clk := errsAllowSetup(t, shards, tc.full)
				keys := e.KeyCount()
				at := tc.at
				if at == 0 {
					at = errsLater
				}
				clk.Set(at)
				if tc.closed {
					require.NoError(t, e.Close())
				}

				d, err := e.Allow(tc.ctx.make(t), tc.key, tc.cost)
				require.ErrorIs(t, err, tc.want, "Allow(%q, %d)", tc.key, tc.cost)
				assert.Zero(t, d, "an error comes with the zero Decision")
				assert.Equal(t, keys, e.KeyCount(), "key count after the error")
				assert.Equal(t, pol(1, 10, 2), e.Policy())
				if tc.closed {
					return
				}
				errsProbeUnchanged(t, e, clk, tc.key, tc.full)
			})
		})
	}
}

// TestErrorsAllowBatch plays every row of the Allow table as a batch of one
// request: the request gets the same error in its Result, and the batch
// returns nil unless the request could not reach its shard.
func TestErrorsAllowBatch(t *testing.T) {
	for _, tc := range errsAllowCases {
		t.Run(tc.name, func(t *testing.T) {
			behavEachShards(t, func(t *testing.T, shards int) {
				e, clk := errsAllowSetup(t, shards, tc.full)
				keys := e.KeyCount()
				at := tc.at
				if at == 0 {
					at = errsLater
				}
				clk.Set(at)
				if tc.closed {
					require.NoError(t, e.Close())
				}

				out := []engine.Result{{Decision: engine.Decision{Remaining: 42}, Err: errors.New("untouched")}}
				err := e.AllowBatch(tc.ctx.make(t), []engine.Request{{Key: tc.key, Cost: tc.cost}}, out)
				require.ErrorIs(t, out[0].Err, tc.want, "AllowBatch(%q, %d)", tc.key, tc.cost)
				assert.Zero(t, out[0].Decision, "an error comes with the zero Decision")
				checkedByCaller := !errsKeyValid(tc.key) || tc.cost < 1
				switch {
				case checkedByCaller && tc.closed:
					// No part was sent, but a call after Close still says so.
					assert.ErrorIs(t, err, engine.ErrClosed, "AllowBatch return")
				case checkedByCaller && tc.ctx != errsLive:
					// Likewise a done context, as for Allow.
					assert.True(t, errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded),
						"AllowBatch return %v, want the context's error", err)
				case tc.want == engine.ErrClosed || errors.Is(tc.want, context.Canceled) || errors.Is(tc.want, context.DeadlineExceeded):
					assert.ErrorIs(t, err, tc.want, "AllowBatch return")
				default:
					assert.NoError(t, err, "per-request errors are only in out[i].Err")
				}
				assert.Equal(t, keys, e.KeyCount(), "key count after the error")
				if tc.closed {
					return
				}
				errsProbeUnchanged(t, e, clk, tc.key, tc.full)
			})
		})
	}
}

// TestErrorsAllowOrderInOneShard checks steps 4 to 6 against each other
// where they need the same shard: with one shard, every key shares the
// observed time.
func TestErrorsAllowOrderInOneShard(t *testing.T) {
	clk := newErrsClock(errsSetup)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), MaxKeys: 2, Shards: 1, Clock: clk})
	for _, k := range []string{"a", "b"} {
		_, err := e.Allow(t.Context(), k, 3)
		require.NoError(t, err)
	}
	clk.Set(errsEarlier)
	for _, tc := range []struct {
		name string
		key  string
		cost int64
		want error
	}{
		{"cost above capacity before regression, new key at MaxKeys", "new", 11, engine.ErrCostExceedsCapacity},
		{"regression before key bound", "new", 1, engine.ErrClockRegression},
		{"regression on a known key", "a", 1, engine.ErrClockRegression},
	} {
		d, err := e.Allow(t.Context(), tc.key, tc.cost)
		require.ErrorIs(t, err, tc.want, tc.name)
		assert.Zero(t, d, tc.name)
		assert.Equal(t, 2, e.KeyCount(), tc.name)
	}
	clk.Set(errsSetup)
	d, err := e.Allow(t.Context(), "new", 1)
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	assert.Zero(t, d)
	d, err = e.Allow(t.Context(), "a", 1)
	require.NoError(t, err)
	assert.Equal(t, engine.Decision{Allowed: true, Remaining: 6, Version: 1, Limit: 10, ResetAfter: 2 * time.Second}, d)
}

func TestErrorsKeyLength(t *testing.T) {
	for _, tc := range []struct {
		maxKeyBytes int // 0: the default, 256
		ok, bad     string
	}{
		{0, strings.Repeat("k", 256), strings.Repeat("k", 257)},
		{1, "k", "kk"},
		{8, "12345678", "123456789"},
		{3, "aé", "éé"}, // bytes, not runes: "éé" is 2 runes but 4 bytes
		{4, " a\t", "  a  "},
	} {
		t.Run(fmt.Sprintf("MaxKeyBytes=%d", tc.maxKeyBytes), func(t *testing.T) {
			behavEachShards(t, func(t *testing.T, shards int) {
				e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), MaxKeyBytes: tc.maxKeyBytes, Shards: shards})
				d, err := e.Allow(t.Context(), tc.bad, 1)
				require.ErrorIs(t, err, engine.ErrInvalidKey, "%d bytes", len(tc.bad))
				assert.Zero(t, d)
				assert.Zero(t, e.KeyCount())

				d, err = e.Allow(t.Context(), tc.ok, 1)
				require.NoError(t, err, "%d bytes", len(tc.ok))
				assert.Equal(t, engine.Decision{Allowed: true, Remaining: 9, Version: 1, Limit: 10, ResetAfter: 500_000_000}, d)
				assert.Equal(t, 1, e.KeyCount())
			})
		})
	}
}

// TestErrorsCostFollowsPolicy checks that "above capacity" is judged against
// the policy in force, and that every cost from 1 to Capacity is legal, up to
// math.MaxInt64.
func TestErrorsCostFollowsPolicy(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		d, err := e.Allow(t.Context(), "a", 10)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		d, err = e.Allow(t.Context(), "b", 20)
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		assert.Zero(t, d)

		clk.Set(1)
		require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 20, 2), 1))
		d, err = e.Allow(t.Context(), "b", 20)
		require.NoError(t, err)
		assert.Equal(t, engine.Decision{Allowed: true, Version: 2, Limit: 20, ResetAfter: 10 * time.Second}, d)

		require.NoError(t, e.ReplacePolicy(t.Context(), pol(3, 5, 2), 2))
		d, err = e.Allow(t.Context(), "c", 6)
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		assert.Zero(t, d)

		require.NoError(t, e.ReplacePolicy(t.Context(), pol(4, math.MaxInt64, math.MaxInt64), 3))
		d, err = e.Allow(t.Context(), "max", math.MaxInt64)
		require.NoError(t, err)
		assert.Equal(t, engine.Decision{Allowed: true, Version: 4, Limit: math.MaxInt64, ResetAfter: 1_000_000_000}, d)
	})
}

// TestNewWithoutPolicySaysSo: a Config with no Policy at all is told so,
// not that its policy's version 0 is too low.
func TestNewWithoutPolicySaysSo(t *testing.T) {
	_, err := engine.New(engine.Config{MaxKeys: 10})
	require.ErrorIs(t, err, engine.ErrInvalidPolicy)
	require.EqualError(t, err, "policy: invalid: Config.Policy is not set, and it is required")
}

func TestErrorsNew(t *testing.T) {
	valid := pol(1, 10, 2)
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		want error
	}{
		{"zero policy", engine.Config{}, engine.ErrInvalidPolicy},
		{"version 0", engine.Config{Policy: pol(0, 10, 2)}, engine.ErrInvalidPolicy},
		{"version -1", engine.Config{Policy: pol(-1, 10, 2)}, engine.ErrInvalidPolicy},
		{"version MinInt64", engine.Config{Policy: pol(math.MinInt64, 10, 2)}, engine.ErrInvalidPolicy},
		{"capacity 0", engine.Config{Policy: pol(1, 0, 2)}, engine.ErrInvalidPolicy},
		{"capacity -1", engine.Config{Policy: pol(1, -1, 2)}, engine.ErrInvalidPolicy},
		{"capacity MinInt64", engine.Config{Policy: pol(1, math.MinInt64, 2)}, engine.ErrInvalidPolicy},
		{"rate 0", engine.Config{Policy: pol(1, 10, 0)}, engine.ErrInvalidPolicy},
		{"rate -1", engine.Config{Policy: pol(1, 10, -1)}, engine.ErrInvalidPolicy},
		{"rate MinInt64", engine.Config{Policy: pol(1, 10, math.MinInt64)}, engine.ErrInvalidPolicy},
		{"all negative", engine.Config{Policy: pol(-1, -1, -1)}, engine.ErrInvalidPolicy},
		{"MaxKeys -1", engine.Config{Policy: valid, MaxKeys: -1}, engine.ErrInvalidConfig},
		{"MaxKeys MinInt", engine.Config{Policy: valid, MaxKeys: math.MinInt}, engine.ErrInvalidConfig},
		{"Shards -1", engine.Config{Policy: valid, Shards: -1}, engine.ErrInvalidConfig},
		{"Shards MinInt", engine.Config{Policy: valid, Shards: math.MinInt}, engine.ErrInvalidConfig},
		{"MaxKeyBytes -1", engine.Config{Policy: valid, MaxKeyBytes: -1}, engine.ErrInvalidConfig},
		// make would panic: New answers an error instead
		{"Shards MaxInt", engine.Config{Policy: valid, Shards: math.MaxInt}, engine.ErrInvalidConfig},
		{"Shards 65537", engine.Config{Policy: valid, Shards: 1<<16 + 1}, engine.ErrInvalidConfig},
		{"EventBuffer MaxInt", engine.Config{Policy: valid, Events: func(engine.Event) {}, EventBuffer: math.MaxInt}, engine.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.Clock == nil {
				tc.cfg.Clock = clock.NewManual(0)
			}
			e, err := engine.New(tc.cfg)
			if e != nil {
				_ = e.Close() // so a wrong answer fails here, not in goleak
			}
			require.ErrorIs(t, err, tc.want)
			assert.Nil(t, e)
			if tc.want == engine.ErrInvalidPolicy {
				assert.ErrorIs(t, err, policy.ErrInvalid)
			}
		})
	}
}

func TestErrorsValues(t *testing.T) {
	assert.Equal(t, policy.ErrInvalid, engine.ErrInvalidPolicy, "ErrInvalidPolicy is policy.ErrInvalid")
	all := []error{
		engine.ErrInvalidKey, engine.ErrInvalidCost, engine.ErrKeyCapacity, engine.ErrStalePolicy,
		engine.ErrClockRegression, engine.ErrClosed, engine.ErrInvalidConfig, engine.ErrInvalidPolicy,
		engine.ErrNilContext, engine.ErrNotInitialized,
	}
	for i, a := range all {
		require.Error(t, a)
		for j, b := range all {
			assert.Equal(t, i == j, errors.Is(a, b), "errors.Is(%v, %v)", a, b)
		}
	}
}

// errsReplaceCase is one bad ReplacePolicy against an engine whose policy in
// force is version 3. Rows are in the error order ReplacePolicy documents.
type errsReplaceCase struct {
	name     string
	next     policy.Policy
	expected int64
	closed   bool
	ctx      errsCtx
	want     error
}

var errsReplaceCases = []errsReplaceCase{
	// Invalid next, even when also stale, closed or canceled.
	{name: "version 0", next: pol(0, 20, 4), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "version -1", next: pol(-1, 20, 4), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "version 0 with wrong expectedVersion", next: pol(0, 20, 4), expected: 7, want: engine.ErrInvalidPolicy},
	{name: "version -1 with wrong expectedVersion", next: pol(-1, 20, 4), expected: 0, want: engine.ErrInvalidPolicy},
	{name: "version MinInt64", next: pol(math.MinInt64, 20, 4), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "capacity 0", next: pol(4, 0, 4), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "capacity -1", next: pol(4, -1, 4), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "rate 0", next: pol(4, 20, 0), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "rate -1", next: pol(4, 20, -1), expected: 3, want: engine.ErrInvalidPolicy},
	{name: "zero policy", next: policy.Policy{}, expected: 3, want: engine.ErrInvalidPolicy},
	{name: "invalid and stale", next: pol(2, 0, 4), expected: 2, want: engine.ErrInvalidPolicy},
	{name: "invalid on closed engine", next: pol(0, 20, 4), expected: 3, closed: true, want: engine.ErrInvalidPolicy},
	{name: "invalid with done context", next: pol(4, 20, 0), expected: 3, ctx: errsCanceled, want: engine.ErrInvalidPolicy},
	{name: "invalid, closed, done context", next: pol(4, -5, 4), expected: 3, closed: true, ctx: errsDeadline, want: engine.ErrInvalidPolicy},
	// Closed.
	{name: "closed", next: pol(4, 20, 4), expected: 3, closed: true, want: engine.ErrClosed},
	{name: "closed and stale", next: pol(3, 20, 4), expected: 2, closed: true, want: engine.ErrClosed},
	{name: "closed with done context", next: pol(4, 20, 4), expected: 3, closed: true, ctx: errsCanceled, want: engine.ErrClosed},
	// Context done.
	{name: "canceled context", next: pol(4, 20, 4), expected: 3, ctx: errsCanceled, want: context.Canceled},
	{name: "expired deadline", next: pol(4, 20, 4), expected: 3, ctx: errsDeadline, want: context.DeadlineExceeded},
	{name: "canceled context and stale", next: pol(2, 20, 4), expected: 1, ctx: errsCanceled, want: context.Canceled},
	// Stale.
	{name: "expectedVersion below current", next: pol(4, 20, 4), expected: 2, want: engine.ErrStalePolicy},
	{name: "expectedVersion above current", next: pol(5, 20, 4), expected: 4, want: engine.ErrStalePolicy},
	{name: "expectedVersion 0", next: pol(4, 20, 4), expected: 0, want: engine.ErrStalePolicy},
	{name: "expectedVersion -1", next: pol(4, 20, 4), expected: -1, want: engine.ErrStalePolicy},
	{name: "next version equals current", next: pol(3, 20, 4), expected: 3, want: engine.ErrStalePolicy},
	{name: "next version equals current, same policy", next: pol(3, 10, 2), expected: 3, want: engine.ErrStalePolicy},
	{name: "next version below current", next: pol(2, 20, 4), expected: 3, want: engine.ErrStalePolicy},
	{name: "next version 1", next: pol(1, 20, 4), expected: 3, want: engine.ErrStalePolicy},
}

func TestErrorsReplacePolicy(t *testing.T) {
	current := pol(3, 10, 2)
	for _, tc := range errsReplaceCases {
		t.Run(tc.name, func(t *testing.T) {
			behavEachShards(t, func(t *testing.T, shards int) {
				clk := newErrsClock(errsSetup)
				e, _ := newEngine(t, engine.Config{Policy: current, Shards: shards, Clock: clk})
				d, err := e.Allow(t.Context(), "k", 3)
				require.NoError(t, err)
				require.Equal(t, int64(7), d.Remaining)
				clk.Set(errsLater)
				if tc.closed {
					require.NoError(t, e.Close())
				}

				err = e.ReplacePolicy(tc.ctx.make(t), tc.next, tc.expected)
				require.ErrorIs(t, err, tc.want, "ReplacePolicy(%+v, %d)", tc.next, tc.expected)
				if tc.want == engine.ErrInvalidPolicy {
					assert.ErrorIs(t, err, policy.ErrInvalid)
				}
				assert.Equal(t, current, e.Policy(), "policy after a failed ReplacePolicy")
				assert.Equal(t, 1, e.KeyCount())
				if tc.closed {
					return
				}

				// At errsProbe, before the failed call's reading: k refilled
				// under the old policy from its setup, no cutover at errsLater.
				clk.Set(errsProbe)
				d, err = e.Allow(t.Context(), "k", 1)
				require.NoError(t, err)
				assert.Equal(t,
					engine.Decision{Allowed: true, Remaining: 7, Version: 3, Limit: 10, ResetAfter: 1_500_000_000}, d)
				d, err = e.Allow(t.Context(), "fresh", 10)
				require.NoError(t, err)
				assert.Equal(t,
					engine.Decision{Allowed: true, Remaining: 0, Version: 3, Limit: 10, ResetAfter: 5 * time.Second}, d,
					"a new key starts at the old capacity")

				// The coordinator was released and no shard is left waiting
				// for a publish: a correct call goes through everywhere.
				require.NoError(t, e.ReplacePolicy(t.Context(), pol(4, 20, 4), 3))
				d, err = e.Allow(t.Context(), "k", 1)
				require.NoError(t, err)
				assert.Equal(t,
					engine.Decision{Allowed: true, Remaining: 6, Version: 4, Limit: 20, ResetAfter: 3_500_000_000}, d)
			})
		})
	}
}

// TestErrorsClockRegression moves a clock backwards under one key's shard:
// Allow, EvictFull and ReplacePolicy answer ErrClockRegression and change
// nothing, including the observed time.
func TestErrorsClockRegression(t *testing.T) {
	const (
		seen   int64 = 10_000_000_000 // the reading k's shard acted on
		before int64 = 9_000_000_000
	)
	behavEachShards(t, func(t *testing.T, shards int) {
		clk := newErrsClock(seen)
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards, Clock: clk})
		d, err := e.Allow(t.Context(), "k", 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)

		clk.Set(before)
		d, err = e.Allow(t.Context(), "k", 1)
		require.ErrorIs(t, err, engine.ErrClockRegression)
		assert.Zero(t, d)

		n, err := e.EvictFull(t.Context())
		require.ErrorIs(t, err, engine.ErrClockRegression)
		assert.Zero(t, n)
		assert.Equal(t, 1, e.KeyCount())

		err = e.ReplacePolicy(t.Context(), pol(2, 20, 4), 1)
		require.ErrorIs(t, err, engine.ErrClockRegression)
		assert.Equal(t, pol(1, 10, 2), e.Policy())

		// None of the failures moved the observed time back to 9s: one
		// nanosecond before 10s is still a regression.
		clk.Set(seen - 1)
		d, err = e.Allow(t.Context(), "k", 1)
		require.ErrorIs(t, err, engine.ErrClockRegression)
		assert.Zero(t, d)

		// At 10.5s k holds the 1 token it earned under the old policy since
		// 10s: no cutover happened, no balance moved.
		clk.Set(seen + 500_000_000)
		d, err = e.Allow(t.Context(), "k", 1)
		require.NoError(t, err)
		assert.Equal(t, engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5 * time.Second}, d)

		// No shard was left prepared by the aborted cutover.
		require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 20, 4), 1))
		d, err = e.Allow(t.Context(), "k", 1)
		require.NoError(t, err)
		assert.Equal(t, int64(2), d.Version)
	})
}

// TestErrorsClockRegressionSweepOneShard shows that a sweep refused for a
// regression evicts nothing, even a bucket that is full: with one shard,
// both keys share the observed time.
func TestErrorsClockRegressionSweepOneShard(t *testing.T) {
	clk := newErrsClock(errsSetup)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 1, Clock: clk})
	_, err := e.Allow(t.Context(), "full", 1) // full again at 1.5s
	require.NoError(t, err)
	clk.Set(10 * errsSetup)
	_, err = e.Allow(t.Context(), "empty", 10)
	require.NoError(t, err)

	clk.Set(5 * errsSetup)
	n, err := e.EvictFull(t.Context())
	require.ErrorIs(t, err, engine.ErrClockRegression)
	assert.Zero(t, n)
	assert.Equal(t, 2, e.KeyCount())

	clk.Set(10 * errsSetup)
	n, err = e.EvictFull(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the full key goes")
	assert.Equal(t, 1, e.KeyCount())
}

// TestErrorsClockRegressionSweepOtherShards: a regression on one shard ends
// that shard's pass only. The shards after it are still swept, their full
// buckets counted, and EvictFull returns ErrClockRegression once they are
// done: the first shard's regression does not cost the others their sweep.
func TestErrorsClockRegressionSweepOtherShards(t *testing.T) {
	clk := newErrsClock(errsSetup)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 2, Clock: clk})
	keyOn := func(shard int) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("k%d", i); e.ShardOf(k) == shard {
				return k
			}
		}
	}
	// Shards are swept in order: ahead's shard first.
	ahead, behind := keyOn(0), keyOn(1)
	_, err := e.Allow(t.Context(), behind, 1) // full again at 1.5s; its shard saw only 1s
	require.NoError(t, err)
	clk.Set(10 * errsSetup)
	_, err = e.Allow(t.Context(), ahead, 10) // its shard saw 10s
	require.NoError(t, err)

	clk.Set(5 * errsSetup) // before shard 0's reading, after shard 1's
	n, err := e.EvictFull(t.Context())
	require.ErrorIs(t, err, engine.ErrClockRegression)
	assert.Equal(t, 1, n, "shard 1 swept its full key all the same")
	assert.Equal(t, 1, e.KeyCount(), "the depleted key stays")
}

func TestErrorsKeyCapacity(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), MaxKeys: 2, Shards: shards})
		for _, k := range []string{"a", "b"} {
			d, err := e.Allow(t.Context(), k, 4)
			require.NoError(t, err)
			require.Equal(t, int64(6), d.Remaining)
		}
		for range 3 {
			d, err := e.Allow(t.Context(), "c", 1)
			require.ErrorIs(t, err, engine.ErrKeyCapacity)
			assert.Zero(t, d)
			assert.Equal(t, 2, e.KeyCount())
		}
		// Existing keys keep working, with their balances.
		for _, k := range []string{"a", "b"} {
			d, err := e.Allow(t.Context(), k, 1)
			require.NoError(t, err)
			assert.Equal(t, engine.Decision{Allowed: true, Remaining: 5, Version: 1, Limit: 10, ResetAfter: 2_500_000_000}, d, k)
		}
		out := make([]engine.Result, 3)
		require.NoError(t, e.AllowBatch(t.Context(), []engine.Request{{Key: "a", Cost: 1}, {Key: "c", Cost: 1}, {Key: "b", Cost: 1}}, out))
		assert.Equal(t, engine.Result{Decision: engine.Decision{Allowed: true, Remaining: 4, Version: 1, Limit: 10, ResetAfter: 3 * time.Second}}, out[0])
		assert.ErrorIs(t, out[1].Err, engine.ErrKeyCapacity)
		assert.Zero(t, out[1].Decision)
		assert.Equal(t, engine.Result{Decision: engine.Decision{Allowed: true, Remaining: 4, Version: 1, Limit: 10, ResetAfter: 3 * time.Second}}, out[2])
		assert.Equal(t, 2, e.KeyCount())

		// Once a slot is free, the refused key can be created.
		clk.Set(3 * time.Second.Nanoseconds())
		n, err := e.EvictFull(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, n)
		d, err := e.Allow(t.Context(), "c", 1)
		require.NoError(t, err)
		assert.Equal(t, int64(9), d.Remaining)
	})
}

func TestErrorsAllowBatchShortOut(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		reqs := []engine.Request{{Key: "a", Cost: 3}, {Key: "b", Cost: 3}, {Key: "c", Cost: 3}}
		sentinel := errors.New("untouched")
		untouched := engine.Result{Decision: engine.Decision{Remaining: 42}, Err: sentinel}
		for _, n := range []int{0, 1, 2} {
			var out []engine.Result
			if n > 0 {
				out = make([]engine.Result, n)
				for i := range out {
					out[i] = untouched
				}
			}
			err := e.AllowBatch(t.Context(), reqs, out)
			require.ErrorIs(t, err, engine.ErrInvalidConfig, "len(out) %d", n)
			for i := range out {
				assert.Equal(t, untouched, out[i], "len(out) %d: out[%d]", n, i)
			}
			assert.Zero(t, e.KeyCount(), "len(out) %d", n)
		}
		// Nothing was decided: every key still starts full.
		for _, r := range reqs {
			d, err := e.Allow(t.Context(), r.Key, r.Cost)
			require.NoError(t, err)
			assert.Equal(t, int64(7), d.Remaining, r.Key)
		}
	})
}

// TestErrorsEvictFull covers EvictFull's own errors: a done context evicts
// nothing, and the engine goes on.
func TestErrorsEvictFull(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, clk := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		for i := range 8 {
			_, err := e.Allow(t.Context(), fmt.Sprintf("key-%d", i), 1)
			require.NoError(t, err)
		}
		clk.Set(time.Second.Nanoseconds()) // every key is full again
		for _, k := range []errsCtx{errsCanceled, errsDeadline} {
			n, err := e.EvictFull(k.make(t))
			require.ErrorIs(t, err, []error{nil, context.Canceled, context.DeadlineExceeded}[k])
			assert.Zero(t, n)
			assert.Equal(t, 8, e.KeyCount())
		}
		n, err := e.EvictFull(t.Context())
		require.NoError(t, err)
		assert.Equal(t, 8, n)
		assert.Zero(t, e.KeyCount())
	})
}

func TestErrorsAfterClose(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: shards})
		for _, k := range []string{"a", "b", "c"} {
			_, err := e.Allow(t.Context(), k, 1)
			require.NoError(t, err)
		}
		require.NoError(t, e.Close())
		require.NoError(t, e.Close(), "a second Close")

		for _, tc := range []struct {
			name string
			ctx  errsCtx
			key  string
			cost int64
			want error
		}{
			{"known key", errsLive, "a", 1, engine.ErrClosed},
			{"new key", errsLive, "z", 1, engine.ErrClosed},
			{"done context", errsCanceled, "a", 1, engine.ErrClosed},
			{"cost above capacity", errsLive, "a", 11, engine.ErrClosed},
			{"invalid key", errsLive, "", 1, engine.ErrInvalidKey},
			{"invalid cost", errsLive, "a", 0, engine.ErrInvalidCost},
		} {
			d, err := e.Allow(tc.ctx.make(t), tc.key, tc.cost)
			assert.ErrorIs(t, err, tc.want, "Allow: %s", tc.name)
			assert.Zero(t, d, "Allow: %s", tc.name)
		}

		reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "", Cost: 1}, {Key: "a", Cost: 0}, {Key: "a", Cost: 11}, {Key: "new", Cost: 1}, {Key: " ", Cost: 0}}
		want := []error{engine.ErrClosed, engine.ErrInvalidKey, engine.ErrInvalidCost, engine.ErrClosed, engine.ErrClosed, engine.ErrInvalidKey}
		out := make([]engine.Result, len(reqs))
		require.ErrorIs(t, e.AllowBatch(t.Context(), reqs, out), engine.ErrClosed)
		for i := range reqs {
			assert.ErrorIs(t, out[i].Err, want[i], "AllowBatch out[%d] %+v", i, reqs[i])
			assert.Zero(t, out[i].Decision, "AllowBatch out[%d]", i)
		}

		n, err := e.EvictFull(t.Context())
		assert.ErrorIs(t, err, engine.ErrClosed)
		assert.Zero(t, n)
		assert.ErrorIs(t, e.ReplacePolicy(t.Context(), pol(2, 20, 4), 1), engine.ErrClosed)

		assert.Equal(t, 3, e.KeyCount(), "KeyCount still answers")
		assert.Equal(t, pol(1, 10, 2), e.Policy(), "Policy still answers")
		require.NoError(t, e.Close(), "a third Close")
	})
}
