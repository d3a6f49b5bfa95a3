package admissiontest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// modelled drives a subject and the math/big sequential model
// (internal/model, the contract written to be checked by eye, answering in
// the engine's types through internal/enginemodel) with the same calls at
// the same clock readings, and requires identical answers: every unit of
// every balance shows in Remaining, RetryAfter and ResetAfter, so a
// difference anywhere surfaces at the next call that touches it.
//
// Every call is written to a log, which is printed if the test fails, so a
// failure can be replayed by hand from the log alone.
type modelled struct {
	t   *testing.T
	a   engine.Admitter
	clk *clock.Manual
	m   *enginemodel.Model
	log []string
}

// newModelled builds a subject serving p and its model, and prints the log
// with what (the seed and variant) if the test fails.
func newModelled(t *testing.T, f Factory, p policy.Policy, what string) *modelled {
	t.Helper()
	a, clk := newSubject(t, f, p)
	w := &modelled{t: t, a: a, clk: clk, m: enginemodel.New(p, 0, 0)}
	w.logf("start %s under %s", what, fmtPolicy(p))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("op log of %s (%d ops; replay it against a fresh subject to reproduce):\n%s",
				what, len(w.log), strings.Join(w.log, "\n"))
		}
	})
	return w
}

func (w *modelled) logf(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf("%4d t=%d ", len(w.log), w.clk.Now())+fmt.Sprintf(format, args...))
}

// where names the last logged op, for failure messages that point at the
// op log.
func (w *modelled) where() string {
	return fmt.Sprintf("op %d at t=%d (see the op log)", len(w.log)-1, w.clk.Now())
}

// advance moves the clock forward by d, saturating at math.MaxInt64 as the
// Manual clock does.
func (w *modelled) advance(d time.Duration) {
	w.clk.Advance(d)
	w.logf("advance %d", d)
}

// set moves the clock to at, which must not be before its reading.
func (w *modelled) set(at int64) {
	w.clk.Set(at)
	w.logf("set %d", at)
}

// sentinels are the errors a subject may return; the model's answer is
// matched to the first of them it is, and the subject's must be that one
// too. ErrCostExceedsCapacity comes before ErrInvalidCost, which it wraps.
var sentinels = []error{
	engine.ErrInvalidKey, engine.ErrCostExceedsCapacity, engine.ErrInvalidCost, engine.ErrKeyCapacity, engine.ErrStalePolicy,
	engine.ErrClockRegression, engine.ErrClosed, engine.ErrInvalidConfig, policy.ErrInvalid,
	context.Canceled, context.DeadlineExceeded,
}

// requireSameErr requires got to be the error want is (nil for nil).
func (w *modelled) requireSameErr(want, got error, call string) {
	w.t.Helper()
	if want == nil {
		require.NoError(w.t, got, "%s: %s failed where the model succeeded", w.where(), call)
		return
	}
	for _, s := range sentinels {
		if errors.Is(want, s) {
			require.ErrorIs(w.t, got, s, "%s: %s returned the wrong error", w.where(), call)
			return
		}
	}
	require.FailNow(w.t, "the model returned an unknown error", "%s: %s: %v", w.where(), call, want)
}

// allow decides one request on both and compares everything.
func (w *modelled) allow(key string, cost int64) {
	w.t.Helper()
	now := w.clk.Now()
	want, wantErr := w.m.Allow(now, key, cost)
	got, err := w.a.Allow(w.t.Context(), key, cost)
	call := fmt.Sprintf("Allow(%s, %d)", fmtKey(key), cost)
	w.logf("%s -> %s", call, fmtResult(got, err))
	w.requireSameErr(wantErr, err, call)
	require.Equal(w.t, want, got, "%s: %s decided differently from the model", w.where(), call)
}

// batch decides reqs on both, into an out longer than reqs by extra.
func (w *modelled) batch(reqs []engine.Request, extra int) {
	w.t.Helper()
	want := w.m.AllowBatch(w.clk.Now(), reqs)
	out := garbageOut(len(reqs) + extra)
	err := w.a.AllowBatch(w.t.Context(), reqs, out)
	parts := make([]string, len(reqs))
	for i, r := range reqs {
		parts[i] = fmt.Sprintf("{%s, %d} -> %s", fmtKey(r.Key), r.Cost, fmtResult(out[i].Decision, out[i].Err))
	}
	w.logf("AllowBatch[%d+%d] -> %v: %s", len(reqs), extra, err, strings.Join(parts, "; "))
	require.NoError(w.t, err, "%s: AllowBatch: per-request errors belong in out[i].Err", w.where())
	for i := range reqs {
		call := fmt.Sprintf("AllowBatch request %d {%s, %d}", i, fmtKey(reqs[i].Key), reqs[i].Cost)
		w.requireSameErr(want[i].Err, out[i].Err, call)
		require.Equal(w.t, want[i].Decision, out[i].Decision, "%s: %s decided differently from the model", w.where(), call)
	}
	require.Equal(w.t, garbageOut(extra), out[len(reqs):], "%s: AllowBatch wrote beyond len(reqs)", w.where())
}

// evict runs EvictFull on both and compares the counts.
func (w *modelled) evict() {
	w.t.Helper()
	want, wantErr := w.m.EvictFull(w.clk.Now())
	got, err := w.a.EvictFull(w.t.Context())
	w.logf("EvictFull -> %d, %v", got, err)
	w.requireSameErr(wantErr, err, "EvictFull")
	require.Equal(w.t, want, got, "%s: EvictFull removed a different number of keys from the model", w.where())
}

// replace runs ReplacePolicy on both, compares the errors and then the
// policy in force.
func (w *modelled) replace(next policy.Policy, expected int64) {
	w.t.Helper()
	wantErr := w.m.ReplacePolicy(w.clk.Now(), next, expected)
	err := w.a.ReplacePolicy(w.t.Context(), next, expected)
	call := fmt.Sprintf("ReplacePolicy(%s, %d)", fmtPolicy(next), expected)
	w.logf("%s -> %v", call, err)
	w.requireSameErr(wantErr, err, call)
	requirePolicy(w.t, w.m.Policy(), w.a.Policy(), "%s: Policy() after %s", w.where(), call)
}

// cutover replaces the policy with next, expecting success.
func (w *modelled) cutover(next policy.Policy) {
	w.t.Helper()
	cur := w.m.Policy()
	require.Greater(w.t, next.Version, cur.Version, "the suite built a stale cutover")
	w.replace(next, cur.Version)
}

// fmtKey quotes a key, shortening long ones so the log stays readable.
func fmtKey(key string) string {
	if len(key) > 24 {
		return fmt.Sprintf("%q…(%d bytes)", key[:8], len(key))
	}
	return fmt.Sprintf("%q", key)
}

func fmtResult(d engine.Decision, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	// Durations in plain nanoseconds, as the clock readings are, so a log
	// line can be replayed and checked by hand.
	return fmt.Sprintf("{Allowed:%t Remaining:%d RetryAfter:%d Version:%d Limit:%d ResetAfter:%d}",
		d.Allowed, d.Remaining, int64(d.RetryAfter), d.Version, d.Limit, int64(d.ResetAfter))
}

// fmtPolicy prints a policy with its overrides' contents, not their address.
func fmtPolicy(p policy.Policy) string {
	s := fmt.Sprintf("{V:%d C:%d R:%d", p.Version, p.Capacity, p.TokensPerSecond)
	for _, o := range p.Overrides.Overrides() {
		s += fmt.Sprintf(" %q:%d/%d", o.Match, o.Capacity, o.TokensPerSecond)
	}
	return s + "}"
}
