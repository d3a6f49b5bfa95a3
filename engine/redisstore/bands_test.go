package redisstore_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The script's arithmetic over rates of any period and bands, against a
// model written here in math/big: one token of a band of N per P ns is P
// units, refill adds elapsed*N units up to capacity*P, a request is
// admitted only if every band holds cost*P, and a cutover moves each band
// to the band of the new shape with its name (the primary to the primary),
// as floor(units*Pnew/Pold) clamped to the new capacity, a new band full.

// mBand is one band of the model: its name ("" or an override's for the
// primary), capacity and rate.
type mBand struct {
	name      string
	capacity  int64
	tokens    int64
	per       int64
	perSecond bool // the primary, given as TokensPerSecond rather than Refill
}

func (b mBand) full() *big.Int { return mulI(b.capacity, b.per) }

func mulI(a, b int64) *big.Int { return new(big.Int).Mul(big.NewInt(a), big.NewInt(b)) }

// awkwardRates are periods awkward for the script, and their neighbours at
// the edges of the script's paths: the double fast path takes one band whose
// capacity*P is below 2^52.
var awkwardRates = []policy.Rate{
	{Tokens: 7, Per: 3 * time.Second},
	policy.PerDay(1),
	{Tokens: 1, Per: math.MaxInt64},
	{Tokens: math.MaxInt64, Per: 1},
	policy.PerMinute(100),
	policy.PerHour(1000),
	policy.PerDay(20),
	{Tokens: 3, Per: 7},
	{Tokens: 1, Per: 1},
	{Tokens: 1, Per: 1<<32 + 1},
	{Tokens: 1, Per: 1<<52 - 1},
	{Tokens: 1, Per: 1 << 52},
	{Tokens: 1, Per: 1<<52 + 1},
	{Tokens: 1, Per: 999_999_999_999_999},
	{Tokens: 1, Per: 1_000_000_000_000_000},
	{Tokens: math.MaxInt64, Per: math.MaxInt64},
	{Tokens: 1<<53 + 1, Per: 3},
	policy.PerSecond(1),
	policy.PerSecond(3),
	policy.PerSecond(math.MaxInt64),
}

var bandCaps = []int64{1, 2, 3, 5, 10, 20, 100, 52_125, 4_503_599, 4_503_600, 1 << 40, math.MaxInt64 / 1_000_000_000, math.MaxInt64 - 1, math.MaxInt64}

// genShape draws a shape of 1 to 4 bands; names come from names, so that
// shapes drawn one after the other share some.
func genShape(r *rand.Rand, names []string, primary string) []mBand {
	pick := func() (int64, policy.Rate) {
		c := bandCaps[r.IntN(len(bandCaps))]
		if r.IntN(3) == 0 {
			c = 1 + r.Int64N(30)
		}
		rt := awkwardRates[r.IntN(len(awkwardRates))]
		if r.IntN(4) == 0 {
			rt = policy.Rate{Tokens: 1 + r.Int64N(math.MaxInt64)>>r.IntN(63), Per: time.Duration(1 + r.Int64N(math.MaxInt64)>>r.IntN(63))}
		}
		return c, rt
	}
	c, rt := pick()
	sh := []mBand{{name: primary, capacity: c, tokens: rt.Tokens, per: int64(rt.Per), perSecond: rt.Per == time.Second && r.IntN(2) == 0}}
	for _, i := range r.Perm(len(names))[:r.IntN(min(4, len(names)+1))] {
		c, rt := pick()
		sh = append(sh, mBand{name: names[i], capacity: c, tokens: rt.Tokens, per: int64(rt.Per)})
	}
	return sh
}

// limitOf is the primary band as a policy.Limit.
func (b mBand) limit() policy.Limit {
	if b.perSecond {
		return policy.Limit{Capacity: b.capacity, TokensPerSecond: b.tokens}
	}
	return policy.Limit{Capacity: b.capacity, Refill: policy.Rate{Tokens: b.tokens, Per: time.Duration(b.per)}}
}

// bandSetOf is sh's bands after the primary.
func bandSetOf(t *testing.T, sh []mBand) *policy.BandSet {
	var bs []policy.Band
	for _, b := range sh[1:] {
		bs = append(bs, policy.Band{Name: b.name, Capacity: b.capacity, Refill: policy.Rate{Tokens: b.tokens, Per: time.Duration(b.per)}})
	}
	set, err := policy.NewBands(bs...)
	require.NoError(t, err)
	return set
}

