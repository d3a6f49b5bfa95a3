package admissiontest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// The contract's worked examples, each checked to every Decision field:
// they are the numbers a reader of the contract can verify by hand.

var exampleBehaviours = []behaviour{
	{"BurstAndRefill", testBurstAndRefill},
	{"BurstAndRefillAsBatches", testBurstAndRefillAsBatches},
	{"BurstAsOneBatch", testBurstAsOneBatch},
	{"ThirdOfASecond", testThirdOfASecond},
	{"Concurrent20CallersOneInstant", testTwentyCallers},
	{"EvictFull", testEvictFullExample},
	{"EvictFullBoundaryIsExactlyFull", testEvictFullBoundary},
	{"EvictFullKeepsPartlyRefilled", testEvictFullKeepsPartlyRefilled},
	{"CutoverOneTokenAtTheCutover", testCutoverOneToken},
	{"CutoverTwoTokensLater", testCutoverTwoTokens},
	{"CutoverNewKeysStartAtNewCapacity", testCutoverNewKeys},
}

// exampleStep is one request of the first worked example: at clock reading
// at, spend cost on the example's key, and get exactly want.
type exampleStep struct {
	name string
	at   int64
	cost int64
	want engine.Decision
}

// firstExample is capacity 10, 2 tokens/s: one token takes 500ms, so
// ResetAfter is 500ms per missing token.
var firstExample = []exampleStep{
	{"t=0 cost 10 takes the whole burst", 0, 10, allowed(0, pol(1, 10, 2), 10, 5*time.Second)},
	{"t=0 cost 1 is denied for exactly one token's worth", 0, 1, denied(0, 500*time.Millisecond, pol(1, 10, 2), 10, 5*time.Second)},
	{"t=250ms cost 1 is denied with half a token kept", 250 * ms, 1, denied(0, 250*time.Millisecond, pol(1, 10, 2), 10, 4750*time.Millisecond)},
	// Allowed only if the denial at 250ms kept its half token.
	{"t=500ms cost 1 is allowed", 500 * ms, 1, allowed(0, pol(1, 10, 2), 10, 5*time.Second)},
}

func testBurstAndRefill(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 10, 2))
	for _, s := range firstExample {
		clk.Set(s.at)
		expectAllow(t, a, "user", s.cost, s.want, s.name)
	}
}

// testBurstAndRefillAsBatches plays the first example as batches of one: a
// batch of one request is that request.
func testBurstAndRefillAsBatches(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 10, 2))
	for _, s := range firstExample {
		clk.Set(s.at)
		out := garbageOut(1)
		require.NoError(t, a.AllowBatch(t.Context(), []engine.Request{{Key: "user", Cost: s.cost}}, out), s.name)
		require.Equal(t, engine.Result{Decision: s.want}, out[0], "%s: the batch of one decided wrongly", s.name)
	}
}

// testBurstAsOneBatch decides the first example's costs as one batch at t=0:
// at one instant the half token of the 250ms step is never earned, so every
// request after the burst is denied for a whole token.
func testBurstAsOneBatch(t *testing.T, f Factory) {
	a, _ := newSubject(t, f, pol(1, 10, 2))
	reqs := make([]engine.Request, len(firstExample))
	for i, s := range firstExample {
		reqs[i] = engine.Request{Key: "user", Cost: s.cost}
	}
	out := garbageOut(len(reqs))
	require.NoError(t, a.AllowBatch(t.Context(), reqs, out), "AllowBatch(%+v)", reqs)
	want := []engine.Result{{Decision: firstExample[0].want}}
	for range reqs[1:] {
		want = append(want, engine.Result{Decision: firstExample[1].want})
	}
	require.Equal(t, want, out, "one batch at t=0 of costs 10, 1, 1, 1 on one key")
}

