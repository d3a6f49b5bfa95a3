package admissiontest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Charge: a cost taken without a decision, into debt down to each band's
// floor (minus its capacity), repaid by refill before any request passes.
var chargeBehaviours = []behaviour{
	{"WorkedExampleDebt", testChargeDebt},
	{"WorkedExampleFloor", testChargeFloor},
	{"WorkedExampleBands", testChargeBands},
	{"Errors", testChargeErrors},
	{"RefundAndEvict", testChargeRefundEvict},
	{"Cutover", testChargeCutover},
}

// expectCharge calls Charge and requires the Decision want.
func expectCharge(t *testing.T, a engine.Admitter, key string, tokens int64, want engine.Decision, what string) {
	t.Helper()
	d, err := a.Charge(t.Context(), key, tokens)
	if err != nil {
		t.Fatalf("%s: Charge(%q, %d): %v", what, key, tokens, err)
	}
	if d != want {
		t.Fatalf("%s: Charge(%q, %d)\n got %+v\nwant %+v", what, key, tokens, d, want)
	}
}

// testChargeDebt: capacity 10, 1 per second. Allow 4 leaves 6; Charge 12
// leaves -6; Allow 1 waits 7 s, and passes at 7 s with 0 left.
func testChargeDebt(t *testing.T, f Factory) {
	p := pol(1, 10, 1)
	a, clk := newSubject(t, f, p)
	expectAllow(t, a, "k", 4, allowed(6, p, 10, 4*time.Second), "t=0, Allow 4")
	expectCharge(t, a, "k", 12, allowed(-6, p, 10, 16*time.Second), "t=0, Charge 12")
	expectAllow(t, a, "k", 1, denied(-6, 7*time.Second, p, 10, 16*time.Second), "t=0, in debt")
	clk.Set(7*second - 1)
	expectAllow(t, a, "k", 1, denied(0, 1, p, 10, 9*time.Second+1), "one ns short")
	clk.Set(7 * second)
	expectAllow(t, a, "k", 1, allowed(0, p, 10, 10*time.Second), "t=7s, repaid")
}

// testChargeFloor: a new key charged 25 at capacity 10 stops at the floor,
// -10 (5 forgiven), and then waits 11 s for one token.
func testChargeFloor(t *testing.T, f Factory) {
	p := pol(1, 10, 1)
	a, _ := newSubject(t, f, p)
	expectCharge(t, a, "new", 25, allowed(-10, p, 10, 20*time.Second), "t=0, Charge 25 of a new key")
	expectAllow(t, a, "new", 1, denied(-10, 11*time.Second, p, 10, 20*time.Second), "t=0, at the floor")
	expectCharge(t, a, "new", 1<<62, allowed(-10, p, 10, 20*time.Second), "t=0, at the floor already")
}

// testChargeBands: capacity 5 at 5 per second and 20 per day; a new key
// charged 30 leaves the primary at its floor -5 and "daily" at -10, which
// binds; one token then waits for 11 daily tokens, 47,520 s.
func testChargeBands(t *testing.T, f Factory) {
	p := dailyPolicy(t, 1)
	a, clk := newSubject(t, f, p)
	expectCharge(t, a, "new", 30, inBand(allowed(-10, p, 20, 30*4320*time.Second), "daily"), "t=0, Charge 30")
	expectAllow(t, a, "new", 1, inBand(denied(-10, 47_520*time.Second, p, 20, 30*4320*time.Second), "daily"), "t=0, in debt")
	clk.Set(47_520*second - 1)
	expectAllow(t, a, "new", 1, inBand(denied(0, 1, p, 20, 19*4320*time.Second+1), "daily"), "one ns short")
	clk.Set(47_520 * second)
	expectAllow(t, a, "new", 1, inBand(allowed(0, p, 20, 20*4320*time.Second), "daily"), "t=47520s, repaid")
}

// testChargeErrors: Allow's errors, less the cost bound; an error changes
// nothing.
func testChargeErrors(t *testing.T, f Factory) {
	p := pol(1, 10, 1)
	a, _ := newSubject(t, f, p)
	for _, c := range []struct {
		key    string
		tokens int64
		want   error
	}{{" ", 0, engine.ErrInvalidKey}, {"k", 0, engine.ErrInvalidCost}, {"k", -1, engine.ErrInvalidCost}} {
		if _, err := a.Charge(t.Context(), c.key, c.tokens); !errors.Is(err, c.want) {
			t.Fatalf("Charge(%q, %d) = %v, want %v", c.key, c.tokens, err, c.want)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := a.Charge(ctx, "k", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Charge under a canceled context = %v", err)
	}
	expectAllow(t, a, "k", 10, allowed(0, p, 10, 10*time.Second), "the errors took nothing")
}

// testChargeRefundEvict: a bucket in debt is not full and is never
// evicted; Refund repays a debt, capped at the capacity.
func testChargeRefundEvict(t *testing.T, f Factory) {
	p := pol(1, 10, 1)
	a, clk := newSubject(t, f, p)
	expectCharge(t, a, "k", 15, allowed(-5, p, 10, 15*time.Second), "t=0, Charge 15")
	clk.Set(second / 2)
	mustEvict(t, a, 0, "t=0.5s, in debt")
	d, err := a.Refund(t.Context(), "k", 3)
	if err != nil {
		t.Fatalf("Refund: %v", err)
	}
	// -4.5 + 3 = -1.5: floor -2, and 11.5 s to full.
	if want := (engine.Decision{Remaining: -2, RetryAfter: 2500 * time.Millisecond, Version: 1, Limit: 10, ResetAfter: 11500 * time.Millisecond}); d != want {
		t.Fatalf("Refund of a debt\n got %+v\nwant %+v", d, want)
	}
	clk.Set(12 * second)
	mustEvict(t, a, 1, "t=12s, repaid and full")
	expectCharge(t, a, "k", 3, allowed(7, p, 10, 3*time.Second), "t=12s, a charge within the balance")
}

// testChargeCutover: a cutover keeps a debt, clamped to the new floor if
// that is shallower, and a change of period rounds toward more debt.
func testChargeCutover(t *testing.T, f Factory) {
	p := pol(1, 10, 1)
	a, _ := newSubject(t, f, p)
	expectCharge(t, a, "k", 16, allowed(-6, p, 10, 16*time.Second), "t=0, Charge 16")
	p2 := pol(2, 4, 1)
	mustReplace(t, a, p2, 1, "to capacity 4")
	expectAllow(t, a, "k", 1, denied(-4, 5*time.Second, p2, 4, 8*time.Second), "the debt clamped to -4")

	// 1 per minute (one unit per ns, 6e10 units a token) to 1 per second
	// (1e9 units a token): a debt of one unit becomes floor(-1/60) = -1
	// unit, not 0.
	q := policy.Policy{Version: 1, Capacity: 5, Refill: policy.PerMinute(1)}
	b, clk2 := newSubject(t, f, q)
	expectCharge(t, b, "k", 6, allowed(-1, q, 5, 360*time.Second), "t=0, Charge 6")
	clk2.Set(60*second - 1)
	q2 := pol(2, 5, 1)
	mustReplace(t, b, q2, 1, "to 1 per second")
	expectAllow(t, b, "k", 1, denied(-1, time.Second+1, q2, 5, 5*time.Second+1), "one unit of debt, kept")
}
