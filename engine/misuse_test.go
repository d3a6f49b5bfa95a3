package engine_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// misuseWatchdog is how long a misused call may take before the test calls
// it hung: every one of them must return at once.
const misuseWatchdog = 2 * time.Second

// nilCtx is the nil context the misuse tests pass on purpose. A variable,
// not the literal, so that staticcheck (SA1012) keeps flagging real code.
var nilCtx context.Context

// misuseCall is one call of an exported Engine method: what it returns
// besides its error (its Decision, count, results...) and the error.
type misuseCall func(e *engine.Engine) (any, error)

// misuseCase is one misuse and what it must give.
type misuseCase struct {
	method string // the Engine method it calls
	name   string
	call   misuseCall
	want   error // nil for none
	value  any   // what call must return besides the error
}

// promptly runs call on e in its own goroutine and fails the test, naming
// the call what, if it panics or has not returned within misuseWatchdog.
func promptly(t *testing.T, what string, e *engine.Engine, call misuseCall) (any, error) {
	t.Helper()
	type outcome struct {
		value    any
		err      error
		panicked any
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		defer func() {
			o.panicked = recover()
			done <- o
		}()
		o.value, o.err = call(e)
	}()
	select {
	case o := <-done:
		require.Nil(t, o.panicked, "%s panicked", what)
		return o.value, o.err
	case <-time.After(misuseWatchdog):
		require.FailNow(t, what+" did not return", "still running after %v", misuseWatchdog)
		return nil, nil
	}
}

func runMisuse(t *testing.T, e *engine.Engine, cases []misuseCase) {
	t.Helper()
	for _, tc := range cases {
		value, err := promptly(t, tc.method+": "+tc.name, e, tc.call)
		if tc.want == nil {
			require.NoError(t, err, "%s: %s", tc.method, tc.name)
		} else {
			require.ErrorIs(t, err, tc.want, "%s: %s", tc.method, tc.name)
		}
		require.Equal(t, tc.value, value, "%s: %s", tc.method, tc.name)
	}
}

// filledOut is a result slice of n with garbage in it, so a write shows.
func filledOut(n int) []engine.Result {
	out := make([]engine.Result, n)
	for i := range out {
		out[i] = engine.Result{Decision: engine.Decision{Remaining: -7}, Err: errors.New("untouched")}
	}
	return out
}

// errsOf returns the errors of out.
func errsOf(out []engine.Result) []error {
	errs := make([]error, len(out))
	for i, r := range out {
		errs[i] = r.Err
	}
	return errs
}

