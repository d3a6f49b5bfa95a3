package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeasePeekAtMostLimit: Peek adds what the process's lease holds to
// Redis's answer, at most Limit: once the bucket has refilled to full
// behind a lease, the sum passes the capacity, and Peek reports the
// capacity, never more.
func TestLeasePeekAtMostLimit(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	held := holding(t, a, b, "k", 100)
	require.Positive(t, held)
	clk.Advance(200 * time.Second) // the bucket refills to full behind the lease
	ctx := context.Background()
	pb, err := b.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, p.Capacity, pb.Remaining, "the bucket alone is full")
	pa, err := a.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, p.Capacity, pa.Remaining, "a full bucket plus a lease of %d: %+v", held, pa)
	require.Equal(t, p.Capacity, pa.Limit)
}
