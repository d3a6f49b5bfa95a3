package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestDiffSeeds replays fixed seeds on the engine and the model, and checks
// that the traces reach what they are meant to: every error kind, denials,
// the saturated clock, and cutover chains longer than a shard's history.
func TestDiffSeeds(t *testing.T) {
	skipUnderRace(t)
	seen := map[string]int{}
	want := []string{"ErrInvalidKey", "ErrInvalidCost", "ErrCostExceedsCapacity", "ErrKeyCapacity", "ErrStalePolicy", "ErrClockRegression",
		"ErrInvalidConfig", "ErrInvalidPolicy", "Allowed:false", "Allowed:true", "t=9223372036854775807 ", "AllowBatch(", "AllowAll(", "Peek(", "Refund(",
		"Charge(", "Remaining:-", "Snapshot()"}
	longest := 0
	c := &counters{}
	events := map[string]int{}
	allSeen := map[string]int{}
	for seed := uint64(1); seed <= 200; seed++ {
		tr := diffGenerate(seed, []int{1, 2, 16}, diffOpsPerTrace)
		diffOverrideEvents(tr, events)
		out, err := diffReplay(tr, diffNewEngine, c, true)
		require.NoError(t, err)
		if f := out.fail; f != nil { // say what diverged: a replay may not diverge again
			t.Fatalf("seed %d, op %d (t=%d %s) on key %q: want %s, got %s\nreplayed: %v\n%s", seed, f.index, f.op.t, f.op, f.key, f.want, f.got,
				diffCheck(tr, diffNewEngine, nil), strings.Join(out.lines[max(0, len(out.lines)-12):], "\n"))
		}
		require.True(t, out.valid, "seed %d: the generator made a trace outside the contract", seed)
		longest = max(longest, diffTally(out.lines, want, seen))
		for _, l := range out.lines {
			if _, answer, ok := strings.Cut(l, " AllowAll("); ok {
				_, answer, _ = strings.Cut(answer, ") -> ")
				diffTally([]string{answer}, []string{"{Allowed:true", "{Allowed:false", "ErrAllowAllSize", "ErrInvalidKey", "ErrInvalidCost",
					"ErrCostExceedsCapacity", "ErrKeyCapacity", "ErrClockRegression"}, allSeen)
			}
		}
	}

	for _, w := range want {
		assert.Positive(t, seen[w], "no trace produced %s", w)
	}
	for _, w := range []string{"{Allowed:true", "{Allowed:false", "ErrAllowAllSize", "ErrInvalidKey", "ErrInvalidCost", "ErrCostExceedsCapacity", "ErrKeyCapacity", "ErrClockRegression"} {
		assert.Positive(t, allSeen[w], "no AllowAll answered %s", w)
	}
	t.Logf("AllowAll answers: %v", allSeen)
	assert.Greater(t, longest, 64, "no trace cut over more often than a shard keeps history")
	assert.Positive(t, c.decisions.Load())
	t.Logf("decisions %d, errors by kind %v, longest cutover chain %d", c.decisions.Load(), seen, longest)
	for _, e := range []string{
		"decided under an override: exact", "decided under an override: pattern with '*' first",
		"decided under an override: pattern with '*' inside", "decided under an override: pattern with '*' last",
		"decided a key with '*' under an override",
		"allowed or denied a cost above the default capacity", "ErrInvalidCost for a cost within the default capacity",
		"evicted a key under an override",
		"cutover: default -> override", "cutover: override -> default", "cutover: override -> another override",
		"cutover: a key's own capacity goes up", "cutover: a key's own capacity goes down",
	} {
		assert.Positive(t, events[e], "no trace did this: %s", e)
	}
	t.Logf("overrides: %v", events)
}

// diffFault is a planted engine bug: it changes answers the real engine gives.
type diffFault struct {
	diffTarget
	cutOver   bool
	remaining bool // after a cutover, report one token too many when allowed
	retry     bool // round every retry estimate down by 1 ns
	limit     bool // report the default capacity as every decision's Limit
	band      bool // name the primary as every decision's binding band
	bandAdmit bool // report a denial a band beside the primary bound as allowed
	allLast   bool // name an AllowAll's last request as the binding one
	allSome   bool // a refused AllowAll still takes from every key that holds its cost
	debt      bool // a charge into debt reports one token less of debt than it took
}

