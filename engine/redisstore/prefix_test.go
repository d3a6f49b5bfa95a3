package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// oddPrefixes are prefix endings the SCAN MATCH pattern must keep literal:
// a byte that is not UTF-8, a NUL, and every glob metacharacter. Each test
// puts a fresh prefix first, so that the prefixes of tests sharing a server
// never meet.
var oddPrefixes = []struct{ name, tail string }{
	{"invalid UTF-8", "\xff:"},
	{"NUL", "a\x00b:"},
	{"glob characters", "p*[x]?\\:"},
}

// dropKeys deletes, when the test ends, the keys a store on p writes for
// the given buckets: the shared cleanup takes p as a SCAN pattern, which
// misses a prefix with glob characters.
func dropKeys(t *testing.T, c *redis.Client, p string, buckets ...string) {
	t.Helper()
	keys := []string{redisstore.GlobalKey(p, "policy"), redisstore.GlobalKey(p, "history"), redisstore.GlobalKey(p, "blobs"), redisstore.GlobalKey(p, "lock")}
	ps, hs, ns := redisstore.ShardStateKeys(p)
	keys = append(append(append(keys, ps...), hs...), ns...)
	t.Cleanup(func() {
		for _, b := range buckets { // a bucket's key depends on the key map the test's store created
			keys = append(keys, redisstore.BucketKey(p, b))
		}
		c.Del(context.Background(), keys...)
	})
}

// TestPrefixAnyBytesCountAndEvict: KeyCount and EvictFull find the buckets
// of a prefix whatever its bytes; EvictFull deletes the full bucket and
// keeps the drained one.
func TestPrefixAnyBytesCountAndEvict(t *testing.T) {
	for _, tc := range oddPrefixes {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := client(t, redisAddr(t))
			p := prefix(t) + tc.tail
			dropKeys(t, c, p, "full", "drained")
			clk := clock.NewManual(0)
			s := newStore(t, redisstore.Config{Client: c, Prefix: p,
				Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
			for key, cost := range map[string]int64{"full": 1, "drained": 10} {
				d, err := s.Allow(ctx, key, cost)
				require.NoError(t, err)
				require.True(t, d.Allowed, key)
			}
			n, err := s.KeyCount(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, n, "KeyCount sees both buckets")

			clk.Advance(time.Second) // "full" refilled its one token; "drained" holds one of ten
			n, err = s.EvictFull(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n, "EvictFull deletes the full bucket")
			require.Zero(t, c.Exists(ctx, redisstore.BucketKey(p, "full")).Val(), "the full bucket is gone")
			require.Equal(t, int64(1), c.Exists(ctx, redisstore.BucketKey(p, "drained")).Val(), "the drained bucket is kept")
			n, err = s.KeyCount(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			d, err := s.Allow(ctx, "drained", 2)
			require.NoError(t, err)
			require.False(t, d.Allowed, "the drained bucket still holds one token")
		})
	}
}

// TestPrefixAnyBytesLengtheningCutover: a cutover that raises the capacity
// must rewrite the expiry of every bucket of the prefix, whatever its
// bytes. A drained bucket whose old expiry (its time-to-full at capacity
// 10) were left would be dropped before it is full and come back holding
// the new capacity of 1000.
//
// The store reads the server's TIME, so the test waits on the server's
// clock past the old expiry by polling it, as
// TestPassExpiryAfterConcurrentAllow does: no sleep, and no local clock.
func TestPrefixAnyBytesLengtheningCutover(t *testing.T) {
	// Tokens per second: the drained bucket is full after 5 s at capacity
	// 10, which the cutover, its SCAN of the shared server included, must
	// beat to its expiry.
	const rate = 2
	for _, tc := range oddPrefixes {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each waits 5 s of the server's clock; they wait together
			ctx := context.Background()
			addr := redisAddr(t)
			c := client(t, addr)
			p := prefix(t) + tc.tail
			dropKeys(t, c, p, "k")
			s := realStores(t, addr, 1, redisstore.Config{Prefix: p, Timeout: 10 * time.Second,
				Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: rate}})[0]

			drained := serverTime(t, c)
			d, err := s.Allow(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			oldExpiry := pexpireTime(t, c, redisstore.BucketKey(p, "k"))
			require.Positive(t, oldExpiry, "a bucket under capacity has an expiry")

			require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1000, TokensPerSecond: rate}, 1))
			after := readBucket(t, c, redisstore.BucketKey(p, "k"))

			for serverTime(t, c).UnixMilli() <= oldExpiry+20 {
				// the server's clock is the one that expires keys: poll it
				// past the old expiry, a few times a second, not in a busy
				// loop beside the other subtests
				time.Sleep(20 * time.Millisecond)
			}
			d, err = s.Allow(ctx, "k", 500)
			require.NoError(t, err)
			elapsed := serverTime(t, c).Sub(drained)
			require.False(t, d.Allowed, "500 of 1000 admitted %v after the bucket was drained: it expired early and came back full", elapsed)
			require.Equal(t, int64(1000), d.Limit)
			require.LessOrEqual(t, d.Remaining, int64(elapsed.Seconds()*rate)+1, "no more tokens than %v of refill", elapsed)

			require.False(t, after.gone, "the drained bucket outlived the cutover")
			require.Equal(t, int64(2), after.version, "the cutover's pass brought the bucket up to the new version")
			require.Equal(t, int64(1000), after.capacity)
			after.checkExpiry(t, "the drained bucket after the cutover")
		})
	}
}
