package admissiontest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// AllowAll: requests decided as one, all or nothing across their keys. A
// key's answer is Allow's for the sum of its requests' costs at the call's
// instant; the call is admitted only if every key's is, and then takes
// every cost; the Decision is the binding request's (when denied, the one
// that waits longest; when admitted, the one with the fewest whole tokens
// left; ties to the first), and the int its index. The Admitter has no
// Peek, so "nothing taken" is checked by the Allow calls that follow: each
// answers as it would have without the refused call. Every number below is
// worked out by hand in its comment.

var allowAllBehaviours = []behaviour{
	{"AllAdmittedEveryKeyPays", testAllowAllAdmitted},
	{"OneShortTakesNothing", testAllowAllOneShort},
	{"RepeatedKeysAddUp", testAllowAllRepeated},
	{"SumAboveCapacity", testAllowAllAboveCapacity},
	{"ErrorOrder", testAllowAllErrorOrder},
	{"Size", testAllowAllSize},
	{"BindingRequest", testAllowAllBinding},
	{"Bands", testAllowAllBands},
	{"ConcurrentAllOrNothing", testAllowAllConcurrent},
	{"Random", testAllowAllDifferential},
}

// expectAllowAll requires AllowAll(reqs) to answer exactly want, at index
// at, with no error.
func expectAllowAll(t *testing.T, a engine.Admitter, reqs []engine.Request, want engine.Decision, at int, what string) {
	t.Helper()
	d, i, err := a.AllowAll(t.Context(), reqs)
	require.NoError(t, err, "%s: AllowAll(%s)", what, fmtReqs(reqs))
	require.Equal(t, want, d, "%s: AllowAll(%s) decided wrongly", what, fmtReqs(reqs))
	require.Equal(t, at, i, "%s: AllowAll(%s) named the wrong binding request", what, fmtReqs(reqs))
}

// expectAllowAllErr requires AllowAll(ctx, reqs) to fail with want, the
// zero Decision and index at. ErrInvalidCost must be that error and not
// ErrCostExceedsCapacity, which matches it too.
func expectAllowAllErr(t *testing.T, ctx context.Context, a engine.Admitter, reqs []engine.Request, want error, at int, what string) {
	t.Helper()
	d, i, err := a.AllowAll(ctx, reqs)
	require.ErrorIs(t, err, want, "%s: AllowAll(%s) returned the wrong error", what, fmtReqs(reqs))
	if want == engine.ErrInvalidCost {
		require.NotErrorIs(t, err, engine.ErrCostExceedsCapacity, "%s: AllowAll(%s): a cost below 1 comes before any capacity", what, fmtReqs(reqs))
	}
	require.Zero(t, d, "%s: AllowAll(%s) failed with %v but returned a non-zero Decision", what, fmtReqs(reqs), err)
	require.Equal(t, at, i, "%s: AllowAll(%s) failed with %v at the wrong index", what, fmtReqs(reqs), err)
}

// rqs builds requests from key, cost pairs.
func rqs(kc ...any) []engine.Request {
	out := make([]engine.Request, len(kc)/2)
	for i := range out {
		out[i] = engine.Request{Key: kc[2*i].(string), Cost: int64(kc[2*i+1].(int))}
	}
	return out
}

