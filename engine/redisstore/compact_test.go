package redisstore_test

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// requireCompact checks that key's bucket is in the compact format, under
// tag ("version cap rate"), holding exactly units and last as the decimal
// format would.
func requireCompact(t *testing.T, cfg redisstore.Config, key, tag string, units *big.Int, last int64) {
	t.Helper()
	raw, err := cfg.Client.Get(context.Background(), redisstore.BucketKey(cfg.Prefix, key)).Result()
	require.NoError(t, err)
	require.Equal(t, byte(2), raw[0], "bucket %q is not compact", raw)
	require.Equal(t, fmt.Sprintf("%s %d %s", units, last, tag), redisstore.DecimalBucket(raw))
}

// TestCompactAfterCutover: a bucket of a shape the fast path takes, but of
// more units than a decimal bucket the fast path reads (capacity 2,000,000
// at 1000/s is 2e15 units; per minute, 1.2e17), is compact before a
// cutover, and compact again after it: the general path, which brings it
// through the cutover, writes the fast path's format, exactly (every
// token and unit of the balance, checked against math/big).
func TestCompactAfterCutover(t *testing.T) {
	exactBalances(t)
	for _, rate := range []policy.Rate{policy.PerSecond(1000), policy.PerMinute(1000)} {
		t.Run(fmt.Sprint(rate.Per), func(t *testing.T) {
			const capacity = 2_000_000
			start := int64(1_700_000_000_123_456_789)
			clk := clock.NewManual(start)
			pol := func(v int64) policy.Policy {
				p := policy.Policy{Version: v, Capacity: capacity}
				if rate.Per == time.Second {
					p.TokensPerSecond = rate.Tokens
				} else {
					p.Refill = rate
				}
				return p
			}
			rateArg := fmt.Sprint(rate.Tokens)
			if rate.Per != time.Second {
				rateArg += "/" + fmt.Sprint(int64(rate.Per))
			}
			cfg := redisstore.Config{Client: client(t, redisAddr(t)), Prefix: prefix(t), Policy: pol(1)}
			s := newStore(t, cfg, clk)
			ctx := context.Background()
			per := big.NewInt(int64(rate.Per))
			// units(tokens, extra) = tokens*P + extra*N: a balance of whole
			// tokens plus the refill of extra ns
			units := func(tokens, extra int64) *big.Int {
				u := new(big.Int).Mul(big.NewInt(tokens), per)
				return u.Add(u, new(big.Int).Mul(big.NewInt(extra), big.NewInt(rate.Tokens)))
			}

			d, err := s.Allow(ctx, "k", 1_000)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			requireCompact(t, cfg, "k", fmt.Sprintf("1 %d %s", capacity, rateArg), units(capacity-1_000, 0), start)

			clk.Advance(7) // 7 ns: a fraction of a token, 7*N units
			require.NoError(t, s.ReplacePolicy(ctx, pol(2), 1))
			clk.Advance(11)
			d, err = s.Allow(ctx, "k", 3)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.EqualValues(t, capacity-1_003, d.Remaining)
			requireCompact(t, cfg, "k", fmt.Sprintf("2 %d %s", capacity, rateArg), units(capacity-1_003, 18), start+18)

			// and the fast path takes it from there
			clk.Advance(1)
			d, err = s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.EqualValues(t, capacity-1_004, d.Remaining)
			requireCompact(t, cfg, "k", fmt.Sprintf("2 %d %s", capacity, rateArg), units(capacity-1_004, 19), start+19)
		})
	}
}

// TestLargeDecimalBucketBecomesCompact: a decimal bucket of 16 digits of
// units (as an older store, or this one's general path before, wrote it),
// under the version in force, is read by the general path and written
// back compact, with the same balance.
func TestLargeDecimalBucketBecomesCompact(t *testing.T) {
	const capacity = 2_000_000
	start := int64(1_700_000_000_000_000_000)
	clk := clock.NewManual(start)
	cfg := redisstore.Config{Client: client(t, redisAddr(t)), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1000}}
	s := newStore(t, cfg, clk)
	ctx := context.Background()
	units := "1999000000000123" // 1,999,000 tokens and 123 units
	dec := strings.Join([]string{units, fmt.Sprint(start), "1", fmt.Sprint(capacity), "1000"}, " ")
	require.NoError(t, cfg.Client.Set(ctx, redisstore.BucketKey(cfg.Prefix, "k"), dec, 0).Err())
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.EqualValues(t, 1_998_999, d.Remaining)
	want, _ := new(big.Int).SetString("1998999000000123", 10)
	requireCompact(t, cfg, "k", fmt.Sprintf("1 %d 1000", capacity), want, start)
}

// TestRecordedBucketsKeepTheirBalance: with the server's TIME (expiries
// on), buckets that record their expiry carry their balance and last update
// from write to write, single and batched: over a test far shorter than
// a token's refill (one per hour), every admission and denial is the
// bucket's exact count, its time to full is what the spent tokens take to
// refill, less no more than the test's own duration, and the bucket stays
// recorded throughout.
func TestRecordedBucketsKeepTheirBalance(t *testing.T) {
	ctx := context.Background()
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 1000, Refill: policy.PerHour(1)})
	start := time.Now()
	want := int64(1000)
	for i, cost := range []int64{600, 1, 300, 99, 1, 1, 5} {
		var d engine.Decision
		if i%2 == 0 {
			var err error
			d, err = s.Allow(ctx, "k", cost)
			require.NoError(t, err)
		} else {
			out := make([]engine.Result, 2)
			require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "k", Cost: cost}, {Key: "other", Cost: 1}}, out))
			require.NoError(t, out[0].Err)
			d = out[0].Decision
		}
		admit := cost <= want
		if admit {
			want -= cost
		}
		require.Equal(t, admit, d.Allowed, "request %d (cost %d) with %d left", i, cost, want)
		require.Equal(t, want, d.Remaining, "request %d (cost %d)", i, cost)
		full := time.Duration(1000-want) * time.Hour
		require.LessOrEqual(t, d.ResetAfter, full, "request %d", i)
		require.GreaterOrEqual(t, d.ResetAfter, full-time.Since(start)-time.Millisecond, "request %d: refilled for longer than the test has run", i)
		raw := c.Get(ctx, redisstore.BucketKey(p, "k")).Val()
		_, recorded := redisstore.CompactExpiry(raw)
		require.True(t, recorded, "request %d: bucket %q records its expiry", i, raw)
	}
	got, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, want, got.Remaining)
}
