package storestats_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/promstats/storestats"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestSameCountsErrorsAndBatches: a sequence of what TestSameCountsAsEngine
// leaves out, run on an engine of 4 shards and on a store: an AllowAll
// refused across 21 keys, AllowAlls naming a key twice, every AllowAll
// error (a cost above capacity, a blank key, a cost of 0, no requests, a
// context already ended), an AllowBatch with a request above capacity, a
// Charge, a Refund, and AllowAlls from 4 goroutines at once. Every shared
// family reads the same on both, and the decisions are the sequence's.
func TestSameCountsErrorsAndBatches(t *testing.T) {
	ov, err := policy.NewOverrideSet(policy.Override{Match: "big*", Capacity: 100, TokensPerSecond: 1})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Overrides: ov}
	e, err := engine.New(engine.Config{Policy: p, Shards: 4, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	s := newStore(t, redistest.Addr(t), freshPrefix(t), redisstore.Config{Policy: p})

	for _, a := range []engine.Admitter{e, s} {
		ctx := context.Background()
		for i := range 5 {
			d, err := a.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, i < 3, d.Allowed)
		}
		var many []engine.Request
		for i := range 20 {
			many = append(many, engine.Request{Key: fmt.Sprint("x", i), Cost: 1})
		}
		d, _, err := a.AllowAll(ctx, append(many, engine.Request{Key: "k", Cost: 1}))
		require.NoError(t, err)
		require.False(t, d.Allowed, "k is empty")
		twice := []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 1}, {Key: "b", Cost: 1}}
		d, _, err = a.AllowAll(ctx, twice)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		d, _, err = a.AllowAll(ctx, twice)
		require.NoError(t, err)
		require.False(t, d.Allowed, "a has 1 left, the call needs 2")
		_, _, err = a.AllowAll(ctx, []engine.Request{{Key: "c", Cost: 1}, {Key: "d", Cost: 4}})
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		_, _, err = a.AllowAll(ctx, []engine.Request{{Key: "c", Cost: 1}, {Key: "", Cost: 1}})
		require.ErrorIs(t, err, engine.ErrInvalidKey)
		_, _, err = a.AllowAll(ctx, []engine.Request{{Key: "c", Cost: 0}})
		require.ErrorIs(t, err, engine.ErrInvalidCost)
		_, _, err = a.AllowAll(ctx, nil)
		require.ErrorIs(t, err, engine.ErrAllowAllSize)
		out := make([]engine.Result, 4)
		require.NoError(t, a.AllowBatch(ctx, []engine.Request{{Key: "z", Cost: 1}, {Key: "z", Cost: 1}, {Key: "z", Cost: 1}, {Key: "z", Cost: 9}}, out))
		require.ErrorIs(t, out[3].Err, engine.ErrInvalidCost)
		_, err = a.Charge(ctx, "q", 2)
		require.NoError(t, err)
		_, err = a.Refund(ctx, "q", 1)
		require.NoError(t, err)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, err = a.Allow(ended, "k", 1)
		require.ErrorIs(t, err, context.Canceled)
		_, _, err = a.AllowAll(ended, []engine.Request{{Key: "k", Cost: 1}})
		require.ErrorIs(t, err, context.Canceled)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 5 {
					d, _, err := a.AllowAll(ctx, []engine.Request{{Key: fmt.Sprint("big", g, i%3), Cost: 1}, {Key: fmt.Sprint("big", (g+1)%4, i%3), Cost: 1}})
					assert.NoError(t, err)
					assert.True(t, d.Allowed)
				}
			})
		}
		wg.Wait()
	}

	ec, err := promstats.New(e)
	require.NoError(t, err)
	sc, err := storestats.New(s)
	require.NoError(t, err)
	engineFams, storeFams := scrape(t, ec), scrape(t, sc)
	counts := func(mfs map[string]*dto.MetricFamily, name string) map[string]float64 {
		out := map[string]float64{}
		for _, m := range mfs[name].GetMetric() {
			label := ""
			for _, l := range m.GetLabel() {
				label = l.GetValue()
			}
			out[label] = m.GetCounter().GetValue()
		}
		return out
	}
	noErrors := map[string]float64{"invalid_key": 0, "invalid_cost": 0, "closed": 0, "context": 0, "clock_regression": 0, "key_capacity": 0, "other": 0}
	with := func(kinds map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range noErrors {
			out[k] = v + kinds[k]
		}
		return out
	}
	want := map[string]map[string]float64{
		// allowed: k 3, a and b 3, z 3, the Charge 1, 20 AllowAlls of 2;
		// denied: k 2, the 21 requests, a twice and b.
		"tokenshard_decisions_total":       {"allowed": 3 + 3 + 3 + 1 + 40, "denied": 2 + 21 + 3},
		"tokenshard_errors_total":          with(map[string]float64{"invalid_cost": 1, "context": 1}),
		"tokenshard_allowall_calls_total":  {"admitted": 1 + 20, "refused": 2},
		"tokenshard_allowall_errors_total": with(map[string]float64{"invalid_cost": 2, "invalid_key": 1, "other": 1, "context": 1}),
		"tokenshard_peeks_total":           {"": 0},
		"tokenshard_refunds_total":         {"": 1},
	}
	for name, w := range want {
		assert.Equal(t, w, counts(engineFams, name), "engine: %s", name)
		got := counts(storeFams, name)
		if name == "tokenshard_decisions_total" {
			assert.Equal(t, map[string]float64{"degraded_allowed": 0, "degraded_denied": 0}, map[string]float64{"degraded_allowed": got["degraded_allowed"], "degraded_denied": got["degraded_denied"]})
			delete(got, "degraded_allowed")
			delete(got, "degraded_denied")
		}
		assert.Equal(t, w, got, "store: %s", name)
	}
}