// policyOf is a policy of version v whose default shape is def; with own,
// key gets own through an exact override (named by own's primary), and with
// other an override for another key exists (so the version has overrides
// that do not touch key).
func policyOf(t *testing.T, v int64, def, own []mBand, other bool) policy.Policy {
	l := def[0].limit()
	p := policy.Policy{Version: v, Capacity: l.Capacity, TokensPerSecond: l.TokensPerSecond, Refill: l.Refill, Bands: bandSetOf(t, def)}
	var os []policy.Override
	if own != nil {
		o := own[0].limit()
		os = append(os, policy.Override{Match: "k", Name: own[0].name, Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond,
			Refill: o.Refill, Bands: bandSetOf(t, own)})
	}
	if other {
		os = append(os, policy.Override{Match: "someone else", Capacity: 1, TokensPerSecond: 1})
	}
	set, err := policy.NewOverrideSet(os...)
	require.NoError(t, err)
	p.Overrides = set
	require.NoError(t, p.Validate())
	return p
}

// mState is a key's balance in the model: units per band, and the last
// update; ahead is how long after the last refill's instant that update
// is (it refills nothing before it).
type mState struct {
	sh    []mBand
	units []*big.Int
	last  int64
	ahead int64
}

func (s *mState) refill(now int64) {
	s.ahead = max(s.last-now, 0)
	if now <= s.last {
		return
	}
	el := big.NewInt(now - s.last)
	for i, b := range s.sh {
		u := new(big.Int).Add(s.units[i], new(big.Int).Mul(el, big.NewInt(b.tokens)))
		if full := b.full(); u.Cmp(full) > 0 {
			u = full
		}
		s.units[i] = u
	}
	s.last = now
}

// cutover brings s to cut under its shape, then carries it to next.
func (s *mState) cutover(cut int64, next []mBand) {
	s.refill(cut)
	units := make([]*big.Int, len(next))
	for i, b := range next {
		j := -1
		if i == 0 {
			j = 0
		} else {
			for k := 1; k < len(s.sh); k++ {
				if s.sh[k].name == b.name {
					j = k
				}
			}
		}
		if j < 0 {
			units[i] = b.full()
			continue
		}
		u := new(big.Int).Set(s.units[j])
		if s.sh[j].per != b.per {
			u.Mul(u, big.NewInt(b.per))
			u.Quo(u, big.NewInt(s.sh[j].per))
		}
		if full := b.full(); u.Cmp(full) > 0 {
			u = full
		}
		units[i] = u
	}
	s.sh, s.units = next, units
}

