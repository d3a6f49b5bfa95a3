package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// bucketState is a bucket as the script stores it.
type bucketState struct {
	units          *big.Int
	last           int64
	version        int64
	capacity, rate int64
	expireAtMs     int64    // PEXPIRETIME: -1 for none
	fullAtNs       *big.Int // the exact instant it is full, in ns
	gone           bool     // expired before it could be read
	recorded       bool     // a compact bucket that records its expiry
}

// readBucket reads key's state and expiry in one transaction (a bucket a
// few ms from full may expire between two reads) and judges the expiry
// against the exact instant the bucket is full under its own limit: never
// before it, and at most 3 ms after (the ms rounding, and the script's
// margin), give or take a relative 1e-11 of the time-to-full. A bucket
// already gone has expired, which Redis only does at its expiry: gone is
// set and nothing else.
func readBucket(t *testing.T, c *redis.Client, key string) bucketState {
	t.Helper()
	ctx := context.Background()
	var get *redis.StringCmd
	var exp *redis.Cmd
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		exp = p.Eval(ctx, pexpireTimeSrc, []string{key})
		return nil
	})
	var b bucketState
	if errors.Is(err, redis.Nil) || errors.Is(get.Err(), redis.Nil) {
		b.gone = true
		return b
	}
	require.NoError(t, err, key)
	_, b.recorded = redisstore.CompactExpiry(get.Val())
	raw := redisstore.DecimalBucket(get.Val())
	var units string
	_, err = fmt.Sscanf(raw, "%s %d %d %d %d", &units, &b.last, &b.version, &b.capacity, &b.rate)
	require.NoError(t, err, raw)
	b.units, _ = new(big.Int).SetString(units, 10)
	b.expireAtMs, err = exp.Int64()
	require.NoError(t, err, key)
	if b.expireAtMs == -2 { // expired after the GET (see pexpireTimeSrc)
		return bucketState{gone: true}
	}
	deficit := new(big.Int).Sub(new(big.Int).Mul(big.NewInt(b.capacity), big.NewInt(policy.UnitsPerToken)), b.units)
	r := big.NewInt(b.rate)
	ttf := new(big.Int).Div(new(big.Int).Add(deficit, new(big.Int).Sub(r, big.NewInt(1))), r)
	b.fullAtNs = ttf.Add(ttf, big.NewInt(b.last))
	return b
}

// pexpireTimeSrc is PEXPIRETIME (Redis 7.0), or where the server has none
// (Redis 6) PTTL plus TIME: at most a millisecond late, if one passes
// between the two. Either is -2 for a key gone, which a key a transaction's
// GET read may be by the next command on Redis 6, where each runs at its
// own time (from 7.0, at the transaction's).
const pexpireTimeSrc = `local r = redis.pcall('PEXPIRETIME', KEYS[1])
if type(r) == 'number' then return r end
r = redis.call('PTTL', KEYS[1])
if r < 0 then return r end
local t = redis.call('TIME')
return t[1] * 1000 + math.floor(t[2] / 1000) + r`

// pexpireTime is PEXPIRETIME as Redis answers it, in ms (go-redis's
// Duration overflows past the year 2262).
func pexpireTime(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	ms, err := c.Eval(context.Background(), pexpireTimeSrc, []string{key}).Int64()
	require.NoError(t, err, key)
	return ms
}

func (b bucketState) checkExpiry(t *testing.T, what string) {
	t.Helper()
	if b.gone {
		t.Logf("%s: expired before it could be read", what)
		return
	}
	if b.expireAtMs < 0 {
		// none: only for a time-to-full beyond what the script bounds
		require.Positive(t, b.fullAtNs.Cmp(new(big.Int).Mul(big.NewInt(1e15), big.NewInt(1e6))), "%s: no expiry, full at %v ns", what, b.fullAtNs)
		return
	}
	at := new(big.Int).Mul(big.NewInt(b.expireAtMs), big.NewInt(1e6))
	require.GreaterOrEqual(t, at.Cmp(b.fullAtNs), 0, "%s: expires at %v ns, before it is full at %v ns", what, at, b.fullAtNs)
	// 3 ms, plus the script's relative margin of 1e-12 on the time-to-full,
	// plus, for a compact bucket written afresh (as every one here is), the
	// sixteenth of its time-to-full it is given so that later writes can
	// keep its expiry
	late := new(big.Int).Sub(at, b.fullAtNs)
	ttf := new(big.Int).Sub(b.fullAtNs, big.NewInt(b.last))
	slack := new(big.Int).Div(ttf, big.NewInt(1e11))
	slack.Add(slack, big.NewInt(3e6))
	if b.recorded {
		slack.Add(slack, new(big.Int).Div(ttf, big.NewInt(16)))
	}
	require.LessOrEqual(t, late.Cmp(slack), 0, "%s: expires %v ns after it is full", what, late)
}

// timeStore is a store on the server's TIME (expiries on) under a fresh
// prefix, with its client and the prefix.
func timeStore(t *testing.T, pol policy.Policy) (*redis.Client, string, *redisstore.Store) {
	t.Helper()
	c := client(t, redisAddr(t))
	p := prefix(t)
	return c, p, realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p, Policy: pol})[0]
}

