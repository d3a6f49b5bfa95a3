package main

import (
	"errors"
	"go/parser"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// diffBandEvents replays tr on the model and counts what it does with
// rates and bands: decisions under each, the bands that bind, costs within
// the primary but above a band, and what cutovers do to each key's bands.
func diffBandEvents(tr diffTrace, ev map[string]int) {
	m := enginemodel.New(tr.cfg.policy, tr.cfg.maxKeys, tr.cfg.maxKeyBytes)
	decided := func(p policy.Policy, key string, cost int64, d engine.Decision, err error) {
		sh := shapeOf(p, key)
		if err == nil {
			bands, period := wide(sh)
			if period {
				ev["decided under a rate not per second"]++
			}
			if bands {
				ev["decided under several bands"]++
				switch {
				case d.Band != sh.Name && d.Allowed:
					ev["allowed, a band beside the primary binding"]++
				case d.Band != sh.Name:
					ev["denied by a band beside the primary"]++
				case !d.Allowed:
					ev["denied by the primary of several bands"]++
				}
			}
			if sh.Name != "" && d.Band == sh.Name {
				ev["bound by an override's named primary"]++
			}
		}
		if errors.Is(err, engine.ErrCostExceedsCapacity) && sh.Len() > 1 && cost <= sh.Primary.Capacity {
			ev["ErrCostExceedsCapacity within the primary, above a band"]++
		}
	}
	for _, op := range tr.ops {
		if op.kind == diffBatch && diffAmbiguous(m, tr.cfg, op.reqs) {
			return
		}
		op = op.resolve(m.Policy().Version)
		p := m.Policy()
		switch op.kind {
		case diffAllow:
			d, err := m.Allow(op.t, op.key, op.cost)
			decided(p, op.key, op.cost, d, err)
		case diffBatch:
			for i, res := range m.AllowBatch(op.t, op.reqs) {
				decided(p, op.reqs[i].Key, op.reqs[i].Cost, res.Decision, res.Err)
			}
		case diffEvict:
			_, _ = m.EvictFull(op.t)
		case diffCutover:
			keys := m.Keys()
			if m.ReplacePolicy(op.t, op.next, op.expected) != nil {
				continue
			}
			for _, k := range keys {
				bandMoves(shapeOf(p, k), shapeOf(op.next, k), ev)
			}
		}
	}
}

// TestDiffBandSeeds: the differential traces reach every case of rates and
// bands that the engine and the model must agree on. (TestDiffSeeds
// replays the same seeds against the engine.)
func TestDiffBandSeeds(t *testing.T) {
	ev := map[string]int{}
	for seed := uint64(1); seed <= 200; seed++ {
		diffBandEvents(diffGenerate(seed, []int{1, 2, 16}, diffOpsPerTrace), ev)
	}
	for _, e := range []string{
		"decided under a rate not per second", "decided under several bands",
		"allowed, a band beside the primary binding", "denied by a band beside the primary",
		"denied by the primary of several bands", "bound by an override's named primary",
		"ErrCostExceedsCapacity within the primary, above a band",
		"cutover: the primary's period changes", "cutover: a band added", "cutover: a band dropped",
		"cutover: a band's capacity goes up", "cutover: a band's capacity goes down",
		"cutover: a band's period changes", "cutover: a band's rate changes within its period",
		"cutover: a band moves in the order",
	} {
		assert.Positive(t, ev[e], "no trace did this: %s", e)
	}
	t.Logf("bands: %v", ev)
}

// TestDiffRatesAsGiven: the traces' policies keep the form they were given
// in, both forms occur, and every awkward rate of the contract is drawn.
func TestDiffRatesAsGiven(t *testing.T) {
	forms := map[string]int{}
	rates := map[policy.Rate]bool{}
	note := func(tps int64, r policy.Rate) {
		switch {
		case r.IsZero():
			forms["TokensPerSecond"]++
		case tps == 0:
			forms["Refill"]++
			rates[r] = true
		}
	}
	for seed := uint64(1); seed <= 300; seed++ {
		for _, p := range diffGenerate(seed, []int{1}, diffOpsPerTrace).policies() {
			note(p.TokensPerSecond, p.Refill)
			for _, b := range p.Bands.Bands() {
				rates[b.Refill] = true
			}
			for _, o := range p.Overrides.Overrides() {
				note(o.TokensPerSecond, o.Refill)
			}
		}
	}
	assert.Positive(t, forms["TokensPerSecond"])
	assert.Positive(t, forms["Refill"])
	for _, r := range []policy.Rate{{Tokens: 7, Per: 3 * time.Second}, policy.PerDay(1), {Tokens: 1, Per: math.MaxInt64},
		{Tokens: math.MaxInt64, Per: 1}, policy.PerMinute(100), {Tokens: 1, Per: 1<<32 + 1}} {
		assert.True(t, rates[r], "no trace drew %v", r)
	}
}

// TestDiffShrinkBands plants band faults behind the engine: the shrunk
// reproduction keeps a band (mustBands) and is a couple of ops long.
func TestDiffShrinkBands(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  diffFault
		maxOps int
	}{
		{"binding band misnamed", diffFault{band: true}, 2},
		{"a band's denial reported as allowed", diffFault{bandAdmit: true}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func(cfg diffConfig, c *counters) (diffTarget, error) {
				tg, err := diffNewEngine(cfg, c)
				if err != nil {
					return nil, err
				}
				f := tc.fault
				f.diffTarget = tg
				return &f, nil
			}
			tr := diffTripAndShrink(t, func(seed uint64) diffTrace {
				return diffGenerate(seed, []int{1, 2, 16}, diffOpsPerTrace)
			}, mk, diffNewEngine, tc.maxOps)
			err := diffCheck(tr, mk, nil)
			var v *Violation
			require.ErrorAs(t, err, &v)
			t.Log(v.Error())
			assert.Contains(t, v.Detail, "mustBands(", "the reproduction keeps the band it needs")
			assert.Contains(t, v.Detail, "mustBands: policy.NewBands", "the note says where mustBands comes from")
		})
	}
}