// ceilNs is ceil(x / n) saturated at math.MaxInt64, 0 for x <= 0.
func ceilNs(x *big.Int, n int64) time.Duration {
	if x.Sign() <= 0 {
		return 0
	}
	q, m := new(big.Int).QuoRem(x, big.NewInt(n), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return time.Duration(q.Int64())
}

// answer is the Decision for cost over s as it stands, allowed or not, by
// the binding rule: allowed, the band with the fewest whole tokens; denied,
// the longest wait; ties to the lowest index.
func (s *mState) answer(cost int64, allowed bool, version int64) engine.Decision {
	at := 0
	var waits []time.Duration
	for i, b := range s.sh {
		waits = append(waits, ceilNs(new(big.Int).Sub(mulI(cost, b.per), s.units[i]), b.tokens))
		if allowed && s.tokens(i).Cmp(s.tokens(at)) < 0 {
			at = i
		}
		if !allowed && waits[i] > waits[at] {
			at = i
		}
	}
	b := s.sh[at]
	d := engine.Decision{Allowed: allowed, Remaining: s.tokens(at).Int64(), Version: version, Limit: b.capacity,
		ResetAfter: ceilNs(new(big.Int).Sub(b.full(), s.units[at]), b.tokens), Band: b.name}
	if !allowed {
		d.RetryAfter = waits[at]
	}
	// The waits count from the refill's instant, the time before the last
	// update included (saturated).
	later := func(w time.Duration) time.Duration { return w + min(time.Duration(s.ahead), math.MaxInt64-w) }
	if s.ahead > 0 && !allowed {
		d.RetryAfter = later(d.RetryAfter)
	}
	if s.ahead > 0 && d.ResetAfter > 0 {
		d.ResetAfter = later(d.ResetAfter)
	}
	return d
}

func (s *mState) tokens(i int) *big.Int { return new(big.Int).Quo(s.units[i], big.NewInt(s.sh[i].per)) }

// decide admits cost if every band holds it.
func (s *mState) decide(cost int64, version int64) engine.Decision {
	ok := true
	for i, b := range s.sh {
		if s.units[i].Cmp(mulI(cost, b.per)) < 0 {
			ok = false
		}
	}
	if ok {
		for i, b := range s.sh {
			s.units[i] = new(big.Int).Sub(s.units[i], mulI(cost, b.per))
		}
	}
	return s.answer(cost, ok, version)
}

// peek answers a request of one token, taking nothing.
func (s *mState) peek(version int64) engine.Decision {
	ok := true
	for i, b := range s.sh {
		if s.units[i].Cmp(big.NewInt(b.per)) < 0 {
			ok = false
		}
	}
	return s.answer(1, ok, version)
}

// refund credits tokens to every band, capped.
func (s *mState) refund(tokens int64) {
	for i, b := range s.sh {
		u := new(big.Int).Add(s.units[i], mulI(tokens, b.per))
		if full := b.full(); u.Cmp(full) > 0 {
			u = full
		}
		s.units[i] = u
	}
}

func minCap(sh []mBand) int64 {
	c := sh[0].capacity
	for _, b := range sh[1:] {
		c = min(c, b.capacity)
	}
	return c
}

// rateText is a band's rate as the bucket records it: "N" per second,
// "N/P" otherwise.
func rateText(b mBand) string {
	if b.per == int64(time.Second) {
		return fmt.Sprint(b.tokens)
	}
	return fmt.Sprintf("%d/%d", b.tokens, b.per)
}

// raw is the bucket as Redis holds it, written at version.
func (s *mState) raw(version int64) string {
	var x strings.Builder
	for _, u := range s.units[1:] {
		x.WriteString(" " + u.String())
	}
	return fmt.Sprintf("%s %d %d %d %s%s", s.units[0], s.last, version, s.sh[0].capacity, rateText(s.sh[0]), x.String())
}

// genUnits draws a balance of band b: empty, full, a unit short, or any.
func genUnits(r *rand.Rand, b mBand) *big.Int {
	full := b.full()
	switch r.IntN(5) {
	case 0:
		return new(big.Int)
	case 1:
		return full
	case 2:
		u := new(big.Int).Sub(full, big.NewInt(1))
		if u.Sign() < 0 {
			u.SetInt64(0)
		}
		return u
	}
	return new(big.Int).Rand(randBig(r), new(big.Int).Add(full, big.NewInt(1)))
}

// genTimes draws a last update and a later (or, sometimes, earlier or
// equal) instant, over the whole int64 range.
func genTimes(r *rand.Rand) (last, now int64) {
	pick := func() int64 {
		switch r.IntN(3) {
		case 0:
			return []int64{0, 1, 999_999_999, 1e9, 1 << 52, 9e15, 9_000_000_999_999_999, math.MaxInt64 / 2}[r.IntN(8)]
		case 1:
			return r.Int64N(1e12)
		}
		return r.Int64N(math.MaxInt64) >> r.IntN(63)
	}
	last = pick()
	switch r.IntN(5) {
	case 0:
		return last, last
	case 1:
		return last, last - r.Int64N(last+1)
	}
	return last, last + min(pick(), math.MaxInt64-last)
}

// bandRig runs band cases through real stores sharing one Redis client and
// one clock, each case with a store and prefix of its own.
type bandRig struct {
	rdb *redis.Client
	clk *setClock
}

func newBandRig(t *testing.T) *bandRig {
	return &bandRig{rdb: client(t, redisAddr(t)), clk: &setClock{}}
}

// op is what a case asks of the bucket: "a" Allow, "p" Peek, "r" Refund.
type bandOp struct {
	kind string
	cost int64
}

// run asks op of key "k" on s and compares the answer and the bucket left
// in Redis with the model's.
func (rig *bandRig) run(t *testing.T, s *redisstore.Store, pfx string, m *mState, exists bool, op bandOp, version int64, what string) {
	ctx := context.Background()
	key := redisstore.BucketKey(pfx, "k")
	before, _ := rig.rdb.Get(ctx, key).Result()
	before = redisstore.DecimalBucket(before)
	var got engine.Decision
	var err error
	switch op.kind {
	case "a":
		got, err = s.Allow(ctx, "k", op.cost)
	case "p":
		got, err = s.Peek(ctx, "k")
	case "r":
		got, err = s.Refund(ctx, "k", op.cost)
	}
	if op.kind == "a" && op.cost > minCap(m.sh) {
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, what)
		require.Zero(t, got, what)
		after, _ := rig.rdb.Get(ctx, key).Result()
		require.Equal(t, before, after, "%s: a refused cost changed the bucket", what)
		return
	}
	require.NoError(t, err, what)
	var want engine.Decision
	switch op.kind {
	case "a":
		want = m.decide(op.cost, version)
	case "p":
		want = m.peek(version)
	case "r":
		if exists {
			m.refund(op.cost)
		}
		want = m.peek(version)
	}
	require.Equal(t, want, got, what)
	after, err := rig.rdb.Get(ctx, key).Result()
	after = redisstore.DecimalBucket(after)
	switch {
	case op.kind == "a" && !got.Allowed && exists && after == redisstore.DecimalBucket(before):
		// A denial need not write: the bucket it left refills to the
		// model's state.
		left, v := stateOf(t, after, m.sh)
		left.refill(rig.clk.now.Load())
		require.Equal(t, m.raw(v), left.raw(v), "%s: the bucket a denial left", what)
		require.Equal(t, version, v, "%s: a denial left a bucket of another version", what)
	case op.kind == "p", op.kind == "r" && !exists:
		if exists {
			require.Equal(t, before, after, "%s: a peek wrote the bucket", what)
		} else {
			require.ErrorIs(t, err, redis.Nil, "%s: created a bucket", what)
		}
	default:
		require.NoError(t, err, what)
		require.Equal(t, m.raw(version), after, "%s: the bucket written back", what)
	}
}

