package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	mrand "math/rand"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// setClock reads whatever it was last set to, earlier readings included:
// the script must treat time that steps back as no time at all.
type setClock struct{ now atomic.Int64 }

func (c *setClock) Now() int64 { return c.now.Load() }

// arithCase is one bucket state and one request, straight into the script.
type arithCase struct {
	capacity, rate int64
	units          *big.Int // balance before, 0..capacity*1e9
	last, now      int64
	cost           int64
}

// TestScriptArithmeticMatchesPolicy writes a bucket's raw state into Redis,
// has the script decide one request on it, and compares the Decision and the
// state written back with the policy package's exact arithmetic (itself
// checked against math/big), over random and extreme values of the whole
// int64 range: the Lua limbs must agree with the Go 128-bit code everywhere.
func TestScriptArithmeticMatchesPolicy(t *testing.T) {
	skipUnderRace(t)
	r := rand.New(rand.NewPCG(7, 11))
	var cases []arithCase
	// the script's fast path takes capacities up to 4,503,599 (units below
	// 2^52) and elapsed times up to 9e6 s: both edges are here
	extremes := []int64{1, 2, 3, 7, 999_999_999, 1_000_000_000, 1_000_000_001, 1 << 31,
		4_503_598, 4_503_599, 4_503_600, 1<<52 - 1, 1 << 52, 1<<52 + 1, 8_999_999_999_999_999, 9_000_000_000_000_000, 9_000_000_999_999_999, 9_000_001_000_000_000,
		1 << 53, 1<<53 + 1, math.MaxInt64 / 1_000_000_000, math.MaxInt64 - 1, math.MaxInt64}
	pick := func() int64 {
		switch r.IntN(3) {
		case 0:
			return extremes[r.IntN(len(extremes))]
		case 1:
			return 1 + r.Int64N(1000)
		}
		return 1 + r.Int64N(math.MaxInt64)>>r.IntN(63)
	}
	for range 600 {
		c := arithCase{capacity: pick(), rate: pick()}
		full := new(big.Int).Mul(big.NewInt(c.capacity), big.NewInt(policy.UnitsPerToken))
		switch r.IntN(5) {
		case 0:
			c.units = new(big.Int)
		case 1:
			c.units = new(big.Int).Set(full)
		case 2:
			c.units = new(big.Int).Sub(full, big.NewInt(1+r.Int64N(2)))
			if c.units.Sign() < 0 {
				c.units.SetInt64(0)
			}
		default:
			// full is below 2^93: two 64-bit draws, reduced
			x := new(big.Int).Lsh(new(big.Int).SetUint64(r.Uint64()), 64)
			x.Or(x, new(big.Int).SetUint64(r.Uint64()))
			c.units = x.Mod(x, new(big.Int).Add(full, big.NewInt(1)))
		}
		c.last = pick()
		switch r.IntN(4) {
		case 0:
			c.now = c.last // no time
		case 1:
			c.now = c.last - r.Int64N(c.last) // the clock stepped back
		default:
			c.now = c.last + min(pick(), math.MaxInt64-c.last)
		}
		c.cost = 1 + r.Int64N(c.capacity)
		if r.IntN(4) == 0 {
			c.cost = min(pick(), c.capacity)
		}
		cases = append(cases, c)
	}
	// Refills that land just short of, on and just past full, where a double
	// that rounded would show.
	for range 300 {
		c := arithCase{capacity: 1 + r.Int64N(4_503_599), rate: pick()}
		if r.IntN(2) == 0 {
			c.capacity = extremes[r.IntN(11)]
		}
		full := new(big.Int).Mul(big.NewInt(c.capacity), big.NewInt(policy.UnitsPerToken))
		c.units = new(big.Int).Rand(randBig(r), full)
		deficit := new(big.Int).Sub(full, c.units)
		toFull := new(big.Int).Div(deficit, big.NewInt(c.rate)) // ns to one unit short, or full
		elapsed := toFull.Int64() + r.Int64N(3) - 1
		c.last = r.Int64N(math.MaxInt64 / 2)
		c.now = c.last + max(0, elapsed)
		c.cost = 1 + r.Int64N(c.capacity)
		cases = append(cases, c)
	}
	rig := newArithRig(t)
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) { rig.check(t, c) })
	}
}

// randBig adapts math/rand/v2 to big.Int.Rand.
func randBig(r *rand.Rand) *mrand.Rand { return mrand.New(mrand.NewSource(r.Int64())) }

