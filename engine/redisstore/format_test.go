package redisstore_test

import (
	"context"
	_ "embed"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// decimalOnly is the decide script of the stores that predate the compact
// bucket format, as they sent it.
//
//go:embed testdata/decide_decimal.lua
var decimalOnly string

// TestOlderStoreRefusesCompactBuckets: a store that predates the compact
// bucket format, sharing the prefix, fails its script call on a compact
// bucket (its failure rule answers) in every mode that reads one: it never
// reads it as full, never admits on it, never deletes it. And the decimal
// buckets such a store writes are read by this one.
func TestOlderStoreRefusesCompactBuckets(t *testing.T) {
	c := client(t, redisAddr(t))
	ctx := context.Background()
	p := prefix(t)
	cfg := redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}
	s := newStore(t, cfg, nil)
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	bucket := redisstore.BucketKey(p, "k")
	raw := c.Get(ctx, bucket).Val()
	require.Contains(t, []byte{1, 2}, raw[0], "the fast path writes the compact format")
	pol, hist, pend := redisstore.ShardStateKeys(p)
	shardKeys := func(key string) []string {
		i := redisstore.ShardOf(p, key)
		return []string{pol[i], hist[i], pend[i], redisstore.BucketKey(p, key)}
	}
	keys := shardKeys("k")
	for _, mode := range []string{"a", "A", "p", "r", "e", "c"} {
		at := ""
		if mode == "e" || mode == "c" {
			at = "9999999999999999999"
		}
		res, err := c.Eval(ctx, decimalOnly, keys, mode, "1", at, "1", 1, 10, 1, "").Result()
		require.Error(t, err, "mode %s: the older script answered %v on a compact bucket", mode, res)
		require.Equal(t, raw, c.Get(ctx, bucket).Val(), "mode %s: the older script changed the bucket", mode)
	}
	// The older script's own bucket (decimal) is read by this store.
	_, err = c.Eval(ctx, decimalOnly, shardKeys("old"), "a", "1", "", "1", 4, 10, 1, "").Result()
	require.NoError(t, err)
	d, err = s.Allow(ctx, "old", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.InDelta(t, 5, d.Remaining, 1, "10 - 4 - 1, and a second's refill at most")
}
