package admissiontest

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// The errors of one decision (package engine's doc, section Errors), each
// with the zero Decision and a probe that proves the failed call changed
// nothing.

var errorBehaviours = []behaviour{
	{"InvalidKey", testInvalidKey},
	{"InvalidCost", testInvalidCost},
	{"CostAboveCapacity", testCostAboveCapacity},
	{"DoneContext", testDoneContext},
	{"Closed", testClosed},
	{"Order", testErrorOrder},
}

// The error tests share one setup: under errPolicy, "k" spends 3 of its 10
// tokens at errSetup and "evictable" 1 (full again at 1.5s); the bad calls
// are made at errLater, when "k" holds 9 tokens and "evictable" is full.
const (
	errSetup = 1 * second
	errLater = 2 * second
)

var errPolicy = pol(1, 10, 2)

// Keys at the edge of the default bound of 256 bytes.
var (
	keyOfMaxBytes   = strings.Repeat("k", engine.DefaultMaxKeyBytes)
	keyOverMaxBytes = strings.Repeat("k", engine.DefaultMaxKeyBytes+1)
)

// invalidKeys are blank by strings.TrimSpace (Unicode spaces too) or longer
// than 256 bytes; "ééé…" is short in runes but not in bytes.
var invalidKeys = []string{
	"", " ", "\t\n", " \v\f\r\t\n ", "\u00a0\u2003\u3000\u0085",
	keyOverMaxBytes, strings.Repeat("é", engine.DefaultMaxKeyBytes/2+1),
}

// errSubject builds the shared setup and leaves the clock at errLater.
func errSubject(t *testing.T, f Factory) engine.Admitter {
	t.Helper()
	a, clk := newSubject(t, f, errPolicy)
	clk.Set(errSetup)
	expectAllow(t, a, "k", 3, allowed(7, errPolicy, 10, 1500*time.Millisecond), "setup at 1s")
	expectAllow(t, a, "evictable", 1, allowed(9, errPolicy, 10, 500*time.Millisecond), "setup at 1s")
	clk.Set(errLater)
	return a
}

// probeUnchanged proves, at errLater, that nothing changed since errSubject:
// EvictFull removes only "evictable" (a bucket created by a failed call
// would be full and removed too), and "k" holds 7 tokens plus the 2 earned
// since 1s.
func probeUnchanged(t *testing.T, a engine.Admitter, what string) {
	t.Helper()
	mustEvict(t, a, 1, what+": probe, only \"evictable\" is full (a failed call created no bucket)")
	expectAllow(t, a, "k", 1, allowed(8, errPolicy, 10, time.Second), what+": probe, \"k\" kept its balance")
	requirePolicy(t, errPolicy, a.Policy(), "%s: probe, the policy", what)
}

func testInvalidKey(t *testing.T, f Factory) {
	a := errSubject(t, f)
	for _, key := range invalidKeys {
		expectAllowErr(t, t.Context(), a, key, 1, engine.ErrInvalidKey, "an invalid key")
	}
	probeUnchanged(t, a, "after invalid keys")
	// A key of exactly the bound, or with spaces around other bytes, is valid.
	for _, key := range []string{keyOfMaxBytes, " padded\t", "ключ"} {
		expectAllow(t, a, key, 1, allowed(9, errPolicy, 10, 500*time.Millisecond), "a valid key")
	}
}

func testInvalidCost(t *testing.T, f Factory) {
	a := errSubject(t, f)
	for _, key := range []string{"k", "new"} {
		for _, cost := range []int64{0, -1, -10, math.MinInt64} {
			expectAllowErr(t, t.Context(), a, key, cost, engine.ErrInvalidCost, "a cost below 1")
		}
	}
	probeUnchanged(t, a, "after costs below 1")
}

// testCostAboveCapacity: a request that can never be admitted gets an
// error, never a finite retry estimate, and spends nothing.
func testCostAboveCapacity(t *testing.T, f Factory) {
	a := errSubject(t, f)
	for _, key := range []string{"k", "new"} {
		for _, cost := range []int64{11, 12, math.MaxInt64} {
			expectAllowErr(t, t.Context(), a, key, cost, engine.ErrCostExceedsCapacity, "a cost above the capacity of 10")
		}
	}
	probeUnchanged(t, a, "after costs above capacity")
	expectAllow(t, a, "new", 10, allowed(0, errPolicy, 10, 5*time.Second), "a cost of exactly the capacity")
}

// testDoneContext: a context already over when the call starts gives its
// error from every call, and nothing changes.
func testDoneContext(t *testing.T, f Factory) {
	for _, dc := range doneContexts {
		t.Run(dc.name, func(t *testing.T) {
			a := errSubject(t, f)
			ctx := dc.make(t)
			for _, key := range []string{"k", "new", "evictable"} {
				expectAllowErr(t, ctx, a, key, 1, dc.want, "a done context")
			}

			reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "new", Cost: 1}, {Key: " ", Cost: 1}, {Key: "k", Cost: 0}}
			out := garbageOut(len(reqs))
			require.ErrorIs(t, a.AllowBatch(ctx, reqs, out), dc.want, "AllowBatch with a done context returns its error")
			want := []error{dc.want, dc.want, engine.ErrInvalidKey, engine.ErrInvalidCost}
			for i := range reqs {
				require.ErrorIs(t, out[i].Err, want[i], "AllowBatch with a done context: out[%d] for %+v", i, reqs[i])
				require.Zero(t, out[i].Decision, "AllowBatch with a done context: out[%d] carries an error and a non-zero Decision", i)
			}

			n, err := a.EvictFull(ctx)
			require.ErrorIs(t, err, dc.want, "EvictFull with a done context")
			require.Zero(t, n, "EvictFull with a done context evicted keys")

			err = a.ReplacePolicy(ctx, pol(2, 20, 4), errPolicy.Version)
			require.ErrorIs(t, err, dc.want, "ReplacePolicy with a done context")

			probeUnchanged(t, a, "after calls with a done context")
			// No cutover is left half done: a live one goes through.
			mustReplace(t, a, pol(2, 20, 4), errPolicy.Version, "after a ReplacePolicy with a done context")
		})
	}
}

