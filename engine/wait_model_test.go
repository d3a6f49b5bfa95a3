package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// waitBand is one band of a random key limit for the Wait model: its
// capacity, its rate of n tokens per p ns, and its name ("" for the
// primary).
type waitBand struct {
	name    string
	c, n, p int64
}

// randWaitPolicy draws a policy of one to four bands with odd rates: a rate
// per second, or per a period of 1 ns to past 2^32 ns (a band's balance then
// in its general form).
func randWaitPolicy(t *testing.T, r *rand.Rand) (policy.Policy, []waitBand) {
	rate := func() (int64, int64) {
		switch r.IntN(4) {
		case 0:
			return 1 + r.Int64N(1_000), int64(time.Second)
		case 1:
			return 1 + r.Int64N(7), 1 + r.Int64N(50)
		case 2:
			return 1 + r.Int64N(1_000), 1 + r.Int64N(int64(3*time.Second))
		default:
			return 1 + r.Int64N(100), 1<<32 + r.Int64N(int64(time.Minute))
		}
	}
	var bs []waitBand
	p := policy.Policy{Version: 1, Capacity: 1 + r.Int64N(200)}
	n, per := rate()
	if per == int64(time.Second) {
		p.TokensPerSecond = n
	} else {
		p.Refill = policy.Rate{Tokens: n, Per: time.Duration(per)}
	}
	bs = append(bs, waitBand{"", p.Capacity, n, per})
	var extra []policy.Band
	for i := range r.IntN(4) {
		c := 1 + r.Int64N(200)
		n, per := rate()
		name := fmt.Sprintf("b%d", i)
		extra = append(extra, policy.Band{Name: name, Capacity: c, Refill: policy.Rate{Tokens: n, Per: time.Duration(per)}})
		bs = append(bs, waitBand{name, c, n, per})
	}
	p.Bands = bands(t, extra...)
	return p, bs
}

// TestWaitModel: a key drained at t0 (by Allow, or by Charge into debt)
// and waited on at a later instant for cost tokens: Wait sleeps, with no
// second decision, until the first instant T at which every band holds the
// cost (math/big, from the documented refill), is not admitted at T-1 and
// is admitted at T, having taken exactly cost from every band.
func TestWaitModel(t *testing.T) {
	const seed = 20240611
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range 300 {
		p, bs := randWaitPolicy(t, r)
		minCap := bs[0].c
		for _, b := range bs {
			minCap = min(minCap, b.c)
		}
		charge := r.IntN(3) == 0
		drain := 1 + r.Int64N(minCap)
		if charge {
			drain = 1 + r.Int64N(3*minCap)
		}
		cost := 1 + r.Int64N(minCap)
		t0 := r.Int64N(int64(time.Hour))
		asked := t0 + r.Int64N(50)
		name := fmt.Sprintf("seed %d case %d: %+v bands %+v charge %v drain %d cost %d t0 %d asked %d", seed, i, p, bs, charge, drain, cost, t0, asked)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			waitModelCase(t, name, p, bs, charge, drain, cost, t0, asked)
		})
	}
}

