package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestRacingLengtheningCutovers: two processes race ReplacePolicy with
// the same expectedVersion (exactly one must win each round), every cutover
// lengthens times-to-full (a higher capacity, a lower rate), and two more
// processes run Allow and EvictFull against the real server's TIME all the
// while. Afterwards every bucket must be at the version in force, with no
// pending flag or lock left, and must expire no earlier than the exact
// instant it is full (PEXPIRETIME against the stored state).
func TestRacingLengtheningCutovers(t *testing.T) {
	addr := redisAddr(t)
	const keys = 3000
	p := prefix(t)
	stores := realStores(t, addr, 4, redisstore.Config{
		Prefix:  p,
		Policy:  policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1000},
		Timeout: 10 * time.Second,
	})
	admin := stores[:2]
	users := stores[2:]
	c := client(t, addr)
	ctx := context.Background()

	// every key exists, part spent
	reqs := make([]engine.Request, keys)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprint("k", i), Cost: int64(1 + i%900)}
	}
	out := make([]engine.Result, keys)
	require.NoError(t, users[0].AllowBatch(ctx, reqs, out))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	for w, s := range users {
		r := rand.New(rand.NewPCG(uint64(w), 5))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if w == 1 && r.IntN(50) == 0 {
					_, err := s.EvictFull(ctx)
					assert.NoError(t, err)
					continue
				}
				_, err := s.Allow(ctx, fmt.Sprint("k", r.IntN(keys)), 1+r.Int64N(50))
				assert.NoError(t, err)
				calls.Add(1)
			}
		})
	}

	version := int64(1)
	capacity, rate := int64(1000), int64(1000)
	for round := range 6 {
		capacity, rate = capacity+500, max(1, rate-100) // lengthens
		var wins, stale atomic.Int64
		var rw sync.WaitGroup
		for i, s := range admin {
			next := policy.Policy{Version: version + 1, Capacity: capacity + int64(i), TokensPerSecond: rate}
			rw.Go(func() {
				err := s.ReplacePolicy(ctx, next, version)
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, engine.ErrStalePolicy):
					stale.Add(1)
				default:
					t.Errorf("round %d: %v", round, err)
				}
			})
		}
		rw.Wait()
		require.Equal(t, int64(1), wins.Load(), "round %d: exactly one winner", round)
		version++
		// let Allow traffic run under the new version before the next round
		for seen := calls.Load(); calls.Load() < seen+50; {
			runtime.Gosched()
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d Allow calls during 6 cutovers", calls.Load())

	_, _, pendings := redisstore.ShardStateKeys(p)
	require.Zero(t, c.Exists(ctx, pendings...).Val(), "pending flag left set")
	require.Zero(t, c.Exists(ctx, redisstore.GlobalKey(p, "lock")).Val(), "lock left held")
	cur := stores[0].Policy()
	early := 0
	var worst *big.Int
	iter := c.Scan(ctx, 0, p+"{*}k:*", 1000).Iterator()
	n := 0
	for key := range iter.Vals(ctx) {
		if c.Exists(ctx, key).Val() == 0 {
			continue // expired meanwhile: it was full
		}
		b := readBucket(t, c, key)
		if b.gone {
			continue // expired between SCAN and the read: it was full
		}
		n++
		require.Equal(t, version, b.version, "%s at version %d", key, b.version)
		if b.expireAtMs < 0 {
			continue // none: allowed only until touched (a failed post pass)
		}
		at := new(big.Int).Mul(big.NewInt(b.expireAtMs), big.NewInt(1e6))
		if at.Cmp(b.fullAtNs) < 0 {
			early++
			d := new(big.Int).Sub(b.fullAtNs, at)
			if worst == nil || d.Cmp(worst) > 0 {
				worst = d
			}
		}
	}
	require.NoError(t, iter.Err())
	t.Logf("%d buckets checked, version %d (%+v)", n, version, cur)
	require.Zero(t, early, "%d buckets expire before they are full, the worst by %v ns", early, worst)
}
