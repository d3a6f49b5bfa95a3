package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestExpiryRandomStates: raw bucket states (fast and general path)
// written under the server's TIME, one Allow, then the expiry is checked
// against the exact full instant of the state written back.
func TestExpiryRandomStates(t *testing.T) {
	skipUnderRace(t)
	r := rand.New(rand.NewPCG(9, 9))
	c := client(t, redisAddr(t))
	ctx := context.Background()
	caps := []int64{1, 2, 3, 1000, 4_503_598, 4_503_599, 4_503_600, 1 << 40, math.MaxInt64}
	rates := []int64{1, 2, 3, 7, 1000, 999_999_999, 1e9, 1 << 40, 1 << 52, 1 << 53, math.MaxInt64}
	for i := range 300 {
		capacity, rate := caps[r.IntN(len(caps))], rates[r.IntN(len(rates))]
		if r.IntN(2) == 0 {
			capacity = 1 + r.Int64N(4_503_599)
		}
		p := prefix(t)
		s := realStores(t, redisAddr(t), 1, redisstore.Config{Client: c, Prefix: p,
			Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate}})[0]
		full := new(big.Int).Mul(big.NewInt(capacity), big.NewInt(1e9))
		u := new(big.Int).Rand(randBig(r), full)
		now := serverTime(t, c).UnixNano()
		last := now - r.Int64N(5e9) + 2e9 // sometimes in the future
		key := fmt.Sprint("k", i)
		set := fmt.Sprintf("%s %d 1 %d %d", u, last, capacity, rate)
		require.NoError(t, c.Set(ctx, redisstore.BucketKey(p, key), set, 0).Err())
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err)
		if !d.Allowed && c.Get(ctx, redisstore.BucketKey(p, key)).Val() == set {
			continue // a denial need not write: the bucket and its expiry stand
		}
		if c.Exists(ctx, redisstore.BucketKey(p, key)).Val() == 0 {
			continue
		}
		readBucket(t, c, redisstore.BucketKey(p, key)).checkExpiry(t, fmt.Sprintf("cap %d rate %d units %s last %d", capacity, rate, u, last))
	}
}