// fake applies the band faults to one decision for key.
func (f *diffFault) fake(key string, d *engine.Decision) {
	sh := shapeOf(f.policy(), key)
	if f.band {
		d.Band = sh.Name
	}
	if f.bandAdmit && !d.Allowed && d.Band != sh.Name {
		d.Allowed, d.RetryAfter = true, 0
	}
}

func (f *diffFault) replacePolicy(next policy.Policy, expected int64) error {
	err := f.diffTarget.replacePolicy(next, expected)
	f.cutOver = f.cutOver || err == nil
	return err
}

func (f *diffFault) allow(key string, cost int64) (engine.Decision, error) {
	d, err := f.diffTarget.allow(key, cost)
	if f.remaining && f.cutOver && err == nil && d.Allowed {
		d.Remaining++
	}
	if f.retry && err == nil && d.RetryAfter > 0 {
		d.RetryAfter--
	}
	if f.limit && err == nil {
		d.Limit = f.policy().Capacity
	}
	if err == nil {
		f.fake(key, &d)
	}
	return d, err
}

// allowAll and the inspector's calls pass through, unfaulted, when the
// target has them: embedding diffTarget alone would hide them.
func (f *diffFault) allowAll(reqs []engine.Request) (engine.Decision, int, error) {
	d, at, err := f.diffTarget.(diffAllAllower).allowAll(reqs)
	if f.allLast && err == nil {
		at = len(reqs) - 1
	}
	if f.allSome && err == nil && !d.Allowed {
		sums, order := map[string]int64{}, []string(nil)
		for _, r := range reqs {
			if _, ok := sums[r.Key]; !ok {
				order = append(order, r.Key)
			}
			sums[r.Key] += r.Cost
		}
		for _, k := range order {
			_, _ = f.diffTarget.allow(k, sums[k]) // taken if k holds it: not all or nothing
		}
	}
	return d, at, err
}

func (f *diffFault) peek(key string) (engine.Decision, error) {
	return f.diffTarget.(diffInspector).peek(key)
}

func (f *diffFault) refund(key string, tokens int64) (engine.Decision, error) {
	return f.diffTarget.(diffInspector).refund(key, tokens)
}

func (f *diffFault) charge(key string, tokens int64) (engine.Decision, error) {
	d, err := f.diffTarget.(diffCharger).charge(key, tokens)
	if f.debt && err == nil && d.Remaining < 0 {
		d.Remaining++
	}
	return d, err
}

func (f *diffFault) snapshotRestore() error {
	return f.diffTarget.(diffSnapshotter).snapshotRestore()
}

func (f *diffFault) allowBatch(reqs []engine.Request, out []engine.Result) error {
	err := f.diffTarget.allowBatch(reqs, out)
	for i := range out {
		if f.retry && out[i].Err == nil && out[i].Decision.RetryAfter > 0 {
			out[i].Decision.RetryAfter--
		}
		if f.limit && err == nil && out[i].Err == nil && i < len(reqs) { // a decision, not an untouched result
			out[i].Decision.Limit = f.policy().Capacity
		}
		if err == nil && out[i].Err == nil && i < len(reqs) { // not the untouched results of a refused batch
			f.fake(reqs[i].Key, &out[i].Decision)
		}
	}
	return err
}

// diffTripAndShrink finds the first trace from gen that trips the fault
// behind mk, and checks that it shrinks to at most maxOps ops that still
// fail, at the last op, with the fault and pass on honest. It returns the
// trace that tripped.
func diffTripAndShrink(t *testing.T, gen func(seed uint64) diffTrace, mk, honest diffMaker, maxOps int) diffTrace {
	t.Helper()
	var tr diffTrace
	for seed := uint64(1); ; seed++ {
		require.Less(t, seed, uint64(100), "no trace tripped the planted fault")
		tr = gen(seed)
		out, err := diffReplay(tr, mk, nil, false)
		require.NoError(t, err)
		if out.fail != nil {
			break
		}
	}
	small, replays := diffShrink(tr, mk)
	t.Logf("seed %d: %d ops shrunk to %d in %d replays", tr.seed, len(tr.ops), len(small.ops), replays)
	assert.LessOrEqual(t, len(small.ops), maxOps)
	out, err := diffReplay(small, mk, nil, false)
	require.NoError(t, err)
	require.NotNil(t, out.fail, "the shrunk trace no longer fails")
	assert.Equal(t, len(small.ops)-1, out.fail.index, "the failure is the last op")
	clean, err := diffReplay(small, honest, nil, false)
	require.NoError(t, err)
	assert.Nil(t, clean.fail, "the shrunk trace fails without the fault")
	return tr
}

