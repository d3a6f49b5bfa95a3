package policy_test

import (
	"fmt"
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// This file holds the obviously-correct model of a bucket that the fast
// 128-bit arithmetic in bucket.go is checked against. It is written straight
// from the formulas in the doc comments of Bucket.Refill, Take, RetryAfter
// and ResetAfter, in math/big, with no cleverness: if the model and the
// implementation disagree, the model is the one to believe.

var (
	bigUnitsPerToken = big.NewInt(policy.UnitsPerToken)
	bigMaxInt64      = big.NewInt(math.MaxInt64)
)

// model is a bucket as the package doc describes it: a balance in units and
// the clock reading it was last brought up to date at. It has no Tokens/Frac
// split, so it cannot share a representation bug with policy.Bucket.
type model struct {
	units *big.Int
	last  int64
}

// newModel returns the model of a bucket created full at now.
func newModel(l policy.Limit, now int64) model {
	return model{units: capUnits(l), last: now}
}

// capUnits returns capacity * 1e9.
func capUnits(l policy.Limit) *big.Int {
	return new(big.Int).Mul(big.NewInt(l.Capacity), bigUnitsPerToken)
}

// costUnits returns cost * 1e9.
func costUnits(cost int64) *big.Int {
	return new(big.Int).Mul(big.NewInt(cost), bigUnitsPerToken)
}

// unitsOf converts a policy.Bucket into its balance in units:
// Tokens * 1e9 + Frac.
func unitsOf(b policy.Bucket) *big.Int {
	u := new(big.Int).Mul(big.NewInt(b.Tokens), bigUnitsPerToken)
	return u.Add(u, new(big.Int).SetUint64(uint64(b.Frac)))
}

// modelOf converts a policy.Bucket into the model.
func modelOf(b policy.Bucket) model {
	return model{units: unitsOf(b), last: b.Last}
}

// bucketOf converts a balance in units back into a policy.Bucket with the
// given Last, and Epoch and Limit from tag: Tokens = floor(units/1e9), Frac = units mod 1e9. It
// panics if the balance is negative or its whole tokens do not fit in int64,
// which no valid bucket can reach.
func bucketOf(units *big.Int, last int64, tag policy.Bucket) policy.Bucket {
	if units.Sign() < 0 {
		panic(fmt.Sprintf("bucketOf: negative balance %v", units))
	}
	tokens, frac := new(big.Int).QuoRem(units, bigUnitsPerToken, new(big.Int))
	if !tokens.IsInt64() {
		panic(fmt.Sprintf("bucketOf: %v whole tokens overflow int64", tokens))
	}
	return policy.Bucket{Tokens: tokens.Int64(), Frac: uint32(frac.Uint64()), Last: last, Epoch: tag.Epoch, Limit: tag.Limit}
}

// bucket converts the model back into a policy.Bucket carrying epoch.
func (m model) bucket(tag policy.Bucket) policy.Bucket {
	return bucketOf(m.units, m.last, tag)
}

// refill is Bucket.Refill's formula verbatim:
//
//	units = min(capacity*1e9, units + (now-last)*rate); last = now
//
// It requires now >= last (the shard rejects clock regressions).
func (m *model) refill(l policy.Limit, now int64) {
	if now < m.last {
		panic(fmt.Sprintf("model.refill: now %d before last %d", now, m.last))
	}
	elapsed := new(big.Int).Sub(big.NewInt(now), big.NewInt(m.last))
	earned := new(big.Int).Mul(elapsed, big.NewInt(l.TokensPerSecond))
	sum := new(big.Int).Add(m.units, earned)
	m.units = bigMin(capUnits(l), sum)
	m.last = now
}

// decide is one decision: refill, admit iff units >= cost*1e9 (taking
// them), then report Remaining, RetryAfter and ResetAfter as Outcome
// defines them.
func (m *model) decide(l policy.Limit, now, cost int64) policy.Outcome {
	m.refill(l, now)
	need := costUnits(cost)
	var o policy.Outcome
	if m.units.Cmp(need) >= 0 {
		o.Allowed = true
		m.units = new(big.Int).Sub(m.units, need)
	} else {
		o.RetryAfter = ceilSat(new(big.Int).Sub(need, m.units), l.TokensPerSecond)
	}
	o.Remaining = m.remaining()
	o.ResetAfter = m.resetAfter(l)
	return o
}

// remaining is floor(units / 1e9).
func (m model) remaining() int64 {
	r := new(big.Int).Quo(m.units, bigUnitsPerToken)
	if !r.IsInt64() {
		panic(fmt.Sprintf("model.remaining: %v overflows int64", r))
	}
	return r.Int64()
}

// retryAfter is ceil((cost*1e9 - units) / rate) saturated, or 0 if the
// balance already covers cost.
func (m model) retryAfter(l policy.Limit, cost int64) int64 {
	need := costUnits(cost)
	if m.units.Cmp(need) >= 0 {
		return 0
	}
	return ceilSat(new(big.Int).Sub(need, m.units), l.TokensPerSecond)
}

// resetAfter is ceil((capacity*1e9 - units) / rate) saturated; 0 when full.
func (m model) resetAfter(l policy.Limit) int64 {
	missing := new(big.Int).Sub(capUnits(l), m.units)
	if missing.Sign() <= 0 {
		return 0
	}
	return ceilSat(missing, l.TokensPerSecond)
}

// full reports whether the balance equals capacity*1e9.
func (m model) full(l policy.Limit) bool {
	return m.units.Cmp(capUnits(l)) >= 0
}

// cutover is Bucket.Cutover's rule, applied eagerly: refill under old up to
// at, then clamp to next's capacity (never raise).
func (m *model) cutover(old, next policy.Limit, at int64) {
	m.refill(old, at)
	m.units = bigMin(capUnits(next), m.units)
}

// ceilSat returns ceil(n / d) for n >= 0 and d >= 1, saturated at
// math.MaxInt64.
func ceilSat(n *big.Int, d int64) int64 {
	return saturate(ceilBig(n, new(big.Int).SetInt64(d)))
}

// ceilBig returns ceil(n / d) for n >= 0 and d >= 1.
func ceilBig(n, d *big.Int) *big.Int {
	q, r := new(big.Int).QuoRem(n, d, new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// saturate converts x >= 0 to int64, saturating at math.MaxInt64.
func saturate(x *big.Int) int64 {
	if x.Cmp(bigMaxInt64) > 0 {
		return math.MaxInt64
	}
	return x.Int64()
}

func bigMin(a, b *big.Int) *big.Int {
	if a.Cmp(b) <= 0 {
		return new(big.Int).Set(a)
	}
	return new(big.Int).Set(b)
}

// requireValid fails if b breaks the representation invariants of a Bucket
// used with l: 0 <= Tokens <= Capacity, Frac < 1e9, and Frac == 0 when full.
func requireValid(t testing.TB, l policy.Limit, b policy.Bucket, msgAndArgs ...any) {
	t.Helper()
	require.GreaterOrEqual(t, b.Tokens, int64(0), msgAndArgs...)
	require.LessOrEqual(t, b.Tokens, l.Capacity, msgAndArgs...)
	require.Less(t, b.Frac, uint32(policy.UnitsPerToken), msgAndArgs...)
	if b.Tokens == l.Capacity {
		require.Zero(t, b.Frac, msgAndArgs...)
	}
}

// requireSame fails unless the implementation's bucket equals the model's,
// field by field (the model carries the implementation's Epoch through,
// since no function in policy may change it).
func requireSame(t testing.TB, m model, b policy.Bucket, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, m.bucket(b), b, msgAndArgs...)
	require.Zero(t, m.units.Cmp(unitsOf(b)), msgAndArgs...)
}

// TestModelConversionRoundTrip checks the converter itself, so a bug in the
// helper cannot hide a bug in the code under test.
func TestModelConversionRoundTrip(t *testing.T) {
	for _, b := range []policy.Bucket{
		{},
		{Tokens: 1},
		{Frac: 1},
		{Frac: policy.UnitsPerToken - 1},
		{Tokens: 7, Frac: 123_456_789, Last: 42, Epoch: 3},
		{Tokens: math.MaxInt64, Last: math.MaxInt64, Epoch: math.MaxUint16, Limit: math.MaxUint16},
		{Tokens: math.MaxInt64 - 1, Frac: policy.UnitsPerToken - 1},
	} {
		got := bucketOf(unitsOf(b), b.Last, b)
		require.Equal(t, b, got)
	}

	// 2^65-1 units is 36893488147 tokens and 419103231 units.
	u := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 65), big.NewInt(1))
	require.Equal(t, policy.Bucket{Tokens: 36_893_488_147, Frac: 419_103_231}, bucketOf(u, 0, policy.Bucket{}))

	require.Panics(t, func() { bucketOf(big.NewInt(-1), 0, policy.Bucket{}) })
	tooBig := new(big.Int).Mul(new(big.Int).Add(bigMaxInt64, big.NewInt(1)), bigUnitsPerToken)
	require.Panics(t, func() { bucketOf(tooBig, 0, policy.Bucket{}) })

	require.Equal(t, int64(0), ceilSat(big.NewInt(0), 3))
	require.Equal(t, int64(1), ceilSat(big.NewInt(1), 3))
	require.Equal(t, int64(1), ceilSat(big.NewInt(3), 3))
	require.Equal(t, int64(2), ceilSat(big.NewInt(4), 3))
	require.Equal(t, int64(math.MaxInt64), ceilSat(bigMaxInt64, 1))
	require.Equal(t, int64(math.MaxInt64), ceilSat(new(big.Int).Add(bigMaxInt64, big.NewInt(1)), 1))
}
