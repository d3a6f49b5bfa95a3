package admissiontest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Durations the worked examples use, in nanoseconds of the Manual clock.
const (
	ms     = int64(time.Millisecond)
	second = int64(time.Second)
)

// pol builds a policy without field names cluttering every table row.
func pol(version, capacity, rate int64) policy.Policy {
	return policy.Policy{Version: version, Capacity: capacity, TokensPerSecond: rate}
}

// withOverrides returns p carrying the set built from os, failing t if the
// set is invalid (a bug in the suite, not in the subject).
func withOverrides(t *testing.T, p policy.Policy, os ...policy.Override) policy.Policy {
	t.Helper()
	set, err := policy.NewOverrideSet(os...)
	require.NoError(t, err, "building the override set %+v", os)
	p.Overrides = set
	return p
}

// allowed builds the Decision of an admitted request, so tables state only
// the numbers that matter.
func allowed(remaining int64, p policy.Policy, limit int64, resetAfter time.Duration) engine.Decision {
	return engine.Decision{Allowed: true, Remaining: remaining, Version: p.Version, Limit: limit, ResetAfter: resetAfter}
}

// denied builds the Decision of a refused request.
func denied(remaining int64, retryAfter time.Duration, p policy.Policy, limit int64, resetAfter time.Duration) engine.Decision {
	return engine.Decision{Remaining: remaining, RetryAfter: retryAfter, Version: p.Version, Limit: limit, ResetAfter: resetAfter}
}

// mustAllow calls Allow with a live context and fails the test on an error,
// which every caller of it expects never to happen.
func mustAllow(t *testing.T, a engine.Admitter, key string, cost int64, what string) engine.Decision {
	t.Helper()
	d, err := a.Allow(t.Context(), key, cost)
	require.NoError(t, err, "%s: Allow(%s, %d)", what, fmtKey(key), cost)
	return d
}

// expectAllow requires Allow(key, cost) to answer exactly want.
func expectAllow(t *testing.T, a engine.Admitter, key string, cost int64, want engine.Decision, what string) {
	t.Helper()
	d, err := a.Allow(t.Context(), key, cost)
	require.NoError(t, err, "%s: Allow(%s, %d)", what, fmtKey(key), cost)
	require.Equal(t, want, d, "%s: Allow(%s, %d) decided wrongly", what, fmtKey(key), cost)
}

// expectAllowErr requires Allow(ctx, key, cost) to fail with want and the
// zero Decision, as every error must come.
func expectAllowErr(t *testing.T, ctx context.Context, a engine.Admitter, key string, cost int64, want error, what string) {
	t.Helper()
	d, err := a.Allow(ctx, key, cost)
	require.ErrorIs(t, err, want, "%s: Allow(%s, %d) returned the wrong error", what, fmtKey(key), cost)
	require.Zero(t, d, "%s: Allow(%s, %d) failed with %v but returned a non-zero Decision", what, fmtKey(key), cost, err)
}

// mustEvict calls EvictFull with a live context and requires count n.
func mustEvict(t *testing.T, a engine.Admitter, n int, what string) {
	t.Helper()
	got, err := a.EvictFull(t.Context())
	require.NoError(t, err, "%s: EvictFull", what)
	require.Equal(t, n, got, "%s: EvictFull removed the wrong number of keys", what)
}

// mustReplace calls ReplacePolicy with a live context and requires success
// and that Policy then reports next.
func mustReplace(t *testing.T, a engine.Admitter, next policy.Policy, expected int64, what string) {
	t.Helper()
	require.NoError(t, a.ReplacePolicy(t.Context(), next, expected), "%s: ReplacePolicy(%+v, %d)", what, next, expected)
	requirePolicy(t, next, a.Policy(), "%s: Policy() after a successful ReplacePolicy", what)
}

// requirePolicy requires got to be want, as it was given: a rate given as
// Refill stays a Refill. Bands and Overrides are compared by content, not
// by pointer: a store that keeps its policy elsewhere may rebuild an equal
// set when it reads the policy back, and that is still the policy.
func requirePolicy(t *testing.T, want, got policy.Policy, msg string, args ...any) {
	t.Helper()
	require.Equal(t,
		[]int64{want.Version, want.Capacity, want.TokensPerSecond},
		[]int64{got.Version, got.Capacity, got.TokensPerSecond},
		append([]any{msg + ": Version, Capacity, TokensPerSecond"}, args...)...)
	require.Equal(t, want.Refill, got.Refill, append([]any{msg + ": Refill"}, args...)...)
	require.Equal(t, want.Bands.Bands(), got.Bands.Bands(), append([]any{msg + ": Bands"}, args...)...)
	require.Equal(t, want.Overrides.Overrides(), got.Overrides.Overrides(),
		append([]any{msg + ": Overrides"}, args...)...)
}

// doneContext is one way a context is already over when a call starts, and
// the error it must produce.
type doneContext struct {
	name string
	make func(t *testing.T) context.Context
	want error
}

// doneContexts are canceled and past its deadline. The deadline is in the
// wall clock's past, which needs no waiting: the subject reads its own time
// from the Manual clock, the context package from the wall.
var doneContexts = []doneContext{
	{"canceled", func(t *testing.T) context.Context {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		return ctx
	}, context.Canceled},
	{"past deadline", func(t *testing.T) context.Context {
		ctx, cancel := context.WithDeadline(t.Context(), time.Unix(0, 0))
		t.Cleanup(cancel)
		return ctx
	}, context.DeadlineExceeded},
}

// garbage is what an out slice holds before AllowBatch: every field wrong
// and an error no subject returns, so a result left unwritten, or written
// where it must not be, cannot pass for a correct one.
var garbage = engine.Result{
	Decision: engine.Decision{Allowed: true, Remaining: -77, RetryAfter: 1, Version: -5, Limit: -9, ResetAfter: 3},
	Err:      errors.New("admissiontest: garbage, never written by a subject"),
}

// garbageOut returns n results, all garbage.
func garbageOut(n int) []engine.Result {
	out := make([]engine.Result, n)
	for i := range out {
		out[i] = garbage
	}
	return out
}