// TestDiffPolicyPrintsBandsAsGo: a policy with Refill rates, bands and
// named overrides with bands prints as the Go that builds it.
func TestDiffPolicyPrintsBandsAsGo(t *testing.T) {
	p := policy.Policy{Version: 2, Capacity: 5, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second},
		Bands: mustBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)},
			policy.Band{Name: "x", Capacity: math.MaxInt64, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}}),
		Overrides: mustOverrides(policy.Override{Match: "k*", Capacity: 3, Refill: policy.Rate{Tokens: 3, Per: 7}, Name: "gold",
			Bands: mustBands(policy.Band{Name: "b", Capacity: 1, Refill: policy.PerMinute(100)})},
			policy.Override{Match: "a", Capacity: 1, TokensPerSecond: 2})}
	printed := `policy.Policy{Version: 2, Capacity: 5, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second}, ` +
		`Bands: mustBands(policy.Band{Name: "daily", Capacity: 20, Refill: policy.Rate{Tokens: 20, Per: 24 * time.Hour}}, ` +
		`policy.Band{Name: "x", Capacity: math.MaxInt64, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}}), ` +
		`Overrides: mustOverrides(policy.Override{Match: "k*", Capacity: 3, Refill: policy.Rate{Tokens: 3, Per: 7}, ` +
		`Bands: mustBands(policy.Band{Name: "b", Capacity: 1, Refill: policy.Rate{Tokens: 100, Per: 1 * time.Minute}}), Name: "gold"}, ` +
		`policy.Override{Match: "a", Capacity: 1, TokensPerSecond: 2})}`
	assert.Equal(t, printed, diffPolicy(p))
	_, err := parser.ParseExpr(diffPolicy(p))
	require.NoError(t, err)
	assert.Equal(t, `v2 cap 5 refill 7/3s bands {"daily" 20 20/24h0m0s, "x" 9223372036854775807 1/MaxInt64ns} `+
		`overrides ["k*" 3 refill 3/7ns name "gold" bands {"b" 1 100/1m0s} "a" 1/2]`, policyText(p))
	tr := diffTrace{cfg: diffConfig{policy: p}}
	assert.Contains(t, tr.overridesNote(), "mustBands: policy.NewBands")
	assert.True(t, strings.HasPrefix(diffDecision(engine.Decision{Band: "daily"}, nil), "{Allowed:false"))
	assert.Contains(t, diffDecision(engine.Decision{Band: "daily"}, nil), `Band:"daily"}`)
}