// testClosed: after Close every call is ErrClosed, except the checks a
// caller makes without state, and Close and Policy keep answering.
func testClosed(t *testing.T, f Factory) {
	a := errSubject(t, f)
	require.NoError(t, a.Close(), "the first Close")
	require.NoError(t, a.Close(), "a second Close")

	for _, tc := range []struct {
		key  string
		cost int64
	}{{"k", 1}, {"new", 1}, {"k", 11}, {"k", math.MaxInt64}} {
		expectAllowErr(t, t.Context(), a, tc.key, tc.cost, engine.ErrClosed, "after Close")
	}

	reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "new", Cost: 1}, {Key: "", Cost: 1}, {Key: "k", Cost: 0}}
	out := garbageOut(len(reqs))
	require.ErrorIs(t, a.AllowBatch(t.Context(), reqs, out), engine.ErrClosed, "AllowBatch after Close")
	want := []error{engine.ErrClosed, engine.ErrClosed, engine.ErrInvalidKey, engine.ErrInvalidCost}
	for i := range reqs {
		require.ErrorIs(t, out[i].Err, want[i], "AllowBatch after Close: out[%d] for %+v", i, reqs[i])
		require.Zero(t, out[i].Decision, "AllowBatch after Close: out[%d] carries an error and a non-zero Decision", i)
	}

	n, err := a.EvictFull(t.Context())
	require.ErrorIs(t, err, engine.ErrClosed, "EvictFull after Close")
	require.Zero(t, n, "EvictFull after Close evicted keys")
	require.ErrorIs(t, a.ReplacePolicy(t.Context(), pol(2, 20, 4), errPolicy.Version), engine.ErrClosed, "ReplacePolicy after Close")

	requirePolicy(t, errPolicy, a.Policy(), "Policy after Close still answers")
	require.NoError(t, a.Close(), "a third Close")
}

// errOrderCase is a call with two faults: the one checked first must win.
// The order is the key, the cost below 1, closed, the context, and only then
// (in the key's shard) the cost above the key's capacity.
type errOrderCase struct {
	name   string
	key    string
	cost   int64
	done   bool // with a canceled context
	closed bool // on a closed subject
	want   error
}

var errOrderCases = []errOrderCase{
	{"invalid key before invalid cost", "", 0, false, false, engine.ErrInvalidKey},
	{"invalid key before cost above capacity", keyOverMaxBytes, 11, false, false, engine.ErrInvalidKey},
	{"invalid key before done context", " ", 1, true, false, engine.ErrInvalidKey},
	{"invalid key before closed", "\t", 1, true, true, engine.ErrInvalidKey},
	{"invalid cost before done context", "k", -1, true, false, engine.ErrInvalidCost},
	{"invalid cost before closed", "k", 0, true, true, engine.ErrInvalidCost},
	{"closed before done context", "k", 1, true, true, engine.ErrClosed},
	{"closed before cost above capacity", "k", 11, false, true, engine.ErrClosed},
	{"done context before cost above capacity", "k", 11, true, false, context.Canceled},
	{"done context before cost above capacity on a new key", "new", 11, true, false, context.Canceled},
}

func testErrorOrder(t *testing.T, f Factory) {
	live := errSubject(t, f)
	closed := errSubject(t, f)
	require.NoError(t, closed.Close())
	canceled := doneContexts[0].make(t)
	for _, tc := range errOrderCases {
		a, ctx := live, t.Context()
		if tc.closed {
			a = closed
		}
		if tc.done {
			ctx = canceled
		}
		expectAllowErr(t, ctx, a, tc.key, tc.cost, tc.want, tc.name)
	}
	// ReplacePolicy has its own order: an invalid next wins over
	// everything, then closed, then the context, then staleness.
	for _, tc := range []struct {
		name     string
		a        engine.Admitter
		ctx      context.Context
		next     policy.Policy
		expected int64
		want     error
	}{
		{"invalid before stale", live, t.Context(), pol(0, 20, 4), 7, policy.ErrInvalid},
		{"invalid before done context", live, canceled, pol(2, 0, 4), 1, policy.ErrInvalid},
		{"invalid before closed", closed, canceled, pol(2, 20, -4), 9, policy.ErrInvalid},
		{"closed before stale", closed, t.Context(), pol(1, 20, 4), 5, engine.ErrClosed},
		{"closed before done context", closed, canceled, pol(2, 20, 4), 1, engine.ErrClosed},
		{"done context before stale", live, canceled, pol(1, 20, 4), 5, context.Canceled},
	} {
		err := tc.a.ReplacePolicy(tc.ctx, tc.next, tc.expected)
		require.ErrorIs(t, err, tc.want, "%s: ReplacePolicy(%+v, %d)", tc.name, tc.next, tc.expected)
	}
	requirePolicy(t, errPolicy, closed.Policy(), "Policy after Close")
	probeUnchanged(t, live, "after the two-fault calls")
}
