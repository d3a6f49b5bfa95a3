package promstats_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestDecisionsCountedWhenCallsReturn: "a scrape made after a call has
// returned counts it": with no Close to settle the counts, each AllowAll
// and Charge is in decisions_total at once, on several shards, and a
// failed AllowAll adds nothing.
func TestDecisionsCountedWhenCallsReturn(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1000000, 1), Shards: 4})
	c := newCollector(t, e)
	ctx := context.Background()
	var allowed, denied float64
	for i := 0; i < 300; i++ {
		reqs := []engine.Request{{Key: fmt.Sprint("a", i), Cost: 1}, {Key: fmt.Sprint("b", i), Cost: 1}, {Key: fmt.Sprint("c", i), Cost: 1}}
		d, _, err := e.AllowAll(ctx, reqs)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		allowed += 3
		d, _, err = e.AllowAll(ctx, []engine.Request{{Key: fmt.Sprint("a", i), Cost: 1}, {Key: fmt.Sprint("b", i), Cost: 2000000}})
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		_, err = e.Charge(ctx, fmt.Sprint("c", i), 5)
		require.NoError(t, err)
		allowed++
		mfs := scrape(t, c)
		_, dec := series(t, mfs, "tokenshard_decisions_total")
		got := map[string]float64{}
		for _, s := range dec {
			got[s.labels] = s.value
		}
		require.Equal(t, map[string]float64{"outcome=allowed": allowed, "outcome=denied": denied}, got, "iteration %d", i)
	}
}
