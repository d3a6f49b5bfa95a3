package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// Close under load gives every unspent token back: with the clock still,
// what was admitted plus what the buckets hold is every bucket's capacity.
func TestLeaseCloseUnderLoadReturnsAll(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	const keys = 64
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var started sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i == 2000 {
					started.Done()
				}
				d, err := a.Allow(ctx, fmt.Sprintf("k%d", (i*7+g)%keys), 1)
				if errors.Is(err, engine.ErrClosed) {
					if i < 2000 {
						started.Done()
					}
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	started.Wait()
	require.NoError(t, a.Close())
	wg.Wait()
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	var held int64
	for k := range keys {
		d, err := b.Peek(ctx, fmt.Sprintf("k%d", k))
		require.NoError(t, err)
		held += d.Remaining
	}
	st := a.Stats()
	require.Equal(t, int64(keys)*p.Capacity, admitted.Load()+held, "tokens neither admitted nor back in Redis; stats %+v", st)
}