// TestExpiryAtTimeToFull: with the server's TIME, every bucket written
// expires no earlier than the instant it is full under its own limit and at
// most 3 ms later (a compact bucket: plus a sixteenth of its time-to-full),
// over limits from a nanosecond's refill to none in practice.
func TestExpiryAtTimeToFull(t *testing.T) {
	c := client(t, redisAddr(t))
	ctx := context.Background()
	for _, l := range []policy.Limit{
		{Capacity: 10, TokensPerSecond: 2},
		{Capacity: 1, TokensPerSecond: 3},
		{Capacity: 1000, TokensPerSecond: 1_000_000_000},
		{Capacity: 5, TokensPerSecond: math.MaxInt64},
		{Capacity: 1 << 40, TokensPerSecond: 7},
		{Capacity: math.MaxInt64, TokensPerSecond: 1},
		{Capacity: math.MaxInt64, TokensPerSecond: math.MaxInt64},
	} {
		p := prefix(t)
		stores := realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p,
			Policy: policy.Policy{Version: 1, Capacity: l.Capacity, TokensPerSecond: l.TokensPerSecond}})
		for _, cost := range []int64{1, max(1, l.Capacity/2), l.Capacity} {
			key := fmt.Sprint("k", cost)
			_, err := stores[0].Allow(ctx, key, cost)
			require.NoError(t, err)
			_, err = stores[0].Allow(ctx, key, 1) // an existing bucket, maybe denied
			require.NoError(t, err)
			readBucket(t, c, redisstore.BucketKey(p, key)).checkExpiry(t, fmt.Sprintf("%+v cost %d", l, cost))
		}
	}
}

// TestExpiryAcrossCutovers: a cutover that could lengthen a bucket's
// time-to-full (a higher capacity) rewrites every bucket's expiry before it
// returns; one that cannot (a higher rate) leaves the old expiries, which
// are still no earlier than each bucket's time-to-full under the new limit.
func TestExpiryAcrossCutovers(t *testing.T) {
	ctx := context.Background()
	// Each bucket is 10 s or more from full, so that none expires before
	// the cutover, as a bucket 1 token short at 10 tokens a second did
	// when the calls took 100 ms (with leases, on a loaded machine).
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1})
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		_, err := s.Allow(ctx, keys[i], int64(10+i))
		require.NoError(t, err)
	}

	// higher capacity: buckets take longer to fill; expiries rewritten
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 300, TokensPerSecond: 10}, 1))
	for _, k := range keys {
		b := readBucket(t, c, redisstore.BucketKey(p, k))
		require.Equal(t, int64(2), b.version, "%s brought up to the new version by the cutover", k)
		require.Equal(t, int64(300), b.capacity)
		b.checkExpiry(t, k+" after a lengthening cutover")
	}
	_, _, pendings := redisstore.ShardStateKeys(p)
	require.Zero(t, c.Exists(ctx, pendings...).Val(), "the pending flags are cleared")
	require.Zero(t, c.Exists(ctx, redisstore.GlobalKey(p, "lock")).Val(), "the lock is released")

	// higher rate: no pass; the old expiry stays, and is late enough
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 300, TokensPerSecond: 1000}, 2))
	hist, err := c.LRange(ctx, redisstore.GlobalKey(p, "history"), -1, -1).Result()
	require.NoError(t, err)
	var v, cut int64
	_, err = fmt.Sscanf(hist[0], "%d %d", &v, &cut)
	require.NoError(t, err)
	for _, k := range keys {
		b := readBucket(t, c, redisstore.BucketKey(p, k))
		require.Equal(t, int64(2), b.version, "%s untouched by a cutover that needs no pass", k)
		// the eager rule at the cutover, then full at the new rate
		old := policy.Limit{Capacity: b.capacity, TokensPerSecond: b.rate}
		next := policy.Limit{Capacity: 300, TokensPerSecond: 1000}
		q, m := new(big.Int).QuoRem(b.units, big.NewInt(policy.UnitsPerToken), new(big.Int))
		bk := policy.Bucket{Tokens: q.Int64(), Frac: uint32(m.Int64()), Last: b.last}
		bk.Cutover(old, next, cut)
		fullAt := new(big.Int).Add(big.NewInt(max(bk.Last, cut)), big.NewInt(bk.ResetAfter(next)))
		at := new(big.Int).Mul(big.NewInt(b.expireAtMs), big.NewInt(1e6))
		require.GreaterOrEqual(t, at.Cmp(fullAt), 0, "%s expires at %v, before it is full at %v", k, at, fullAt)
	}
}

