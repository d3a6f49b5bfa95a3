package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// rawBucket is a bucket's value and PEXPIRETIME, read in one transaction;
// gone if it had expired.
type rawBucket struct {
	raw        string
	expireAtMs int64
	gone       bool
	recorded   bool // a compact bucket that records its expiry
}

func readRaw(t *testing.T, c *redis.Client, key string) rawBucket {
	t.Helper()
	ctx := context.Background()
	var get *redis.StringCmd
	var exp *redis.Cmd
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		exp = p.Eval(ctx, pexpireTimeSrc, []string{key})
		return nil
	})
	if errors.Is(err, redis.Nil) || errors.Is(get.Err(), redis.Nil) {
		return rawBucket{gone: true}
	}
	require.NoError(t, err, key)
	ms, err := exp.Int64()
	require.NoError(t, err, key)
	if ms == -2 { // expired after the GET (see pexpireTimeSrc)
		return rawBucket{gone: true}
	}
	_, recorded := redisstore.CompactExpiry(get.Val())
	return rawBucket{raw: redisstore.DecimalBucket(get.Val()), expireAtMs: ms, recorded: recorded}
}

// stateOf reads a bucket of shape sh; it returns its version too.
func stateOf(t *testing.T, raw string, sh []mBand) (*mState, int64) {
	t.Helper()
	f := strings.Fields(raw)
	require.Len(t, f, 5+len(sh)-1, "bucket %q for %d bands", raw, len(sh))
	m := &mState{sh: sh}
	var err error
	m.last, err = strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err, raw)
	v, err := strconv.ParseInt(f[2], 10, 64)
	require.NoError(t, err, raw)
	for _, s := range append(f[:1:1], f[5:]...) {
		u, ok := new(big.Int).SetString(s, 10)
		require.True(t, ok, raw)
		m.units = append(m.units, u)
	}
	return m, v
}

// fullAt is the exact instant, in ns, every band is full, as the bucket
// stands: last + the longest ceil((capacity*P - units) / N).
func (s *mState) fullAt() *big.Int {
	ttf := new(big.Int)
	for i, b := range s.sh {
		d := new(big.Int).Sub(b.full(), s.units[i])
		n := big.NewInt(b.tokens)
		d.Add(d, new(big.Int).Sub(n, big.NewInt(1))).Quo(d, n)
		if d.Cmp(ttf) > 0 {
			ttf = d
		}
	}
	return ttf.Add(ttf, big.NewInt(s.last))
}

// checkBandExpiry requires a bucket full at fullAt (last updated at last) to
// expire no earlier, and, if tight, at most 3 ms (plus the script's
// relative margin, and for a compact bucket written afresh the sixteenth of
// its time-to-full it is given to spare) later; no expiry only for a time-to-full past 1e15 ms,
// or, if not tight, at all (a bucket that never expires is never dropped
// early).
func checkBandExpiry(t *testing.T, b rawBucket, fullAt *big.Int, last int64, tight bool, what string) {
	t.Helper()
	if b.expireAtMs < 0 && !tight {
		return
	}
	if b.expireAtMs < 0 {
		ttf := new(big.Int).Sub(fullAt, big.NewInt(last))
		require.Positive(t, ttf.Cmp(new(big.Int).Mul(big.NewInt(1e15), big.NewInt(1e6))), "%s: no expiry, full at %v ns", what, fullAt)
		return
	}
	at := new(big.Int).Mul(big.NewInt(b.expireAtMs), big.NewInt(1e6))
	require.GreaterOrEqual(t, at.Cmp(fullAt), 0, "%s: expires at %v ns, before it is full at %v ns", what, at, fullAt)
	if !tight {
		return
	}
	late := new(big.Int).Sub(at, fullAt)
	ttf := new(big.Int).Sub(fullAt, big.NewInt(last))
	slack := new(big.Int).Div(ttf, big.NewInt(1e11))
	slack.Add(slack, big.NewInt(3e6))
	if b.recorded {
		slack.Add(slack, new(big.Int).Div(ttf, big.NewInt(16)))
	}
	require.LessOrEqual(t, late.Cmp(slack), 0, "%s: expires %v ns after it is full", what, late)
}