// TestScriptBandsMatchModel writes a bucket of random shape and balance
// into Redis, asks one Allow, Peek or Refund of it, and compares the
// Decision and the bucket written back with the math/big model, over
// awkward periods, 1 to 4 bands, and random and extreme values of the
// whole int64 range. A shape of one band per second is the plain bucket
// (the double fast path or the limbs, by capacity), one band of another
// period takes the fast path when capacity*P < 2^52, bands the limbs.
func TestScriptBandsMatchModel(t *testing.T) {
	skipUnderRace(t)
	r := rand.New(rand.NewPCG(23, 5))
	rig := newBandRig(t)
	names := []string{"daily", "burst", "a b", "x,y:z"}
	for i := range 700 {
		sh := genShape(r, names, "")
		if r.IntN(4) == 0 {
			sh = sh[:1] // one band, of any period
		}
		m := &mState{sh: sh}
		for _, b := range sh {
			m.units = append(m.units, genUnits(r, b))
		}
		var now int64
		m.last, now = genTimes(r)
		exists := r.IntN(8) != 0
		op := bandOp{kind: []string{"a", "a", "a", "p", "r"}[r.IntN(5)]}
		switch c := minCap(sh); {
		case op.kind == "r":
			op.cost = []int64{1, 1 + r.Int64N(c), c, math.MaxInt64, 1 + r.Int64N(math.MaxInt64)}[r.IntN(5)]
		case r.IntN(10) == 0 && c < math.MaxInt64:
			op.cost = c + 1 + r.Int64N(math.MaxInt64-c) // above some band's capacity
		default:
			op.cost = []int64{1, c, 1 + r.Int64N(c)}[r.IntN(3)]
		}
		what := fmt.Sprintf("case %d: shape %+v, units %v, last %d, now %d, exists %v, op %+v", i, sh, m.units, m.last, now, exists, op)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			cfg := redisstore.Config{Client: rig.rdb, Prefix: prefix(t), Policy: policyOf(t, 1, sh, nil, false)}
			s := newStore(t, cfg, rig.clk)
			if exists {
				require.NoError(t, rig.rdb.Set(context.Background(), redisstore.BucketKey(cfg.Prefix, "k"), m.raw(1), 0).Err())
			} else {
				m.units = nil
				for _, b := range sh {
					m.units = append(m.units, b.full()) // a new key starts full
				}
				m.last = now
			}
			rig.clk.now.Store(now)
			m.refill(now)
			rig.run(t, s, cfg.Prefix, m, exists, op, 1, what)
		})
	}
}

