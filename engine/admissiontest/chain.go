package admissiontest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// Chains of cutovers against the math/big model. A backend may convert
// buckets lazily, keep a bounded history of policies, or refuse to prepare a
// cutover until the previous conversion is done; whatever it
// does, a key last touched any number of versions ago must get exactly what
// the eager rule gives, which the model applies to every key at every
// cutover.

var chainBehaviours = []behaviour{
	{"Random", testChainRandom},
	{"Extremes", testChainExtremes},
}

// chainIdleKeys are touched once before the chain and once after it, so they
// go through every cutover untouched; between them they fall under the
// default, exact overrides ("tenant:acme") and patterns ("vip:*", "*:login",
// "*") as the generated policies change.
var chainIdleKeys = []string{"idle", "vip:2", "tenant:acme", "idle:login"}

// chainBusyKeys are touched now and then between cutovers.
var chainBusyKeys = []string{"a", "vip:1", "bob:login", "k*star"}

// chainCase is one chain: how many cutovers, whether the clock moves in
// small or wide steps, and whether EvictFull judges the idle keys before
// anything else touches them after the chain.
type chainCase struct {
	cutovers   int
	wide       bool
	evictFirst bool
	seed       uint64
}

// chainCases: 130 cutovers is past any bounded history of 100 versions an
// implementation might keep.
var chainCases = []chainCase{
	{1, true, false, 1}, {1, false, true, 2},
	{12, true, true, 3}, {12, false, false, 4},
	{130, true, false, 5}, {130, true, true, 6}, {130, false, false, 7}, {130, false, true, 8},
}

func testChainRandom(t *testing.T, f Factory) {
	for _, c := range chainCases {
		steps := map[bool]string{false: "small", true: "wide"}[c.wide]
		name := fmt.Sprintf("cutovers=%d/steps=%s/evictFirst=%t/seed=%d", c.cutovers, steps, c.evictFirst, c.seed)
		t.Run(name, func(t *testing.T) { runChain(t, f, c, name) })
	}
}

func runChain(t *testing.T, f Factory, c chainCase, name string) {
	r := rand.New(rand.NewPCG(c.seed, uint64(c.cutovers)))
	first := genPolicy(t, r, policy.Policy{})
	w := newModelled(t, f, first, name)
	for _, k := range chainIdleKeys {
		w.allow(k, model.LimitOf(first, k).Capacity) // empty: a known start
	}
	for _, k := range chainBusyKeys {
		w.allow(k, genValidCost(r, first, k))
	}
	for i := range c.cutovers {
		w.advance(genStep(r, c.wide))
		next := genPolicy(t, r, w.m.Policy())
		if i == c.cutovers-1 {
			next = chainFinal(t, r, w.m.Policy())
		}
		w.cutover(next)
		for _, k := range chainBusyKeys {
			if r.IntN(3) == 0 {
				w.advance(genStep(r, false))
				w.allow(k, genCost(r, w.m.Policy(), k))
			}
		}
	}
	w.advance(genStep(r, c.wide))
	if c.evictFirst {
		w.evict()
	}
	// Charging a key its whole capacity reveals its balance to the unit:
	// denied, RetryAfter and ResetAfter give the missing units; allowed, it
	// was full. Then a cost of 1 checks what is left.
	for _, k := range slices.Concat(chainIdleKeys, chainBusyKeys) {
		w.allow(k, model.LimitOf(w.m.Policy(), k).Capacity)
		w.allow(k, 1)
	}
	w.evict()
}

// chainFinal is the last policy of a random chain. Its capacities are so
// large, and its rates so small, that most idle keys are far from full when
// they are looked at: their balances are then the sum of their whole
// history (every rate, every clamp), not a full bucket that any history
// would give. "tenant:acme" alone gets a tiny capacity, so a key many
// versions behind is also judged full, and evicted, now and then.
func chainFinal(t *testing.T, r *rand.Rand, cur policy.Policy) policy.Policy {
	return withOverrides(t, policy.Policy{
		Version:         cur.Version + 1 + r.Int64N(3),
		Capacity:        math.MaxInt64,
		TokensPerSecond: 1 + r.Int64N(1000),
	},
		policy.Override{Match: "tenant:acme", Capacity: 1 + r.Int64N(3), TokensPerSecond: genMagnitude(r)},
		policy.Override{Match: "*:login", Capacity: 1e12 + r.Int64N(1e12), TokensPerSecond: 1 + r.Int64N(100)},
	)
}

// chainStage is one step of testChainExtremes: move the clock to at and cut
// over to next (the first stage's next is the starting policy).
type chainStage struct {
	at   int64
	next policy.Policy
}

// testChainExtremes walks capacities, rates, versions and clock readings to
// math.MaxInt64 and back down, so every product in refill, clamp, retry and
// reset estimates is at its largest. "sleeper" is touched only at the start
// and the end.
func testChainExtremes(t *testing.T, f Factory) {
	const top = math.MaxInt64
	o := func(p policy.Policy, os ...policy.Override) policy.Policy { return withOverrides(t, p, os...) }
	stages := []chainStage{
		{0, pol(1, top, 1)},
		{1, o(pol(2, top, top),
			policy.Override{Match: "vip:*", Capacity: top, TokensPerSecond: 1},
			policy.Override{Match: "exact", Capacity: 1, TokensPerSecond: top})},
		{1e9, pol(3, 1, 1)},
		{1e9 + 1, o(pol(4, top-1, 3), policy.Override{Match: "vip:*", Capacity: top, TokensPerSecond: top})},
		{1e18, o(pol(1<<40, 7, top), policy.Override{Match: "exact", Capacity: top, TokensPerSecond: 1})},
		{top / 2, pol(1<<40+1, top, 1)},
		{top - 1e9, o(pol(top-1, top, 2), policy.Override{Match: "*", Capacity: top - 1, TokensPerSecond: 1})},
		{top - 1, pol(top, top, 1)},
	}
	keys := []string{"a", "b", "vip:x", "exact"}
	w := newModelled(t, f, stages[0].next, "extremes")
	w.allow("sleeper", top)
	for i, s := range stages {
		if s.at > w.clk.Now() {
			w.set(s.at)
		}
		if i > 0 {
			w.cutover(s.next)
		}
		for _, k := range keys {
			w.allow(k, model.LimitOf(w.m.Policy(), k).Capacity)
			w.allow(k, top)
			w.allow(k, 1)
		}
	}
	w.set(top)
	w.evict()
	for _, k := range slices.Concat(keys, []string{"sleeper"}) {
		w.allow(k, model.LimitOf(w.m.Policy(), k).Capacity)
		w.allow(k, 1)
	}
}