func fmtReqs(rs []engine.Request) string {
	if len(rs) > 8 {
		return fmt.Sprintf("%d requests, %s, ...", len(rs), fmtReqs(rs[:4]))
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("{%s, %d}", fmtKey(r.Key), r.Cost)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// testAllowAllAdmitted: capacity 10 at 2 per second. At t=0, a pays 3, b
// 5 and c 1, leaving 7, 5 and 9: b binds, with 5 left and 5 tokens, 2.5 s,
// to full. Each key then shows its cost taken. At t=1s a holds 6+2 = 8 and
// c 8+2 = 10; c pays 8 and a 8: a binds with 0 left, at index 1.
func testAllowAllAdmitted(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, clk := newSubject(t, f, p)
	expectAllowAll(t, a, rqs("a", 3, "b", 5, "c", 1), allowed(5, p, 10, 2500*time.Millisecond), 1, "t=0")
	expectAllow(t, a, "a", 1, allowed(6, p, 10, 2*time.Second), "t=0, a paid 3")
	expectAllow(t, a, "b", 1, allowed(4, p, 10, 3*time.Second), "t=0, b paid 5")
	expectAllow(t, a, "c", 1, allowed(8, p, 10, time.Second), "t=0, c paid 1")
	clk.Set(second)
	expectAllowAll(t, a, rqs("c", 8, "a", 8), allowed(0, p, 10, 5*time.Second), 1, "t=1s")
	expectAllow(t, a, "c", 2, allowed(0, p, 10, 5*time.Second), "t=1s, c paid 8 of 10")
	expectAllow(t, a, "a", 1, denied(0, 500*time.Millisecond, p, 10, 5*time.Second), "t=1s, a paid 8 of 8")
}

// testAllowAllOneShort: capacity 10 at 2 per second; a spends 8 and holds
// 2. A call asking a for 3 is denied wherever a's request stands: a lacks
// one token, 500 ms, and has 8 to refill, 4 s. b (4) and c (10) would pass
// alone, but the call takes nothing from them, creates neither, and leaves
// a's 2: each then pays its whole capacity (or a its 2) exactly.
func testAllowAllOneShort(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	short := denied(2, 500*time.Millisecond, p, 10, 4*time.Second)
	for _, tc := range []struct {
		reqs []engine.Request
		at   int
	}{
		{rqs("b", 4, "a", 3, "c", 10), 1},
		{rqs("b", 4, "c", 10, "a", 3), 2},
		{rqs("a", 3, "b", 4, "c", 10), 0},
	} {
		what := "AllowAll" + fmtReqs(tc.reqs)
		a, _ := newSubject(t, f, p)
		expectAllow(t, a, "a", 8, allowed(2, p, 10, 4*time.Second), what+": setup")
		expectAllowAll(t, a, tc.reqs, short, tc.at, what)
		expectAllowAll(t, a, tc.reqs, short, tc.at, what+" again")
		mustEvict(t, a, 0, what+": no full bucket created for b or c")
		expectAllow(t, a, "b", 10, allowed(0, p, 10, 5*time.Second), what+": b untouched")
		expectAllow(t, a, "c", 10, allowed(0, p, 10, 5*time.Second), what+": c untouched")
		expectAllow(t, a, "a", 2, allowed(0, p, 10, 5*time.Second), what+": a kept its 2")
	}
}

// testAllowAllRepeated: capacity 10 at 2 per second. a 4 + a 5 is a's 9:
// admitted with 1 left (9 tokens to refill, 4.5 s) and b's 9 left; a binds,
// at its first request (a tie with its second). a 1 + a 1 is then 2 of a's
// 1: denied, one token short (500 ms), and nothing taken: a still pays 1.
func testAllowAllRepeated(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, _ := newSubject(t, f, p)
	expectAllowAll(t, a, rqs("a", 4, "b", 1, "a", 5), allowed(1, p, 10, 4500*time.Millisecond), 0, "a 4+5")
	expectAllowAll(t, a, rqs("a", 1, "a", 1), denied(1, 500*time.Millisecond, p, 10, 4500*time.Millisecond), 0, "a 1+1 of 1")
	expectAllowAll(t, a, rqs("b", 1, "a", 1, "b", 1, "a", 1), denied(1, 500*time.Millisecond, p, 10, 4500*time.Millisecond), 1,
		"a 1+1 of 1 between b's")
	expectAllow(t, a, "a", 1, allowed(0, p, 10, 5*time.Second), "a kept its 1")
	expectAllow(t, a, "b", 9, allowed(0, p, 10, 5*time.Second), "b paid 1")
}

// testAllowAllAboveCapacity: capacity 10. A key whose costs add up past 10
// can never be admitted: ErrCostExceedsCapacity at the key's first request,
// for the first such key by that request, even where the key could not pay
// a smaller cost either, and nothing is taken. Under capacity
// math.MaxInt64, costs that add up past it are that error too, and costs
// that add up to it are admitted, taking every token.
func testAllowAllAboveCapacity(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, _ := newSubject(t, f, p)
	expectAllow(t, a, "a", 3, allowed(7, p, 10, 1500*time.Millisecond), "setup")
	for _, tc := range []struct {
		reqs []engine.Request
		at   int
	}{
		{rqs("b", 1, "a", 6, "a", 5), 1},
		{rqs("a", 6, "b", 11, "a", 5), 0},
		{rqs("b", 5, "b", 5, "c", 11), 2},
		{rqs("c", 1, "b", 10, "c", 10), 0},
		{[]engine.Request{{Key: "b", Cost: math.MaxInt64}, {Key: "b", Cost: math.MaxInt64}}, 0},
		{[]engine.Request{{Key: "c", Cost: 1}, {Key: "b", Cost: math.MaxInt64}}, 1},
	} {
		expectAllowAllErr(t, t.Context(), a, tc.reqs, engine.ErrCostExceedsCapacity, tc.at, "a sum above capacity 10")
	}
	mustEvict(t, a, 0, "no bucket created")
	expectAllow(t, a, "a", 7, allowed(0, p, 10, 5*time.Second), "a kept its 7")
	expectAllow(t, a, "b", 10, allowed(0, p, 10, 5*time.Second), "b untouched")
	expectAllow(t, a, "c", 10, allowed(0, p, 10, 5*time.Second), "c untouched")

	huge := pol(1, math.MaxInt64, 1)
	b, _ := newSubject(t, f, huge)
	expectAllowAllErr(t, t.Context(), b, []engine.Request{{Key: "j", Cost: 1}, {Key: "k", Cost: math.MaxInt64}, {Key: "j", Cost: 1}, {Key: "k", Cost: 1}},
		engine.ErrCostExceedsCapacity, 1, "k's costs add up past math.MaxInt64")
	d, at, err := b.AllowAll(t.Context(), []engine.Request{{Key: "k", Cost: math.MaxInt64 - 1}, {Key: "j", Cost: 1}, {Key: "k", Cost: 1}})
	require.NoError(t, err, "k's costs add up to math.MaxInt64")
	require.True(t, d.Allowed && d.Remaining == 0 && at == 0, "k pays every token and binds: %+v at %d", d, at)
	expectAllow(t, b, "k", 1, denied(0, time.Second, huge, math.MaxInt64, d.ResetAfter), "k is empty")
}

// testAllowAllErrorOrder: with two faults, the one the rules check first
// wins: every key before any cost, each by index; then closed, then the
// context, and only then a cost above capacity. Nothing is taken.
func testAllowAllErrorOrder(t *testing.T, f Factory) {
	live := errSubject(t, f)
	closed := errSubject(t, f)
	require.NoError(t, closed.Close())
	canceled := doneContexts[0].make(t)
	var noCtx context.Context
	for _, tc := range []struct {
		name   string
		reqs   []engine.Request
		ctx    context.Context
		closed bool
		want   error
		at     int
	}{
		{"a key after a bad cost", rqs("k", 0, " ", 1), t.Context(), false, engine.ErrInvalidKey, 1},
		{"the first bad key", rqs("k", 1, "", 1, keyOverMaxBytes, 1), t.Context(), false, engine.ErrInvalidKey, 1},
		{"the first bad cost", rqs("k", 1, "new", 0, "k", -1), t.Context(), false, engine.ErrInvalidCost, 1},
		{"a bad cost after a cost above capacity", rqs("k", 11, "new", 0), t.Context(), false, engine.ErrInvalidCost, 1},
		{"a bad cost after a sum above capacity", rqs("k", 6, "k", 6, "k", -1), t.Context(), false, engine.ErrInvalidCost, 2},
		{"a bad key before closed and done", rqs("k", 1, "\t", 1), canceled, true, engine.ErrInvalidKey, 1},
		{"a bad cost before closed and done", rqs("k", 0), canceled, true, engine.ErrInvalidCost, 0},
		{"closed before done", rqs("k", 1), canceled, true, engine.ErrClosed, -1},
		{"closed before nil context", rqs("k", 1), noCtx, true, engine.ErrClosed, -1},
		{"closed before above capacity", rqs("k", 11), t.Context(), true, engine.ErrClosed, -1},
		{"nil context", rqs("k", 1, "new", 1), noCtx, false, engine.ErrNilContext, -1},
		{"done before above capacity", rqs("new", 1, "k", 11), canceled, false, context.Canceled, -1},
		{"done before a sum above capacity", rqs("k", 6, "k", 5), canceled, false, context.Canceled, -1},
	} {
		a := live
		if tc.closed {
			a = closed
		}
		expectAllowAllErr(t, tc.ctx, a, tc.reqs, tc.want, tc.at, tc.name)
	}
	for _, dc := range doneContexts {
		expectAllowAllErr(t, dc.make(t), live, rqs("k", 1), dc.want, -1, dc.name)
	}
	probeUnchanged(t, live, "after the failed AllowAll calls")
}

// testAllowAllSize: no requests, or more than engine.MaxAllowAll, is
// ErrAllowAllSize before anything else; exactly MaxAllowAll is decided:
// 64 new keys each pay 1 of 10 and keep 9 (one token, 500 ms, to refill),
// a tie the first wins.
func testAllowAllSize(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, _ := newSubject(t, f, p)
	closed, _ := newSubject(t, f, p)
	require.NoError(t, closed.Close())
	over := make([]engine.Request, engine.MaxAllowAll+1)
	for i := range over {
		over[i] = engine.Request{Key: "", Cost: 0}
	}
	canceled := doneContexts[0].make(t)
	expectAllowAllErr(t, t.Context(), a, nil, engine.ErrAllowAllSize, -1, "nil")
	expectAllowAllErr(t, t.Context(), a, []engine.Request{}, engine.ErrAllowAllSize, -1, "empty")
	expectAllowAllErr(t, t.Context(), a, over, engine.ErrAllowAllSize, -1, "MaxAllowAll+1 bad requests")
	expectAllowAllErr(t, canceled, closed, over, engine.ErrAllowAllSize, -1, "MaxAllowAll+1 bad requests, closed and done")
	most := make([]engine.Request, engine.MaxAllowAll)
	for i := range most {
		most[i] = engine.Request{Key: fmt.Sprint("n", i), Cost: 1}
	}
	expectAllowAllErr(t, t.Context(), a, append(most, engine.Request{Key: "n0", Cost: 1}), engine.ErrAllowAllSize, -1, "MaxAllowAll+1 good requests")
	expectAllowAll(t, a, most, allowed(9, p, 10, 500*time.Millisecond), 0, "MaxAllowAll requests")
	for i, r := range most {
		expectAllow(t, a, r.Key, 9, allowed(0, p, 10, 5*time.Second), fmt.Sprintf("request %d paid 1", i))
	}
}

// testAllowAllBinding: capacity 10 at 2 per second. a holds 0 and b 1.
// Denied: c 1 passes, b 3 lacks 2 (1 s), a 3 lacks 3 (1.5 s): a binds; with
// a 2 (also 1 s) b and a tie and b, first, binds. Admitted: d 2 and e 2
// both keep 8: a tie, d; then d 1, e 3, f 5 keep 7, 5 and 5: e. Whole
// tokens decide: at 250 ms b holds 1.5 and pays 1, keeping 0.5 (0 whole,
// 9.5 tokens and 4.75 s to full), as h keeps 0 after paying its 10: a
// tie, and b, first, binds, though its fraction is more.
func testAllowAllBinding(t *testing.T, f Factory) {
	p := pol(1, 10, 2)
	a, clk := newSubject(t, f, p)
	expectAllow(t, a, "a", 10, allowed(0, p, 10, 5*time.Second), "setup")
	expectAllow(t, a, "b", 9, allowed(1, p, 10, 4500*time.Millisecond), "setup")
	expectAllowAll(t, a, rqs("c", 1, "b", 3, "a", 3), denied(0, 1500*time.Millisecond, p, 10, 5*time.Second), 2, "a waits longest")
	expectAllowAll(t, a, rqs("c", 1, "b", 3, "a", 2), denied(1, time.Second, p, 10, 4500*time.Millisecond), 1, "b and a tie")
	expectAllowAll(t, a, rqs("d", 2, "e", 2), allowed(8, p, 10, time.Second), 0, "d and e tie")
	expectAllowAll(t, a, rqs("d", 1, "e", 3, "f", 5), allowed(5, p, 10, 2500*time.Millisecond), 1, "e and f tie")
	clk.Set(250 * ms)
	expectAllowAll(t, a, rqs("b", 1, "h", 10), allowed(0, p, 10, 4750*time.Millisecond), 0, "whole tokens tie")
	expectAllow(t, a, "c", 10, allowed(0, p, 10, 5*time.Second), "c never paid")
}

// testAllowAllBands: the second worked example (capacity 5 at 5 per
// second, "daily" 20 at 20 per day). At t=0 x pays 3 and y 1: x's primary
// keeps 2 (its 3 tokens refill in 600 ms), fewer than its daily 17, and
// binds. At t=4s "user" has emptied daily (playDaily): a call with it is
// denied by daily, 4,316 s, and "other" pays nothing. At t=4320s user's
// daily holds one token: user 1 and fresh 1 are admitted, user's daily
// left at 0 binding over fresh's primary 4.
func testAllowAllBands(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	expectAllowAll(t, a, rqs("x", 3, "y", 1), allowed(2, p, 5, 600*time.Millisecond), 0, "t=0")
	playDaily(t, a, clk.Set, p, "user")
	expectAllowAll(t, a, rqs("other", 1, "user", 1), inBand(denied(0, 4316*time.Second, p, 20, 86396*time.Second), "daily"), 1,
		"t=4s, user's daily is empty")
	expectAllow(t, a, "other", 5, allowed(0, p, 5, time.Second), "t=4s, other paid nothing")
	clk.Set(4320 * second)
	expectAllowAll(t, a, rqs("fresh", 1, "user", 1), inBand(allowed(0, p, 20, 86400*time.Second), "daily"), 1,
		"t=4320s, one daily token")
	expectAllow(t, a, "user", 1, inBand(denied(0, 4320*time.Second, p, 20, 86400*time.Second), "daily"), "t=4320s, user paid its token")
}

// testAllowAllConcurrent: 20 callers at one instant, each asking for a
// token of "s" (capacity 10, 1 per second, the clock still) and one of its
// own key p0..p3 (five callers each), in either order. Exactly 10 are
// admitted; each denial is s's, 1 s, at s's index; and each p key lost
// exactly the tokens of its admitted callers, no more.
func testAllowAllConcurrent(t *testing.T, f Factory) {
	const callers, own = 20, 4
	p := pol(1, 10, 1)
	a, _ := newSubject(t, f, p)
	type answer struct {
		g   int
		d   engine.Decision
		at  int
		err error
	}
	answers := make(chan answer, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range callers {
		rs := rqs("s", 1, fmt.Sprint("p", g%own), 1)
		if g%2 == 1 {
			rs[0], rs[1] = rs[1], rs[0]
		}
		wg.Go(func() {
			<-start
			d, at, err := a.AllowAll(t.Context(), rs)
			answers <- answer{g, d, at, err}
		})
	}
	close(start)
	wg.Wait()
	close(answers)
	var paid [own]int64
	admitted := 0
	for ans := range answers {
		require.NoError(t, ans.err, "caller %d", ans.g)
		if ans.d.Allowed {
			admitted++
			paid[ans.g%own]++
			continue
		}
		require.Equal(t, denied(0, time.Second, p, 10, 10*time.Second), ans.d, "caller %d: a denial is s's", ans.g)
		require.Equal(t, ans.g%2, ans.at, "caller %d: a denial binds at s's request", ans.g)
	}
	require.Equal(t, 10, admitted, "s holds 10 tokens")
	expectAllow(t, a, "s", 1, denied(0, time.Second, p, 10, 10*time.Second), "s is empty")
	for k := range own {
		expectAllow(t, a, fmt.Sprint("p", k), 10-paid[k], allowed(0, p, 10, 10*time.Second),
			fmt.Sprintf("p%d paid for its %d admitted callers only", k, paid[k]))
	}
}

// A random differential test of AllowAll against the math/big model, over
// plain policies and policies with bands, among every other operation.

// allowAll decides reqs as one on both and compares the Decision, the
// index and the error.
func (w *modelled) allowAll(reqs []engine.Request) {
	w.t.Helper()
	want, wantAt, wantErr := w.m.AllowAll(w.clk.Now(), reqs)
	got, at, err := w.a.AllowAll(w.t.Context(), reqs)
	call := "AllowAll" + fmtReqs(reqs)
	if err != nil {
		w.logf("%s -> error %v at %d", call, err, at)
	} else {
		w.logf("%s -> %s at %d", call, fmtResult(got, nil), at)
	}
	if errors.Is(wantErr, engine.ErrAllowAllSize) {
		require.ErrorIs(w.t, err, engine.ErrAllowAllSize, "%s: %s returned the wrong error", w.where(), call)
	} else {
		w.requireSameErr(wantErr, err, call)
		require.Equal(w.t, errors.Is(wantErr, engine.ErrCostExceedsCapacity), errors.Is(err, engine.ErrCostExceedsCapacity),
			"%s: %s: ErrCostExceedsCapacity, or a cost below 1?", w.where(), call)
	}
	require.Equal(w.t, want, got, "%s: %s decided differently from the model", w.where(), call)
	require.Equal(w.t, wantAt, at, "%s: %s named another request than the model", w.where(), call)
}

// genAllowAll draws an AllowAll call under p: 1 to 6 requests over genKeys
// with repeats, small costs so that calls are admitted as well as denied;
// a quarter of the calls may carry bad keys, bad costs and costs above
// capacity, and now and then a call has no requests, MaxAllowAll or more.
func genAllowAll(r *rand.Rand, p policy.Policy) []engine.Request {
	n := 1 + r.IntN(6)
	switch r.IntN(30) {
	case 0:
		n = 0
	case 1:
		n = engine.MaxAllowAll + 1
	case 2:
		n = engine.MaxAllowAll
	}
	bad := n <= 6 && r.IntN(4) == 0 // a call that may carry bad keys and costs
	rs := make([]engine.Request, 0, n)
	for len(rs) < n {
		key := genKeys[r.IntN(len(genKeys))]
		if bad {
			key = genKey(r)
		}
		var cost int64
		if bad && r.IntN(2) == 0 {
			cost = genCost(r, p, key)
		} else {
			capacity := model.LimitOf(p, key).Capacity
			cost = 1 + r.Int64N(max(1, min(capacity, 1+capacity/3)))
		}
		rs = append(rs, engine.Request{Key: key, Cost: cost})
	}
	return rs
}

// AllowAll differential runs: seeds, and operations per seed, each seed
// over plain policies and over policies with bands.
const allowAllOps = 150

var allowAllSeeds = []uint64{1, 2, 3}

func testAllowAllDifferential(t *testing.T, f Factory) {
	for _, bands := range []bool{false, true} {
		for _, seed := range allowAllSeeds {
			name := fmt.Sprintf("bands=%t/seed=%d", bands, seed)
			t.Run(name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 0xa11a11))
				gen := genPolicy
				if bands {
					gen = genBandPolicy
				}
				w := newModelled(t, f, gen(t, r, policy.Policy{}), "allowall "+name)
				for range allowAllOps {
					switch p := r.IntN(100); {
					case p < 25:
						w.advance(genStep(r, r.IntN(3) == 0))
					case p < 70:
						w.allowAll(genAllowAll(r, w.m.Policy()))
					case p < 82:
						key := genKey(r)
						w.allow(key, genCost(r, w.m.Policy(), key))
					case p < 88:
						w.batch(genBatch(r, w.m.Policy()), 0)
					case p < 92:
						w.evict()
					default:
						w.cutover(gen(t, r, w.m.Policy()))
					}
				}
				for _, key := range genKeys {
					w.allow(key, 1)
				}
			})
		}
	}
}
