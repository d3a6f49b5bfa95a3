package redisstore_test

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestFillsNoSlowerCoversDebts: a cutover keeps every expiry only if no
// balance the new band can hold, from minus its capacity (a debt) to its
// capacity, takes longer to fill under it than under the old band. Checked
// against every whole balance, exactly, over random small bands; and the
// case where a charged key would otherwise expire in debt: capacity 100 at
// 1 a second to 10 at 1 every 10 s, where -10 takes 200 s to fill, not 110.
func TestFillsNoSlowerCoversDebts(t *testing.T) {
	a := policy.Limit{Capacity: 100, TokensPerSecond: 1}
	b := policy.Limit{Capacity: 10, Refill: policy.Rate{Tokens: 1, Per: 10 * time.Second}}
	require.False(t, redisstore.FillsNoSlower(a, b), "a debt of 10 would take 200 s, its expiry 110 s")
	require.True(t, redisstore.FillsNoSlower(a, policy.Limit{Capacity: 10, TokensPerSecond: 1}), "a lower capacity at the same rate")
	require.True(t, redisstore.FillsNoSlower(a, a), "the same band")

	// ns to fill band l from x tokens: (C-x)*P/N, as a rational.
	fill := func(l policy.Limit, x int64) *big.Rat {
		r := l.Rate()
		return new(big.Rat).SetFrac(
			new(big.Int).Mul(big.NewInt(l.Capacity-x), big.NewInt(int64(r.Per))),
			big.NewInt(r.Tokens))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	band := func() policy.Limit {
		return policy.Limit{Capacity: 1 + rng.Int64N(20),
			Refill: policy.Rate{Tokens: 1 + rng.Int64N(5), Per: time.Duration(1+rng.Int64N(5)) * time.Second}}
	}
	for range 20000 {
		a, b := band(), band()
		want := true
		for x := -b.Capacity; x <= b.Capacity; x++ {
			old := fill(a, max(x, -a.Capacity)) // what the bucket's expiry was set for, before the clamp
			if x > a.Capacity || fill(b, x).Cmp(old) > 0 {
				want = false
				break
			}
		}
		require.Equal(t, want, redisstore.FillsNoSlower(a, b), "%+v to %+v", a, b)
	}
}