func testThirdOfASecond(t *testing.T, f Factory) {
	const (
		justShort int64 = 333_333_333 // 999,999,999 units earned: one short
		justThere int64 = 333_333_334 // ceil(1e9/3)
	)
	p := pol(1, 1, 3)
	a, clk := newSubject(t, f, p)
	emptied := allowed(0, p, 1, time.Duration(justThere))
	// "denied" is refused at justShort and asked again at justThere; "fresh"
	// is asked only at justThere, so the denial cannot have helped either.
	expectAllow(t, a, "denied", 1, emptied, "t=0, emptying the bucket")
	expectAllow(t, a, "fresh", 1, emptied, "t=0, emptying the bucket")

	clk.Set(justShort)
	expectAllow(t, a, "denied", 1, denied(0, 1, p, 1, 1), "t=333,333,333ns, one unit short")

	clk.Set(justThere)
	expectAllow(t, a, "denied", 1, emptied, "t=333,333,334ns, after a denial")
	expectAllow(t, a, "fresh", 1, emptied, "t=333,333,334ns, with no denial")
}

// callerAnswer carries one concurrent caller's answer back to the test.
type callerAnswer struct {
	d   engine.Decision
	err error
}

// testTwentyCallers releases 20 goroutines together on one key of capacity
// 10 at one instant: exactly 10 are allowed, each seeing a distinct balance,
// so the decisions were serialized and none was lost or doubled.
func testTwentyCallers(t *testing.T, f Factory) {
	const callers = 20
	p := pol(1, 10, 2)
	a, _ := newSubject(t, f, p)
	start := make(chan struct{})
	answers := make(chan callerAnswer, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			<-start // released together for the most contention
			d, err := a.Allow(t.Context(), "hot", 1)
			answers <- callerAnswer{d, err}
		})
	}
	close(start)
	wg.Wait()
	close(answers)

	var remaining []int64
	for ans := range answers {
		require.NoError(t, ans.err, "a concurrent Allow(\"hot\", 1) failed")
		if !ans.d.Allowed {
			// The clock never moved, so every denial sees an empty bucket.
			require.Equal(t, denied(0, 500*time.Millisecond, p, 10, 5*time.Second), ans.d, "a concurrent denial")
			continue
		}
		require.Equal(t, allowed(ans.d.Remaining, p, 10, time.Duration(10-ans.d.Remaining)*500*time.Millisecond), ans.d,
			"a concurrent admission")
		remaining = append(remaining, ans.d.Remaining)
	}
	slices.Sort(remaining)
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, remaining,
		"the Remaining of the admitted callers: want exactly 10 admitted, each with a distinct balance")
}

// depletedKeys is how many keys the EvictFull examples empty: enough to land
// on every shard of a sharded subject.
const depletedKeys = 12

// depleteKeys empties key-0 .. key-11 at the clock's current reading under
// capacity 10.
func depleteKeys(t *testing.T, a engine.Admitter) {
	t.Helper()
	for i := range depletedKeys {
		d := mustAllow(t, a, fmt.Sprintf("key-%d", i), 10, "depleting")
		require.True(t, d.Allowed && d.Remaining == 0, "depleting key-%d: got %+v", i, d)
	}
}

func testEvictFullExample(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, clk := newSubject(t, f, p)
	depleteKeys(t, a)

	clk.Set(500 * ms)
	mustEvict(t, a, 0, "t=0.5s, every key holds 1 of 10 tokens")
	// Each survivor holds exactly the 1 token it earned: not dropped and
	// recreated full. Cost 2 is denied, so the probe spends nothing.
	for i := range depletedKeys {
		expectAllow(t, a, fmt.Sprintf("key-%d", i), 2, denied(1, 500*time.Millisecond, p, 10, 4500*time.Millisecond),
			"t=0.5s after EvictFull, the key kept its balance")
	}

	clk.Set(5500 * ms)
	mustEvict(t, a, depletedKeys, "t=5.5s, every key is full")
	mustEvict(t, a, 0, "t=5.5s, a second EvictFull finds nothing left")
	// A removed key behaves as a full one: recreating it gives it exactly
	// what it had.
	for i := range depletedKeys {
		expectAllow(t, a, fmt.Sprintf("key-%d", i), 10, allowed(0, p, 10, 5*time.Second), "t=5.5s, a removed key")
	}
	mustEvict(t, a, 0, "t=5.5s, the recreated keys are empty again")
}