// arithRig runs arithmetic cases through real stores, one per limit (a
// store per case would cost more than the case), all reading one clock.
type arithRig struct {
	t      *testing.T // the parent test, which owns the stores
	rdb    *redis.Client
	clk    *setClock
	stores map[policy.Limit]*redisstore.Store
	pfx    map[policy.Limit]string
	n      int // cases run: each gets its own key
}

func newArithRig(t *testing.T) *arithRig {
	return &arithRig{t: t, rdb: client(t, redisAddr(t)), clk: &setClock{},
		stores: map[policy.Limit]*redisstore.Store{}, pfx: map[policy.Limit]string{}}
}

// check writes c's bucket state raw, has the script decide c's request on
// it, and compares the Decision and the state written back with the policy
// package.
func (rig *arithRig) check(t *testing.T, c arithCase) {
	lim := policy.Limit{Capacity: c.capacity, TokensPerSecond: c.rate}
	s, ok := rig.stores[lim]
	if !ok {
		cfg := redisstore.Config{Client: rig.rdb, Prefix: prefix(t),
			Policy: policy.Policy{Version: 1, Capacity: c.capacity, TokensPerSecond: c.rate}}
		s = newStore(rig.t, cfg, rig.clk)
		rig.stores[lim], rig.pfx[lim] = s, cfg.Prefix
	}
	rig.n++
	ctx := context.Background()
	name := fmt.Sprint("key", rig.n)
	key := redisstore.BucketKey(rig.pfx[lim], name)
	set := fmt.Sprintf("%s %d 1 %d %d", c.units, c.last, c.capacity, c.rate)
	require.NoError(t, rig.rdb.Set(ctx, key, set, 0).Err())
	rig.clk.now.Store(c.now)

	tokens, frac := new(big.Int).QuoRem(c.units, big.NewInt(policy.UnitsPerToken), new(big.Int))
	b := policy.Bucket{Tokens: tokens.Int64(), Frac: uint32(frac.Int64()), Last: c.last}
	o := b.Decide(lim, max(c.now, c.last), c.cost)
	// A bucket updated after now refills nothing until then: the waits
	// count from now, that time included (saturated).
	if ahead := c.last - c.now; ahead > 0 {
		later := func(d int64) int64 { return d + min(ahead, math.MaxInt64-d) }
		if !o.Allowed {
			o.RetryAfter = later(o.RetryAfter)
		}
		if o.ResetAfter > 0 {
			o.ResetAfter = later(o.ResetAfter)
		}
	}
	want := engine.Decision{Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: time.Duration(o.RetryAfter),
		Version: 1, Limit: c.capacity, ResetAfter: time.Duration(o.ResetAfter)}

	got, err := s.Allow(ctx, name, c.cost)
	require.NoError(t, err, "case %+v", c)
	require.Equal(t, want, got, "case %+v", c)
	raw, err := rig.rdb.Get(ctx, key).Result()
	require.NoError(t, err)
	raw = redisstore.DecimalBucket(raw)
	if !o.Allowed && raw == set {
		// A denial need not write: the bucket it left refills to the state
		// the policy package reaches.
		var u string
		var last int64
		_, err := fmt.Sscanf(raw, "%s %d", &u, &last)
		require.NoError(t, err)
		n, ok := new(big.Int).SetString(u, 10)
		require.True(t, ok, raw)
		tk, fr := new(big.Int).QuoRem(n, big.NewInt(policy.UnitsPerToken), new(big.Int))
		left := policy.Bucket{Tokens: tk.Int64(), Frac: uint32(fr.Int64()), Last: last}
		left.Refill(lim, max(c.now, c.last))
		require.Equal(t, b, left, "the state a denial left, case %+v", c)
		return
	}
	units := new(big.Int).Add(new(big.Int).Mul(big.NewInt(b.Tokens), big.NewInt(policy.UnitsPerToken)), big.NewInt(int64(b.Frac)))
	require.Equal(t, fmt.Sprintf("%s %d 1 %d %d", units, b.Last, c.capacity, c.rate), raw, "state after, case %+v", c)
}

// TestScriptCostAboveCapacity: the script refuses a cost above the key's
// capacity before anything else, and changes nothing.
func TestScriptCostAboveCapacity(t *testing.T) {
	for _, capacity := range []int64{1, 10, math.MaxInt64 - 1} {
		clk := &setClock{}
		s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1}}, clk)
		d, err := s.Allow(context.Background(), "k", capacity+1)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
		require.Equal(t, engine.Decision{}, d)
		d, err = s.Allow(context.Background(), "k", capacity)
		require.NoError(t, err)
		require.True(t, d.Allowed, "the refused request took nothing: %+v", d)
	}
}