// TestLaterWritesKeepTheExpiry: a compact bucket's expiry is set with a
// sixteenth of its time-to-full to spare, and the writes that need no later
// one leave it as it is; the first that needs a later one sets it anew.
// Either way the bucket never expires before it is full.
func TestLaterWritesKeepTheExpiry(t *testing.T) {
	ctx := context.Background()
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	key := redisstore.BucketKey(p, "k")
	state := func(what string) (expireAt int64) {
		t.Helper()
		b := readBucket(t, c, key)
		require.False(t, b.gone, what)
		require.True(t, b.recorded, "%s: the bucket records its expiry", what)
		at := new(big.Int).Mul(big.NewInt(b.expireAtMs), big.NewInt(1e6))
		require.GreaterOrEqual(t, at.Cmp(b.fullAtNs), 0, "%s: expires at %v ns, before it is full at %v ns", what, at, b.fullAtNs)
		x, _ := redisstore.CompactExpiry(c.Get(ctx, key).Val())
		require.Equal(t, b.expireAtMs, x, "%s: the expiry recorded is the key's", what)
		return b.expireAtMs
	}
	allow := func(cost int64) {
		t.Helper()
		d, err := s.Allow(ctx, "k", cost)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	allow(100) // full in 100 s: 6.25 s to spare
	first := state("first write")
	b := readBucket(t, c, key)
	ttfMs := new(big.Int).Sub(b.fullAtNs, big.NewInt(b.last))
	ttfMs.Div(ttfMs, big.NewInt(1e6))
	require.GreaterOrEqual(t, first-b.last/1e6, ttfMs.Int64()+ttfMs.Int64()/16, "the first write's expiry has the slack")
	for i := range 5 { // each a second later: still within the slack
		allow(1)
		require.Equal(t, first, state(fmt.Sprint("write ", i+2)), "write %d keeps the expiry", i+2)
	}
	allow(10) // 15 s later than the first write needed: past the slack
	later := state("the write past the slack")
	require.Greater(t, later, first, "the expiry is set anew")
}

// TestSmallLengtheningSetsExpiries: a cutover that lengthens a bucket's
// time-to-full by less than the slack its expiry has still clears the
// expiry and sets it again: the bucket expires, and not before it is full.
func TestSmallLengtheningSetsExpiries(t *testing.T) {
	ctx := context.Background()
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	d, err := s.Allow(ctx, "k", 100) // full in 100 s: 6.25 s to spare
	require.NoError(t, err)
	require.True(t, d.Allowed)
	// 2 s longer to fill: within the slack
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1002, TokensPerSecond: 1}, 1))
	b := readBucket(t, c, redisstore.BucketKey(p, "k"))
	require.Equal(t, int64(2), b.version, "the pass brought the bucket to the new version")
	require.GreaterOrEqual(t, b.expireAtMs, int64(0), "the bucket expires")
	b.checkExpiry(t, "after a small lengthening")
}

// TestPendingCutoverWritesNoExpiry: while a lengthening cutover is being
// prepared (the pending flag set), buckets are written without expiry, so
// none can expire before the new expiries are set.
func TestPendingCutoverWritesNoExpiry(t *testing.T) {
	ctx := context.Background()
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1})
	_, _, pendings := redisstore.ShardStateKeys(p)
	require.NoError(t, c.HSet(ctx, pendings[0], "someone", "1").Err()) // one server: every call reads shard 0's
	_, err := s.Allow(ctx, "k", 50)
	require.NoError(t, err)
	require.Equal(t, int64(-1), pexpireTime(t, c, redisstore.BucketKey(p, "k")))
	require.NoError(t, c.Del(ctx, pendings[0]).Err())
	_, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	b := readBucket(t, c, redisstore.BucketKey(p, "k"))
	b.checkExpiry(t, "after the flag is gone")
	// The second write took its token from the bucket the first wrote (49
	// tokens and what refilled since), not from a fresh one (99): 50 s
	// apart at a token a second, where 9 and 8 of a capacity of 10 were
	// one second, which a loaded machine could take.
	require.False(t, b.gone)
	require.GreaterOrEqual(t, b.units.Cmp(big.NewInt(49*policy.UnitsPerToken)), 0, "%v units", b.units)
	require.Negative(t, b.units.Cmp(big.NewInt(99*policy.UnitsPerToken)), "%v units: a fresh bucket", b.units)
}

// TestExpiryLaterWriteNeedsLaterExpiry: a compact bucket whose time-to-full
// is under 16 ms records no slack, so a write just after, which takes
// more tokens than refilled meanwhile, needs an expiry a ms or two later
// than the recorded one: it must set it (the bucket expires at its
// time-to-full or later, never earlier), not keep the recorded one.
func TestExpiryLaterWriteNeedsLaterExpiry(t *testing.T) {
	c, p, s := timeStore(t, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1000}) // a token a ms
	ctx := context.Background()
	for i := range 20 {
		for _, second := range []int64{2, 3} {
			name := fmt.Sprintf("k%d-%d", i, second)
			d, err := s.Allow(ctx, name, 5) // 5 ms to full
			require.NoError(t, err)
			require.True(t, d.Allowed)
			d, err = s.Allow(ctx, name, second) // about 5+second ms to full: 1 or 2 ms past the recorded expiry
			require.NoError(t, err)
			require.True(t, d.Allowed)
			readBucket(t, c, redisstore.BucketKey(p, name)).checkExpiry(t, name)
		}
	}
}
