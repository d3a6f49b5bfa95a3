package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestScriptDebtMatchesPolicy runs random traces of Charge, Allow and
// Refund, with the clock moving by small and huge steps, through the
// script, and compares every Decision with the policy package's exact
// arithmetic for debts (ChargeLevels, DecideLevels, Credit, RefillLevels),
// over capacities, rates and periods across the whole int64 range: on the
// fast path (a compact bucket, its T a negative double in debt) and on the
// general path (signed decimal units, with bands).
func TestScriptDebtMatchesPolicy(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	r := rand.New(rand.NewPCG(41, 5))
	extremes := []int64{1, 2, 3, 7, 1000, 999_999_999, 1_000_000_000, 1_000_000_001, 1 << 31, 4_503_599, 1<<52 - 1, 1 << 52, 1<<52 + 1,
		1<<53 + 1, math.MaxInt64 / 1_000_000_000, math.MaxInt64 - 1, math.MaxInt64}
	pick := func() int64 {
		switch r.IntN(3) {
		case 0:
			return extremes[r.IntN(len(extremes))]
		case 1:
			return 1 + r.Int64N(1000)
		}
		return 1 + r.Int64N(math.MaxInt64)>>r.IntN(63)
	}
	pers := []time.Duration{time.Nanosecond, time.Millisecond, time.Second, time.Minute, 24 * time.Hour, 7777777 * time.Second, math.MaxInt64}
	rate := func() policy.Rate {
		return policy.Rate{Tokens: pick(), Per: pers[r.IntN(len(pers))]}
	}
	traces := 200
	if testing.Short() {
		traces = 40
	}
	var debts, floors, cuts int
	for i := range traces {
		p := policy.Policy{Version: 1, Capacity: pick(), Refill: rate()}
		if r.IntN(3) == 0 {
			p.Capacity, p.Refill = 1+r.Int64N(1000), policy.Rate{Tokens: 1 + r.Int64N(100), Per: time.Second} // the fast path
		}
		if r.IntN(3) == 0 {
			bs, err := policy.NewBands(policy.Band{Name: "b", Capacity: pick(), Refill: rate()})
			require.NoError(t, err)
			p.Bands = bs
		}
		if err := p.Validate(); err != nil {
			continue
		}
		next := func(version int64) policy.Policy {
			q := policy.Policy{Version: version, Capacity: pick(), Refill: rate()}
			if r.IntN(2) == 0 {
				q.Capacity, q.Refill = 1+r.Int64N(1000), policy.Rate{Tokens: 1 + r.Int64N(100), Per: pers[r.IntN(len(pers))]}
			}
			if r.IntN(2) == 0 {
				bs, err := policy.NewBands(policy.Band{Name: "b", Capacity: pick(), Refill: rate()})
				require.NoError(t, err)
				q.Bands = bs
			}
			return q
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			d, f, c := debtTrace(t, r, p, pick, next)
			debts, floors, cuts = debts+d, floors+f, cuts+c
		})
	}
	t.Logf("%d answers in debt, %d of them at a floor; %d cutovers of a key in debt", debts, floors, cuts)
	require.Positive(t, cuts, "no cutover of a key in debt")
	require.Positive(t, debts-floors, "no debt short of the floor was exercised")
	require.Positive(t, floors, "no floor was exercised")
}

// debtTrace plays one random trace on a fresh store and checks each answer.
// It returns how many answers were in debt, how many at a floor, and how
// many cutovers met the key in debt.
// next draws a policy to cut over to.
func debtTrace(t *testing.T, r *rand.Rand, p policy.Policy, pick func() int64, next func(int64) policy.Policy) (debts, floors, cuts int) {
	clk := &setClock{}
	now := r.Int64N(1 << 62)
	clk.now.Store(now)
	s := newStore(t, redisstore.Config{Policy: p}, clk)
	ctx := context.Background()
	sh := p.Shape()
	lv := make([]policy.Level, sh.Len())
	for i := range lv {
		lv[i] = policy.Level{Tokens: sh.Band(i).Capacity}
	}
	last := now
	minCap := sh.Primary.Capacity
	for i := 1; i < sh.Len(); i++ {
		minCap = min(minCap, sh.Band(i).Capacity)
	}
	var log []string
	exists := false // whether the store has written the key's bucket
	for step := range 40 {
		switch r.IntN(4) {
		case 0:
			now += min(pick()>>r.IntN(40), math.MaxInt64-now)
		case 1:
			now += min(r.Int64N(3_000_000_000), math.MaxInt64-now)
		}
		clk.now.Store(now)
		policy.RefillLevels(sh, lv, now-last)
		last = now
		var o policy.Outcome
		var at int
		var got engine.Decision
		var err error
		var op string
		if r.IntN(8) == 0 {
			q := next(p.Version + 1)
			if q.Validate() == nil {
				require.NoError(t, s.ReplacePolicy(ctx, q, p.Version))
				log = append(log, fmt.Sprintf("cutover at %d to %+v %+v", now, q, q.Bands))
				nsh := q.Shape()
				for _, v := range lv {
					if v.Tokens < 0 {
						cuts++
						break
					}
				}
				out := make([]policy.Level, nsh.Len())
				policy.CutoverLevels(sh, lv, nsh, out)
				if !exists { // a key never written is full under the new limit
					for i := range out {
						out[i] = policy.FullLevel(nsh.Band(i))
					}
				}
				p, sh, lv = q, nsh, out
				minCap = sh.Primary.Capacity
				for i := 1; i < sh.Len(); i++ {
					minCap = min(minCap, sh.Band(i).Capacity)
				}
			}
		}
		switch k := r.IntN(5); {
		case k <= 1:
			n := pick()
			if r.IntN(2) == 0 {
				n = 1 + r.Int64N(minCap) // a debt short of the floor, often
			}
			op = fmt.Sprintf("Charge %d at %d", n, now)
			got, err = s.Charge(ctx, "k", n)
			o, at = policy.ChargeLevels(sh, lv, n)
			exists = true
		case k <= 3:
			n := 1 + r.Int64N(minCap)
			if r.IntN(2) == 0 {
				n = min(pick(), minCap)
			}
			op = fmt.Sprintf("Allow %d at %d", n, now)
			got, err = s.Allow(ctx, "k", n)
			o, at = policy.DecideLevels(sh, lv, n)
			exists = exists || o.Allowed
		default:
			n := pick()
			op = fmt.Sprintf("Refund %d at %d", n, now)
			got, err = s.Refund(ctx, "k", n)
			for i := range lv {
				lv[i].Credit(sh.Band(i), n)
			}
			o, at = policy.PeekLevels(sh, lv)
		}
		log = append(log, op)
		require.NoError(t, err, "policy %+v, ops %v", p, log)
		want := engine.Decision{Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: time.Duration(o.RetryAfter), Version: p.Version,
			Limit: sh.Band(at).Capacity, ResetAfter: time.Duration(o.ResetAfter), Band: sh.BandName(at)}
		require.Equal(t, want, got, "step %d, policy %+v bands %+v, levels %+v, ops %v", step, p, p.Bands, lv, log)
		if o.Remaining < 0 {
			debts++
			if o.Remaining == -sh.Band(at).Capacity {
				floors++
			}
		}
	}
	return debts, floors, cuts
}