// zeroEngineCases call every exported method of a zero Engine, some with
// arguments that are wrong as well: being uninitialized is reported first.
func zeroEngineCases() []misuseCase {
	bg := context.Background()
	reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "", Cost: 1}, {Key: "k", Cost: 0}}
	notInit := []error{engine.ErrNotInitialized, engine.ErrNotInitialized, engine.ErrNotInitialized}
	next := pol(2, 10, 1)
	return []misuseCase{
		{"Allow", "valid request", func(e *engine.Engine) (any, error) { return e.Allow(bg, "k", 1) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Allow", "invalid key and cost", func(e *engine.Engine) (any, error) { return e.Allow(bg, "", 0) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Allow", "nil context", func(e *engine.Engine) (any, error) { return e.Allow(nilCtx, "k", 1) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Peek", "valid request", func(e *engine.Engine) (any, error) { return e.Peek(bg, "k") },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Refund", "valid request", func(e *engine.Engine) (any, error) { return e.Refund(bg, "k", 1) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Charge", "valid request", func(e *engine.Engine) (any, error) { return e.Charge(bg, "k", 1) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"Wait", "valid request", func(e *engine.Engine) (any, error) { return e.Wait(bg, "k", 1) },
			engine.ErrNotInitialized, engine.Decision{}},
		{"AllowBatch", "every result gets the error", func(e *engine.Engine) (any, error) {
			out := filledOut(len(reqs))
			err := e.AllowBatch(bg, reqs, out)
			return errsOf(out), err
		}, engine.ErrNotInitialized, notInit},
		{"AllowBatch", "out too short", func(e *engine.Engine) (any, error) {
			out := filledOut(1)
			err := e.AllowBatch(bg, reqs, out)
			return errsOf(out), err
		}, engine.ErrNotInitialized, notInit[:1]},
		{"AllowBatch", "nil context", func(e *engine.Engine) (any, error) {
			out := filledOut(len(reqs))
			err := e.AllowBatch(nilCtx, reqs, out)
			return errsOf(out), err
		}, engine.ErrNotInitialized, notInit},
		{"AllowAll", "valid requests", func(e *engine.Engine) (any, error) {
			d, i, err := e.AllowAll(bg, reqs)
			return [2]any{d, i}, err
		}, engine.ErrNotInitialized, [2]any{engine.Decision{}, -1}},
		{"AllowAll", "no requests, nil context", func(e *engine.Engine) (any, error) {
			d, i, err := e.AllowAll(nilCtx, nil)
			return [2]any{d, i}, err
		}, engine.ErrNotInitialized, [2]any{engine.Decision{}, -1}},
		{"EvictFull", "live context", func(e *engine.Engine) (any, error) { return e.EvictFull(bg) },
			engine.ErrNotInitialized, 0},
		{"EvictFull", "nil context", func(e *engine.Engine) (any, error) { return e.EvictFull(nilCtx) },
			engine.ErrNotInitialized, 0},
		{"ReplacePolicy", "valid policy", func(e *engine.Engine) (any, error) { return nil, e.ReplacePolicy(bg, next, 1) },
			engine.ErrNotInitialized, nil},
		{"ReplacePolicy", "invalid policy", func(e *engine.Engine) (any, error) {
			return nil, e.ReplacePolicy(bg, policy.Policy{}, 1)
		}, engine.ErrNotInitialized, nil},
		{"Snapshot", "nothing written", func(e *engine.Engine) (any, error) {
			var buf bytes.Buffer
			err := e.Snapshot(bg, &buf)
			return buf.Len(), err
		}, engine.ErrNotInitialized, 0},
		{"SnapshotFile", "no file tried", func(e *engine.Engine) (any, error) {
			// In a directory that does not exist: trying to make the file
			// would fail with the file system's error instead.
			return nil, e.SnapshotFile(bg, filepath.Join(os.TempDir(), "tokenshard-misuse-no-such-dir", "snap"))
		}, engine.ErrNotInitialized, nil},
		{"Stats", "the zero Stats", func(e *engine.Engine) (any, error) { return e.Stats(), nil },
			nil, engine.Stats{}},
		{"KeyCount", "zero", func(e *engine.Engine) (any, error) { return e.KeyCount(), nil },
			nil, 0},
		{"MaxKeys", "zero", func(e *engine.Engine) (any, error) { return e.MaxKeys(), nil },
			nil, 0},
		{"Policy", "the zero Policy", func(e *engine.Engine) (any, error) { return e.Policy(), nil },
			nil, policy.Policy{}},
		{"ReclaimAfter", "no estimate", func(e *engine.Engine) (any, error) {
			d, ok := e.ReclaimAfter()
			return [2]any{d, ok}, nil
		}, nil, [2]any{time.Duration(0), false}},
		{"Close", "nil", func(e *engine.Engine) (any, error) { return nil, e.Close() },
			nil, nil},
		{"Close", "nil again", func(e *engine.Engine) (any, error) { return nil, e.Close() },
			nil, nil},
	}
}

// testOnlyMethods are exported only to this package's tests (export_test.go).
var testOnlyMethods = []string{"ShardOf"}

// TestMisuseZeroEngine: a zero Engine, and a nil *Engine, answer every
// exported method at once, without a panic: ErrNotInitialized or the zero
// value each method documents.
func TestMisuseZeroEngine(t *testing.T) {
	cases := zeroEngineCases()
	ty := reflect.TypeFor[*engine.Engine]()
	for i := range ty.NumMethod() {
		name := ty.Method(i).Name
		if slices.Contains(testOnlyMethods, name) {
			continue
		}
		require.True(t, slices.ContainsFunc(cases, func(c misuseCase) bool { return c.method == name }),
			"no misuse case calls Engine.%s", name)
	}
	t.Run("zero", func(t *testing.T) { runMisuse(t, new(engine.Engine), cases) })
	t.Run("nil", func(t *testing.T) { runMisuse(t, nil, cases) })
}

// nilContextCases call every method that takes a context with a nil one, on
// a live engine of capacity 10: the stateless checks on the key and cost
// come first, then ErrNilContext where the context's error would be, before
// anything the shard decides (a cost above capacity).
func nilContextCases() []misuseCase {
	reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "", Cost: 1}, {Key: "k", Cost: 0}, {Key: "k", Cost: 11}}
	return []misuseCase{
		{"Allow", "valid request", func(e *engine.Engine) (any, error) { return e.Allow(nilCtx, "k", 1) },
			engine.ErrNilContext, engine.Decision{}},
		{"Allow", "invalid key first", func(e *engine.Engine) (any, error) { return e.Allow(nilCtx, " ", 1) },
			engine.ErrInvalidKey, engine.Decision{}},
		{"Allow", "cost below 1 first", func(e *engine.Engine) (any, error) { return e.Allow(nilCtx, "k", 0) },
			engine.ErrInvalidCost, engine.Decision{}},
		{"Allow", "before cost above capacity", func(e *engine.Engine) (any, error) { return e.Allow(nilCtx, "k", 11) },
			engine.ErrNilContext, engine.Decision{}},
		{"Peek", "valid request", func(e *engine.Engine) (any, error) { return e.Peek(nilCtx, "k") },
			engine.ErrNilContext, engine.Decision{}},
		{"Refund", "valid request", func(e *engine.Engine) (any, error) { return e.Refund(nilCtx, "k", 1) },
			engine.ErrNilContext, engine.Decision{}},
		{"Charge", "above every capacity", func(e *engine.Engine) (any, error) { return e.Charge(nilCtx, "k", 11) },
			engine.ErrNilContext, engine.Decision{}},
		{"Wait", "valid request", func(e *engine.Engine) (any, error) { return e.Wait(nilCtx, "k", 1) },
			engine.ErrNilContext, engine.Decision{}},
		{"AllowBatch", "like a done context", func(e *engine.Engine) (any, error) {
			out := filledOut(len(reqs))
			err := e.AllowBatch(nilCtx, reqs, out)
			return errsOf(out), err
		}, engine.ErrNilContext, []error{engine.ErrNilContext, engine.ErrInvalidKey, engine.ErrInvalidCost, engine.ErrNilContext}},
		{"EvictFull", "nothing swept", func(e *engine.Engine) (any, error) { return e.EvictFull(nilCtx) },
			engine.ErrNilContext, 0},
		{"ReplacePolicy", "valid policy", func(e *engine.Engine) (any, error) {
			return nil, e.ReplacePolicy(nilCtx, pol(2, 20, 2), 1)
		}, engine.ErrNilContext, nil},
		{"ReplacePolicy", "invalid policy first", func(e *engine.Engine) (any, error) {
			return nil, e.ReplacePolicy(nilCtx, policy.Policy{}, 1)
		}, engine.ErrInvalidPolicy, nil},
		{"Snapshot", "nothing written", func(e *engine.Engine) (any, error) {
			var buf bytes.Buffer
			err := e.Snapshot(nilCtx, &buf)
			return buf.Len(), err
		}, engine.ErrNilContext, 0},
	}
}