// testEvictFullBoundary: full means exactly capacity, not almost.
func testEvictFullBoundary(t *testing.T, f Factory) {
	a, clk := newSubject(t, f, pol(1, 10, 2))
	depleteKeys(t, a)
	clk.Set(5*second - 1) // one nanosecond, two units, short of full
	mustEvict(t, a, 0, "t=5s-1ns, every key is 2 units short of full")
	clk.Set(5 * second)
	mustEvict(t, a, depletedKeys, "t=5s, every key is exactly full")
}

// testEvictFullKeepsPartlyRefilled: a bucket that is not full stays however
// old it is, since dropping it would hand its owner a fresh burst.
func testEvictFullKeepsPartlyRefilled(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, clk := newSubject(t, f, p)
	mustAllow(t, a, "old", 10, "t=0") // empty, full again only at 5s
	clk.Set(4 * second)
	for i := range depletedKeys {
		mustAllow(t, a, fmt.Sprintf("young-%d", i), 1, "t=4s") // full again at 4.5s
	}
	clk.Set(4900 * ms)
	mustEvict(t, a, depletedKeys, "t=4.9s, the young keys are full and the old one is not")
	// "old" kept its 9.8 tokens: 9 whole, 0.2s short of 10.
	expectAllow(t, a, "old", 10, denied(9, 100*time.Millisecond, p, 10, 100*time.Millisecond), "t=4.9s, the old key")
}

// cutoverExample empties "user" at t=0 under capacity 10, 2/s and cuts over
// at 0.5s to capacity 20, 4/s: the bucket carries exactly the 1 token it
// earned, and nobody is topped up to the new capacity.
func cutoverExample(t *testing.T, f Factory) (engine.Admitter, func(int64)) {
	t.Helper()
	a, clk := newSubject(t, f, pol(1, 10, 2))
	expectAllow(t, a, "user", 10, allowed(0, pol(1, 10, 2), 10, 5*time.Second), "t=0, emptying the bucket")
	clk.Set(500 * ms)
	mustReplace(t, a, pol(2, 20, 4), 1, "t=0.5s")
	return a, clk.Set
}

// testCutoverOneToken: cost 2 is denied exactly one token short at the new
// rate, so the key holds 1 token at the cutover (not 2 from the new rate
// since 0, nor 20 from the new capacity), and a denial spends nothing.
func testCutoverOneToken(t *testing.T, f Factory) {
	next := pol(2, 20, 4)
	a, _ := cutoverExample(t, f)
	expectAllow(t, a, "user", 2, denied(1, 250*time.Millisecond, next, 20, 4750*time.Millisecond), "t=0.5s, just after the cutover")
	expectAllow(t, a, "user", 1, allowed(0, next, 20, 5*time.Second), "t=0.5s, spending the one token")
}

func testCutoverTwoTokens(t *testing.T, f Factory) {
	next := pol(2, 20, 4)
	a, set := cutoverExample(t, f)
	set(750 * ms)
	expectAllow(t, a, "user", 3, denied(2, 250*time.Millisecond, next, 20, 4500*time.Millisecond), "t=0.75s, 1 token plus 0.25s at 4/s")
	expectAllow(t, a, "user", 2, allowed(0, next, 20, 5*time.Second), "t=0.75s, spending the two tokens")
}

func testCutoverNewKeys(t *testing.T, f Factory) {
	next := pol(2, 20, 4)
	a, set := cutoverExample(t, f)
	expectAllow(t, a, "newcomer", 1, allowed(19, next, 20, 250*time.Millisecond), "t=0.5s, a key created after the cutover")
	set(750 * ms)
	expectAllow(t, a, "latecomer", 20, allowed(0, next, 20, 5*time.Second), "t=0.75s, a key created after the cutover")
}
