package engine_test

// Overrides that share one *policy.BandSet, and so one limit, must come out
// of Restore as one limit too: the reader builds a BandSet per override, and
// an OverrideSet tells limits apart by their bands' contents, not by the
// pointer, so the limit table (and every key's index into it) is the same.

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Named: "gold" for every tenant on one plan is legal, but Restore refuses
// the snapshot Snapshot wrote.
func TestSharedBandSetNamed(t *testing.T) {
	daily := mustBands(policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: overrides(t,
		policy.Override{Match: "acme:*", Name: "gold", Capacity: 50, TokensPerSecond: 5, Bands: daily},
		policy.Override{Match: "umbrella:*", Name: "gold", Capacity: 50, TokensPerSecond: 5, Bands: daily},
	)}
	e, _ := newEngine(t, engine.Config{Policy: p, Shards: 1})
	allow(t, e, "acme:1", 1)
	restored(t, engine.Config{Policy: p, Shards: 1, Clock: clock.NewManual(0)}, takeSnapshot(t, e), engine.RestoreOptions{})

}

// Silent: unnamed, the limit table grows by one on the way in, so the index
// of every later limit points one entry early. Here the "free:*" bucket is
// read under the umbrella limit (same band count, so every check passes),
// and its depleted "hourly" band is cut over as a new band: full.
func TestSharedBandSetSilent(t *testing.T) {
	daily := mustBands(policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: overrides(t,
		policy.Override{Match: "acme:*", Capacity: 50, TokensPerSecond: 5, Bands: daily},
		policy.Override{Match: "umbrella:*", Capacity: 50, TokensPerSecond: 5, Bands: daily},
		policy.Override{Match: "free:*", Capacity: 3, Refill: policy.PerMinute(1),
			Bands: mustBands(policy.Band{Name: "hourly", Capacity: 3, Refill: policy.PerHour(3)})},
	)}
	e, _ := newEngine(t, engine.Config{Policy: p, Shards: 1})
	allow(t, e, "free:1", 3)
	r, _ := restored(t, engine.Config{Policy: p, Shards: 1, Clock: clock.NewManual(0)}, takeSnapshot(t, e), engine.RestoreOptions{})
	before, _ := e.Peek(t.Context(), "free:1")
	after, _ := r.Peek(t.Context(), "free:1")
	require.Equal(t, before, after)
	// Before the fix: RetryAfter 20m, Band "hourly"; after: 1m, Band "" (the depleted band minted full).
}