// TestMisuseNilContext: every method that takes a context answers a nil one
// at once with ErrNilContext, in its place in the error order, changing
// nothing; after Close, ErrClosed comes first.
func TestMisuseNilContext(t *testing.T) {
	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: shards})
		cases := nilContextCases()
		runMisuse(t, e, cases)
		require.Zero(t, e.KeyCount(), "a nil context creates no key")
		require.Equal(t, pol(1, 10, 1), e.Policy(), "a nil context changes no policy")

		require.NoError(t, e.Close())
		// ErrNilContext went to the requests that passed the stateless
		// checks: two of Allow, Peek, Refund, Charge, Wait and two of the
		// batch.
		st := e.Stats()
		require.Equal(t, uint64(8), st.Caller.Other, "nil contexts are counted as other errors")
		require.Equal(t, uint64(2), st.Caller.InvalidKey)
		require.Equal(t, uint64(2), st.Caller.InvalidCost)
		require.Equal(t, st.Caller, st.Total.Errors, "no nil-context request reached a shard")

		for i := range cases {
			if cases[i].want == engine.ErrNilContext {
				cases[i].want = engine.ErrClosed
				if errs, ok := cases[i].value.([]error); ok {
					errs = slices.Clone(errs)
					for j := range errs {
						if errs[j] == engine.ErrNilContext {
							errs[j] = engine.ErrClosed
						}
					}
					cases[i].value = errs
				}
			}
		}
		runMisuse(t, e, cases)
	})
}

