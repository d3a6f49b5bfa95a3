package promstats_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats"
)

// TestBatchErrorIsNoDecision: decisions_total counts "each
// request of an AllowBatch" that was decided; a batch request that ended
// with an error is in errors_total ("calls and batch requests that ended
// with an error"), not a decision.
func TestBatchErrorIsNoDecision(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 2, 1), Shards: 1})
	c := newCollector(t, e)
	out := make([]engine.Result, 2)
	require.NoError(t, e.AllowBatch(context.Background(), []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 5}}, out))
	require.NoError(t, out[0].Err)
	require.ErrorIs(t, out[1].Err, engine.ErrInvalidCost)
	require.NoError(t, e.Close())
	mfs := scrape(t, c)
	_, dec := series(t, mfs, "tokenshard_decisions_total")
	got := map[string]float64{}
	for _, s := range dec {
		got[s.labels] = s.value
	}
	require.Equal(t, map[string]float64{"outcome=allowed": 1, "outcome=denied": 0}, got)
	_, errs := series(t, mfs, "tokenshard_errors_total")
	for _, s := range errs {
		if s.labels == "kind=invalid_cost" {
			require.Equal(t, 1.0, s.value)
		}
	}
}

// TestShardHighWaterIsTheShards: WithShardLabels gives
// mailbox_high_water "a "shard" label ... in place of [its] engine-wide
// value, to find a hot or stuck shard": a shard that never got a request
// reports 0, whatever the others found.
func TestShardHighWaterIsTheShards(t *testing.T) {
	const shards = 4
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 5, 1), Shards: shards})
	_, err := e.Allow(context.Background(), "only", 1) // one shard sees one request
	require.NoError(t, err)
	require.NoError(t, e.Close())
	st := e.Stats()
	require.GreaterOrEqual(t, st.Total.MailboxHighWater, int64(1))
	mfs := scrape(t, newCollector(t, e, promstats.WithShardLabels()))
	_, hw := series(t, mfs, "tokenshard_mailbox_high_water")
	require.Len(t, hw, shards)
	zeros := 0
	for _, s := range hw {
		if s.value == 0 {
			zeros++
		}
	}
	require.GreaterOrEqual(t, zeros, shards-1, "shards that never got a request report 0: %v", hw)
}