func waitModelCase(t *testing.T, name string, p policy.Policy, bs []waitBand, charge bool, drain, cost, t0, asked int64) {
	// The model: each band's units at t0, after the drain; the instant T.
	big0 := func(v int64) *big.Int { return big.NewInt(v) }
	units := make([]*big.Int, len(bs))
	T := t0
	for i, b := range bs {
		left := b.c - drain
		if left < -b.c {
			left = -b.c // a debt is floored at minus the capacity
		}
		units[i] = new(big.Int).Mul(big0(left), big0(b.p))
		need := new(big.Int).Sub(new(big.Int).Mul(big0(cost), big0(b.p)), units[i])
		if need.Sign() > 0 {
			w := new(big.Int).Add(need, big0(b.n-1))
			w.Div(w, big0(b.n)) // ceil(need / n)
			require.True(t, w.IsInt64(), name)
			T = max(T, t0+w.Int64())
		}
	}
	// The decision at max(T, asked): every band refilled, cost taken.
	at := max(T, asked)
	bind, remain := -1, int64(0)
	var reset time.Duration
	for i, b := range bs {
		u := new(big.Int).Add(units[i], new(big.Int).Mul(big0(at-t0), big0(b.n)))
		if full := new(big.Int).Mul(big0(b.c), big0(b.p)); u.Cmp(full) > 0 {
			u = full
		}
		u.Sub(u, new(big.Int).Mul(big0(cost), big0(b.p)))
		rem := new(big.Int).Div(u, big0(b.p)).Int64() // floor: the divisor is positive
		if bind < 0 || rem < remain {
			bind, remain = i, rem
			def := new(big.Int).Sub(new(big.Int).Mul(big0(b.c), big0(b.p)), u)
			def.Add(def, big0(b.n-1))
			def.Div(def, big0(b.n))
			reset = time.Duration(def.Int64())
		}
	}
	want := engine.Decision{Allowed: true, Remaining: remain, Version: 1, Limit: bs[bind].c, ResetAfter: reset, Band: bs[bind].name}

	synctest.Test(t, func(t *testing.T) {
		e, clk := newEngine(t, engine.Config{Policy: p})
		clk.Set(t0)
		ctx := context.Background()
		var err error
		if charge {
			_, err = e.Charge(ctx, "k", drain)
		} else {
			var d engine.Decision
			d, err = e.Allow(ctx, "k", drain)
			require.True(t, d.Allowed, name)
		}
		require.NoError(t, err, name)
		clk.Set(asked)
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(ctx, "k", cost)
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		if T > asked {
			select {
			case r := <-got:
				t.Fatalf("%s: Wait returned at %d, want at %d: %+v", name, asked, T, r)
			default:
			}
			clk.Set(T - 1)
			synctest.Wait()
			select {
			case r := <-got:
				t.Fatalf("%s: Wait returned at T-1 = %d: %+v", name, T-1, r)
			default:
			}
			clk.Set(T)
			synctest.Wait()
		}
		var r waitResult
		select {
		case r = <-got:
		default:
			require.NoError(t, e.Close())
			r = <-got
			t.Fatalf("%s: Wait still waits at T = %d (then %v)", name, T, r.err)
		}
		require.NoError(t, r.err, name)
		require.Equal(t, want, r.d, name)
		st := e.Stats()
		wantDenied := uint64(0)
		if T > asked {
			wantDenied = 1
		}
		require.Equal(t, wantDenied, st.Total.Denied, "%s: Wait decided more than once", name)
	})
}

// TestWaitDeadlineModel: a deadline shorter than the exact wait returns
// ErrWouldExceedDeadline at once, spending nothing; one exactly as long
// waits.
func TestWaitDeadlineModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.Rate{Tokens: 3, Per: 7}}
		e, clk := newEngine(t, engine.Config{Policy: p})
		ctx := context.Background()
		_, err := e.Allow(ctx, "k", 10)
		require.NoError(t, err)
		clk.Set(5) // 15 units of 7 a token
		// 4 tokens are 28 units: 13 missing, ceil(13/3) = 5 ns.
		short, cancel := context.WithTimeout(ctx, 4)
		defer cancel()
		_, err = e.Wait(short, "k", 4)
		require.True(t, errors.Is(err, engine.ErrWouldExceedDeadline), "%v", err)
		exact, cancel2 := context.WithTimeout(ctx, 5)
		defer cancel2()
		got := make(chan waitResult, 1)
		go func() {
			d, err := e.Wait(exact, "k", 4)
			got <- waitResult{d, err}
		}()
		synctest.Wait()
		clk.Set(10)
		r := <-got
		require.NoError(t, r.err)
		require.True(t, r.d.Allowed)
	})
}