// TestScriptBandCutoversMatchModel: a bucket written under version 1 meets
// 1 to 3 cutovers it missed, each to a random shape (bands kept, reshaped,
// re-perioded, renamed, added and dropped), some given to the key by an
// override, some versions with overrides for other keys only, so the
// script replays the history with the key's chain. Then one Allow, Peek or
// Refund, compared with the model to the unit.
func TestScriptBandCutoversMatchModel(t *testing.T) {
	skipUnderRace(t)
	r := rand.New(rand.NewPCG(23, 6))
	rig := newBandRig(t)
	names := []string{"daily", "burst", "hourly"}
	for i := range 400 {
		type version struct {
			def, own []mBand
			other    bool
			at       int64 // the cutover instant
		}
		gen := func() version {
			v := version{def: genShape(r, names, ""), other: r.IntN(3) == 0}
			if r.IntN(2) == 0 {
				v.own = genShape(r, names, []string{"", "gold", "silver"}[r.IntN(3)])
			}
			return v
		}
		vs := []version{gen()}
		last := r.Int64N(1e13)
		at := max(0, last-r.Int64N(1e9)) // the first version was installed around then
		vs[0].at = at
		for range 1 + r.IntN(3) {
			v := gen()
			step := []int64{0, 1, 7, 999_999_999, r.Int64N(1e12), r.Int64N(1e15), r.Int64N(1e17)}[r.IntN(7)]
			at = min(at+step, math.MaxInt64/4)
			if len(vs) == 1 {
				at = max(at, last-r.Int64N(2)) // the first cutover at, or just before, the bucket's last update
			}
			v.at = at
			vs = append(vs, v)
		}
		shapeOf := func(v version) []mBand {
			if v.own != nil {
				return v.own
			}
			return v.def
		}
		m := &mState{sh: shapeOf(vs[0]), last: last}
		for _, b := range m.sh {
			m.units = append(m.units, genUnits(r, b))
		}
		now := at + []int64{0, 1, r.Int64N(1e10), r.Int64N(1e16)}[r.IntN(4)]
		top := int64(len(vs))
		final := shapeOf(vs[len(vs)-1])
		op := bandOp{kind: []string{"a", "a", "p", "r"}[r.IntN(4)]}
		c := minCap(final)
		op.cost = []int64{1, c, 1 + r.Int64N(c)}[r.IntN(3)]
		what := fmt.Sprintf("case %d: units %v, last %d, now %d, op %+v", i, m.units, last, now, op)
		for k, v := range vs {
			what += fmt.Sprintf("\n  v%d at %d: default %+v own %+v other %v", k+1, v.at, v.def, v.own, v.other)
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ctx := context.Background()
			rig.clk.now.Store(vs[0].at)
			cfg := redisstore.Config{Client: rig.rdb, Prefix: prefix(t), Policy: policyOf(t, 1, vs[0].def, vs[0].own, vs[0].other)}
			s := newStore(t, cfg, rig.clk)
			for k, v := range vs[1:] {
				rig.clk.now.Store(v.at)
				require.NoError(t, s.ReplacePolicy(ctx, policyOf(t, int64(k+2), v.def, v.own, v.other), int64(k+1)), what)
			}
			// written after the cutovers, as a bucket last touched under version 1
			require.NoError(t, rig.rdb.Set(ctx, redisstore.BucketKey(cfg.Prefix, "k"), m.raw(1), 0).Err())
			for _, v := range vs[1:] {
				m.cutover(v.at, shapeOf(v))
			}
			rig.clk.now.Store(now)
			m.refill(now)
			rig.run(t, s, cfg.Prefix, m, true, op, top, what)
		})
	}
}

// TestBandBucketLayout pins the bytes a bucket takes in Redis: a plain key
// (one band per second, however it is given) keeps the layout it always
// had, one band of another period writes its rate as N/P, and each band
// adds its units.
func TestBandBucketLayout(t *testing.T) {
	ctx := context.Background()
	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)},
		policy.Band{Name: "a b", Capacity: 3, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		p    policy.Policy
		want string
	}{
		{"TokensPerSecond", policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 5}, "9000000000 2000000000 1 10 5"},
		{"Refill per second", policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerSecond(5)}, "9000000000 2000000000 1 10 5"},
		{"Refill per minute", policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100)}, "540000000000 2000000000 1 10 100/60000000000"},
		{"bands", policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 5, Bands: daily},
			"9000000000 2000000000 1 10 5 1641600000000000 6000000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &setClock{}
			clk.now.Store(2e9)
			cfg := redisstore.Config{Client: client(t, redisAddr(t)), Prefix: prefix(t), Policy: tc.p}
			s := newStore(t, cfg, clk)
			_, err := s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			got, err := cfg.Client.Get(ctx, redisstore.BucketKey(cfg.Prefix, "k")).Result()
			require.NoError(t, err)
			require.Equal(t, tc.want, redisstore.DecimalBucket(got))
			hist, err := cfg.Client.LRange(ctx, redisstore.GlobalKey(cfg.Prefix, "history"), 0, -1).Result()
			require.NoError(t, err)
			wantHist := fmt.Sprintf("1 2000000000 10 %s 0", strings.Fields(tc.want)[4])
			if tc.p.Bands != nil {
				wantHist += " " + hex.EncodeToString([]byte("daily")) + ":20:20/86400000000000," + hex.EncodeToString([]byte("a b")) + ":3:7/3000000000"
			}
			require.Equal(t, []string{wantHist}, hist, "the history entry")
		})
	}
}