// TestDiffShrink plants faults behind the engine and checks that a failing
// trace shrinks to a reproduction of a couple of ops that still fails with
// the fault and passes without it.
func TestDiffShrink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  diffFault
		maxOps int
		op     string
	}{
		{"remaining after cutover", diffFault{remaining: true}, 2, "Allow("},
		{"retry rounded down", diffFault{retry: true}, 3, "Allow"},
		{"default limit reported", diffFault{limit: true}, 2, "Allow"},
		{"AllowAll's binding request misnamed", diffFault{allLast: true}, 1, "AllowAll("},
		{"AllowAll refused but taken in part", diffFault{allSome: true}, 3, ""},
		{"debt rounded toward zero", diffFault{debt: true}, 1, "Charge("},
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
			assert.Equal(t, "differential", v.Check)
			assert.Equal(t, tr.seed, v.Seed)
			assert.Contains(t, v.Op, tc.op)
			assert.NotEqual(t, v.Want, v.Got)
			lines := strings.Split(v.Detail, "\n")
			assert.LessOrEqual(t, len(lines), 5+tc.maxOps, "reproduce, shrink, config, ops, want, got")
			assert.True(t, strings.HasPrefix(strings.TrimSpace(lines[len(lines)-2]), "want "), lines[len(lines)-2])
			assert.True(t, strings.HasPrefix(strings.TrimSpace(lines[len(lines)-1]), "got "), lines[len(lines)-1])
			if tc.fault.limit {
				// One override is all it takes, and the shrinker leaves no more.
				assert.Equal(t, 1, strings.Count(v.Detail, "policy.Override{"), v.Detail)
				assert.Contains(t, v.Detail, "// mustOverrides: ")
			}
		})
	}
}

func TestDiffDDMin(t *testing.T) {
	xs := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	calls := 0
	got := diffDDMin(xs, func(s []int) bool {
		calls++
		return slices.Contains(s, 3) && slices.Contains(s, 7)
	})
	assert.Equal(t, []int{3, 7}, got)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, xs, "the input is left alone")
	t.Logf("%d calls", calls)
}

// TestDiffErrorsCompareBySentinel: the engine wraps its stale-policy error,
// the model does not; both are the same answer.
func TestDiffErrorsCompareBySentinel(t *testing.T) {
	assert.Equal(t, "ErrStalePolicy", diffErr(errors.Join(errors.New("context"), engine.ErrStalePolicy)))
	assert.Equal(t, "ErrInvalidPolicy", diffErr(policy.Policy{}.Validate()))
	assert.Equal(t, "nil", diffErr(nil))
	assert.Contains(t, diffErr(errors.New("boom")), "unexpected")
	assert.Equal(t, "ErrKeyCapacity with decision {Allowed:true Remaining:0 RetryAfter:0 Version:0 Limit:0 ResetAfter:0}",
		diffDecision(engine.Decision{Allowed: true}, engine.ErrKeyCapacity), "an error must come with the zero Decision")
}

// TestDiffCommand runs the check from the command line for two seconds.
func TestDiffCommand(t *testing.T) {
	var buf bytes.Buffer
	code := run(context.Background(), []string{"-check", "differential", "-duration", "2s", "-seed", "7"}, &buf, &buf)
	require.Equal(t, 0, code, buf.String())
	m := regexp.MustCompile(`differential traces\s*\|\s*(\d+)`).FindStringSubmatch(buf.String())
	require.NotNil(t, m, buf.String())
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	assert.Positive(t, n, buf.String())
}

// diffTally counts, in a rendered replay, the lines containing each of want
// into seen, and returns how many cutovers succeeded.
func diffTally(lines, want []string, seen map[string]int) (cutovers int) {
	for _, l := range lines {
		for _, w := range want {
			if strings.Contains(l, w) {
				seen[w]++
			}
		}
		if strings.Contains(l, "ReplacePolicy(") && strings.Contains(l, ") -> nil;") {
			cutovers++
		}
	}
	return cutovers
}

// skipUnderRace skips a sequential check against the model under the race
// detector: one goroutine replays the traces, so the detector watches only
// the engine's own machinery, which the concurrent checks run under it, and
// the model ran several times slower there. `go test work` without -race
// runs it, and so does CI, after the race step.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a sequential check against the model: `go test work` without -race runs it")
	}
}