// TestCostErrors: a cost below 1 is ErrInvalidCost itself; a cost above the
// key's capacity is ErrCostExceedsCapacity, which errors.Is also matches to
// ErrInvalidCost, from Allow and AllowBatch alike; Stats counts both kinds
// as invalid costs.
func TestCostErrors(t *testing.T) {
	set, err := policy.NewOverrideSet(policy.Override{Match: "small", Capacity: 3, TokensPerSecond: 1})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: set}
	require.False(t, errors.Is(engine.ErrInvalidCost, engine.ErrCostExceedsCapacity), "ErrInvalidCost is not ErrCostExceedsCapacity")
	require.ErrorIs(t, engine.ErrCostExceedsCapacity, engine.ErrInvalidCost)

	behavEachShards(t, func(t *testing.T, shards int) {
		e, _ := newEngine(t, engine.Config{Policy: p, Shards: shards})
		ctx := context.Background()
		below := []struct {
			key  string
			cost int64
		}{{"k", 0}, {"k", -1}, {"small", 0}}
		above := []struct {
			key  string
			cost int64
		}{{"k", 11}, {"new", 1 << 62}, {"small", 4}}
		for _, c := range below {
			d, err := e.Allow(ctx, c.key, c.cost)
			require.Equal(t, engine.ErrInvalidCost, err, "Allow(%q, %d)", c.key, c.cost)
			require.Zero(t, d)
		}
		for _, c := range above {
			d, err := e.Allow(ctx, c.key, c.cost)
			require.Equal(t, engine.ErrCostExceedsCapacity, err, "Allow(%q, %d)", c.key, c.cost)
			require.ErrorIs(t, err, engine.ErrInvalidCost, "Allow(%q, %d)", c.key, c.cost)
			require.Zero(t, d)
		}
		d, err := e.Allow(ctx, "small", 3)
		require.NoError(t, err, "the override's own capacity is admissible")
		require.True(t, d.Allowed)

		var reqs []engine.Request
		for _, c := range below {
			reqs = append(reqs, engine.Request{Key: c.key, Cost: c.cost})
		}
		for _, c := range above {
			reqs = append(reqs, engine.Request{Key: c.key, Cost: c.cost})
		}
		out := filledOut(len(reqs))
		require.NoError(t, e.AllowBatch(ctx, reqs, out))
		for i, r := range out {
			want := engine.ErrInvalidCost
			if i >= len(below) {
				want = engine.ErrCostExceedsCapacity
			}
			require.Equal(t, want, r.Err, "out[%d] for %+v", i, reqs[i])
			require.ErrorIs(t, r.Err, engine.ErrInvalidCost, "out[%d] for %+v", i, reqs[i])
			require.Zero(t, r.Decision, "out[%d]", i)
		}

		require.NoError(t, e.Close()) // the counts are final
		st := e.Stats()
		n := uint64(2 * (len(below) + len(above)))
		require.Equal(t, n, st.Total.Errors.InvalidCost, "both kinds count as invalid costs")
		require.Equal(t, n, st.Total.Errors.Sum(), "and as nothing else")
		require.Equal(t, uint64(2*len(below)), st.Caller.InvalidCost, "a cost below 1 is refused by the caller")
	})
}
