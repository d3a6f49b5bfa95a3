package admissiontest

import (
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Per-key overrides (policy.NewOverrideSet): each key's own limit decides
// its requests, bounds its cost and shows as Decision.Limit, and a cutover
// applies its rule per key: a bucket keeps what it earned under the key's
// old limit and is clamped to the key's new capacity.

var overrideBehaviours = []behaviour{
	{"Resolve", testOverridesResolve},
	{"Cutover", testOverridesCutover},
	{"EvictAndReturn", testOverridesEvictAndReturn},
}

// testOverridesResolve: an exact override beats every pattern, the first
// matching pattern in declaration order beats later ones, and everything
// else gets the default; Version stays the policy's.
func testOverridesResolve(t *testing.T, f Factory) {
	p := withOverrides(t, pol(4, 10, 1),
		policy.Override{Match: "tenant:acme", Capacity: 100, TokensPerSecond: 10},
		policy.Override{Match: "*:login", Capacity: 3, TokensPerSecond: 1},
		policy.Override{Match: "alice:login", Capacity: 7, TokensPerSecond: 7},
		policy.Override{Match: "vip:*", Capacity: 50, TokensPerSecond: 5},
	)
	a, _ := newSubject(t, f, p)

	expectAllow(t, a, "tenant:acme", 60, allowed(40, p, 100, 6*time.Second), "an exact override above the default capacity")
	expectAllowErr(t, t.Context(), a, "bob:login", 4, engine.ErrCostExceedsCapacity, "a cost above the pattern override's capacity of 3")
	expectAllow(t, a, "bob:login", 3, allowed(0, p, 3, 3*time.Second), "a pattern override below the default capacity")
	expectAllow(t, a, "alice:login", 7, allowed(0, p, 7, time.Second), "an exact override beats a pattern")
	expectAllow(t, a, "vip:login", 3, allowed(0, p, 3, 3*time.Second), "the first matching pattern wins")
	expectAllow(t, a, "vip:", 50, allowed(0, p, 50, 10*time.Second), "'*' matches the empty run")
	expectAllowErr(t, t.Context(), a, "someone", 11, engine.ErrCostExceedsCapacity, "a cost above the default capacity")
	expectAllow(t, a, "someone", 10, allowed(0, p, 10, 10*time.Second), "no override: the default")
	expectAllow(t, a, "tenant:acme:*", 1, allowed(9, p, 10, time.Second), "a key with '*' is not a pattern")
	requirePolicy(t, p, a.Policy(), "Policy() with overrides")
}

// testOverridesCutover covers three moves, each computed by hand:
//   - default -> override with a higher capacity: no top-up;
//   - override -> default with a lower capacity: clamped;
//   - an override's rate changes: the old rate earns up to the cutover, the
//     new rate after it.
func testOverridesCutover(t *testing.T, f Factory) {
	v1 := withOverrides(t, pol(1, 10, 2),
		policy.Override{Match: "vip:*", Capacity: 50, TokensPerSecond: 5},
		policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 4},
	)
	a, clk := newSubject(t, f, v1)
	expectAllow(t, a, "promoted", 10, allowed(0, v1, 10, 5*time.Second), "t=0, default limit")
	expectAllow(t, a, "vip:demoted", 50, allowed(0, v1, 50, 10*time.Second), "t=0, vip:* limit")
	expectAllow(t, a, "vip:demoted", 1, denied(0, 200*time.Millisecond, v1, 50, 10*time.Second), "t=0, vip:* limit, empty")
	expectAllow(t, a, "metered", 20, allowed(0, v1, 20, 5*time.Second), "t=0, exact override")
	expectAllow(t, a, "vip:full", 1, allowed(49, v1, 50, 200*time.Millisecond), "t=0, vip:* limit")

	// At 1.5s promoted has earned 3 (2/s), vip:demoted 7.5 (5/s), metered 6
	// (4/s), and vip:full is full at 50. The cutover gives promoted an
	// override of capacity 100 (no top-up: it keeps 3), puts both vip keys
	// back on the default of 10 (vip:full is clamped from 50 to 10;
	// vip:demoted's 7.5 fits), and slows metered to 1/s.
	clk.Set(1500 * ms)
	v2 := withOverrides(t, pol(2, 10, 2),
		policy.Override{Match: "promoted", Capacity: 100, TokensPerSecond: 50},
		policy.Override{Match: "metered", Capacity: 20, TokensPerSecond: 1},
	)
	mustReplace(t, a, v2, 1, "t=1.5s")

	clk.Set(1600 * ms)
	expectAllow(t, a, "promoted", 1, allowed(7, v2, 100, 1860*time.Millisecond), "t=1.6s: 3 + 0.1s at 50/s")
	expectAllow(t, a, "vip:demoted", 1, allowed(6, v2, 10, 1650*time.Millisecond), "t=1.6s: 7.5 + 0.1s at 2/s")
	expectAllow(t, a, "metered", 7, denied(6, 900*time.Millisecond, v2, 20, 13900*time.Millisecond), "t=1.6s: 6 + 0.1s at 1/s")
	expectAllow(t, a, "vip:full", 1, allowed(9, v2, 10, 500*time.Millisecond), "t=1.6s: clamped to 10 at the cutover")

	// The override is dropped at 2s: promoted goes back to the default of
	// 10, clamped from 7 + 0.4s at 50/s.
	clk.Set(2 * second)
	v3 := pol(3, 10, 2)
	mustReplace(t, a, v3, 2, "t=2s")
	expectAllow(t, a, "promoted", 1, allowed(9, v3, 10, 500*time.Millisecond), "t=2s, back on the default")
}

// testOverridesEvictAndReturn: EvictFull judges each key by its own
// capacity, and a key that returns after eviction resolves afresh under the
// policy then in force.
func testOverridesEvictAndReturn(t *testing.T, f Factory) {
	v1 := withOverrides(t, pol(1, 10, 10),
		policy.Override{Match: "slow", Capacity: 10, TokensPerSecond: 1},
		policy.Override{Match: "big:*", Capacity: 1000, TokensPerSecond: 10},
	)
	a, clk := newSubject(t, f, v1)
	for _, k := range []string{"slow", "big:a", "plain"} {
		mustAllow(t, a, k, 5, "t=0")
	}
	// At 1s plain is full (10/s), slow is at 6 of 10 (1/s), and big:a has
	// reached its own capacity of 1000 (995 + 10/s).
	clk.Set(second)
	mustEvict(t, a, 2, "t=1s, plain and big:a are full under their own limits")
	expectAllow(t, a, "slow", 7, denied(6, time.Second, v1, 10, 4*time.Second), "t=1s, slow survived the sweep")

	v2 := pol(2, 10, 10)
	mustReplace(t, a, v2, 1, "t=1s")
	expectAllow(t, a, "big:a", 10, allowed(0, v2, 10, time.Second), "big:a returns under a policy without its override")
	expectAllowErr(t, t.Context(), a, "big:a", 11, engine.ErrCostExceedsCapacity, "big:a's old capacity is gone")
}