// TestExpiryBandsAtTimeToFull: with the server's TIME, a bucket of bands
// and awkward periods expires when its slowest band is full, no earlier,
// and at most 3 ms later.
func TestExpiryBandsAtTimeToFull(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 7))
	c := client(t, redisAddr(t))
	ctx := context.Background()
	names := []string{"daily", "burst", "a b"}
	for i := range 60 {
		sh := genShape(r, names, "")
		p := prefix(t)
		s := realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p, Policy: policyOf(t, 1, sh, nil, false)})[0]
		for _, cost := range []int64{1, max(1, minCap(sh)/2), minCap(sh)} {
			key := fmt.Sprint("k", cost)
			_, err := s.Allow(ctx, key, cost)
			require.NoError(t, err)
			_, err = s.Allow(ctx, key, 1) // an existing bucket, maybe denied
			require.NoError(t, err)
			b := readRaw(t, c, redisstore.BucketKey(p, key))
			if b.gone {
				continue
			}
			m, _ := stateOf(t, b.raw, sh)
			checkBandExpiry(t, b, m.fullAt(), m.last, true, fmt.Sprintf("case %d, shape %+v, cost %d: %q", i, sh, cost, b.raw))
		}
	}
}

// TestExpiryAcrossBandCutovers: after any cutover, every bucket expires no
// earlier than it is full under the new shape: a cutover that could
// lengthen some bucket's time-to-full (a band's capacity raised, or its
// rate lowered for its capacity) rewrites every expiry before it returns;
// one that cannot (a band added, which starts full, or dropped, or a
// faster rate) leaves the old ones, which must still be late enough.
func TestExpiryAcrossBandCutovers(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 8))
	c := client(t, redisAddr(t))
	ctx := context.Background()
	names := []string{"daily", "burst"}
	passes, none := 0, 0
	fast := mBand{capacity: 5, tokens: 1000, per: 1e9}
	daily := mBand{name: "daily", capacity: 20, tokens: 20, per: 86400e9}
	raised, slower := daily, daily
	raised.capacity = 21
	slower.tokens = 19
	fixed := [][2][]mBand{
		{{fast, daily}, {fast, raised}}, // a band's capacity raised: a pass
		{{fast, daily}, {fast, slower}}, // a band's rate lowered: a pass
		{{fast}, {fast, daily}},         // a band added, full: none
		{{fast, daily}, {fast}},         // a band dropped: none
	}
	for round := range 40 + len(fixed) {
		v1 := genShape(r, names, "")
		v2 := genShape(r, names, "")
		if round < len(fixed) {
			v1, v2 = fixed[round][0], fixed[round][1]
		} else if r.IntN(3) == 0 {
			// the same shape, a band or the primary a little different
			v2 = append([]mBand(nil), v1...)
			k := r.IntN(len(v2))
			switch r.IntN(3) {
			case 0:
				v2[k].capacity = max(1, v2[k].capacity/2)
			case 1:
				v2[k].tokens = max(v2[k].tokens, min(2*v2[k].tokens, math.MaxInt64)) // faster (2x wraps negative: then as is)
			default:
				if v2[k].capacity < math.MaxInt64 {
					v2[k].capacity++
				}
			}
		}
		p := prefix(t)
		s := realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p, Policy: policyOf(t, 1, v1, nil, false)})[0]
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = fmt.Sprint("k", i)
			_, err := s.Allow(ctx, keys[i], 1+r.Int64N(minCap(v1)))
			require.NoError(t, err)
		}
		require.NoError(t, s.ReplacePolicy(ctx, policyOf(t, 2, v2, nil, false), 1), "round %d", round)
		hist, err := c.LRange(ctx, redisstore.GlobalKey(p, "history"), -1, -1).Result()
		require.NoError(t, err)
		cut, err := strconv.ParseInt(strings.Fields(hist[0])[1], 10, 64)
		require.NoError(t, err)
		for _, k := range keys {
			b := readRaw(t, c, redisstore.BucketKey(p, k))
			if b.gone {
				continue
			}
			m, v := stateOf(t, b.raw, map[bool][]mBand{true: v1, false: v2}[strings.Fields(b.raw)[2] == "1"])
			if round < len(fixed) {
				require.Equal(t, []int64{2, 2, 1, 1}[round], v, "fixed round %d: %+v -> %+v", round, v1, v2)
			}
			fullAt := m.fullAt()
			if v == 1 {
				none++
				// A bucket full by the cutover stays full through it (a full
				// band carries over full, a new one starts full); one that is
				// not fills under v2 from there.
				if fullAt.Cmp(big.NewInt(cut)) > 0 {
					m.cutover(cut, v2) // as the next touch will bring it
					fullAt = m.fullAt()
				}
			} else {
				passes++
			}
			checkBandExpiry(t, b, fullAt, m.last, v == 2, fmt.Sprintf("round %d, %s: %+v -> %+v: %q", round, k, v1, v2, b.raw))
		}
	}
	t.Logf("%d buckets rewritten by a pass, %d left at version 1", passes, none)
	require.Positive(t, passes, "no cutover needed a pass")
	require.Positive(t, none, "every cutover needed a pass")
}
