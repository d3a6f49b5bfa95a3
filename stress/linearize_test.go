package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLinHistories records and checks histories from fixed seeds, partitioned
// and whole, over 1, 2 and 16 shards, and checks that they reach overrides,
// bands and rates of other periods, cutovers that move them, and AllowAlls
// admitted and refused, over several shards where there are several.
func TestLinHistories(t *testing.T) {
	const perCase = 40
	for _, partitioned := range []bool{true, false} {
		for _, shards := range []int{1, 2, 16} {
			t.Run(fmt.Sprintf("partitioned=%v/shards=%d", partitioned, shards), func(t *testing.T) {
				t.Parallel()
				c := &counters{}
				dir := t.TempDir() // for porcupine's visualization of a failure
				for i := range uint64(perCase) {
					seed := uint64(shards)<<8 | i
					if partitioned {
						seed |= 1 << 16
					}
					rng := rand.New(rand.NewPCG(seed, 0))
					spec := linNewSpec(rng, partitioned, shards)
					err := linOne(spec, rng, c, dir)
					require.NoError(t, err, "seed %d: %s", seed, spec)
				}
				// A timeout is not a failure, but it should be rare.
				assert.GreaterOrEqual(t, c.histories.Load(), int64(perCase-2), "histories checked, not timed out")
				assert.Positive(t, c.decisions.Load())
				assert.Positive(t, c.overridden.Load(), "decisions under an override")
				assert.Positive(t, c.limitMoves.Load(), "keys given another limit by a cutover")
				assert.Positive(t, c.multiBand.Load(), "decisions under several bands")
				assert.Positive(t, c.bandBound.Load(), "decisions a band beside the primary bound")
				assert.Positive(t, c.otherPeriod.Load(), "decisions under a rate not per second")
				assert.Positive(t, c.bandMoves.Load(), "bands a cutover added, dropped or reshaped")
				assert.Positive(t, c.allAdmitted.Load(), "AllowAlls admitted")
				assert.Positive(t, c.allRefused.Load(), "AllowAlls refused")
				if shards > 1 {
					assert.Positive(t, c.allSpread.Load(), "AllowAlls decided over several shards")
				}
				t.Logf("AllowAll: %d admitted, %d refused, %d of them over several shards; %d holds given up", c.allAdmitted.Load(), c.allRefused.Load(), c.allSpread.Load(), c.holdsAborted.Load())
				t.Logf("%d decisions, %d under an override, %d keys given another limit by a cutover; %d under several bands (%d bound by a band beside the primary), %d under a rate not per second, %d band changes by cutovers",
					c.decisions.Load(), c.overridden.Load(), c.limitMoves.Load(), c.multiBand.Load(), c.bandBound.Load(), c.otherPeriod.Load(), c.bandMoves.Load())
			})
		}
	}
}

// linOp builds one operation of a hand-made history.
func linOp(client int, call, ret int64, in *linInput, out *linOutput) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func linAllowOp(client int, call, ret int64, key string, d engine.Decision) porcupine.Operation {
	return linOp(client, call, ret, &linInput{kind: linAllow, key: key, costs: []int64{1}},
		&linOutput{res: []linResult{{d: d}}})
}

// linTwoDecisions returns the first two decisions of cost 1 on a fresh key
// under p at time 0: Remaining capacity-1, then capacity-2.
func linTwoDecisions(t *testing.T, p policy.Policy) (first, second engine.Decision) {
	m := enginemodel.New(p, 0, 0)
	first, err := m.Allow(0, "k", 1)
	require.NoError(t, err)
	second, err = m.Allow(0, "k", 1)
	require.NoError(t, err)
	return first, second
}

// TestLinRejectsRemainingGoingUp: the check can fail. An Allow that reports
// Remaining 9 after one that reported Remaining 8, on the same key at the
// same instant, in real-time order, has no linearization; the same two
// answers from overlapping calls do.
func TestLinRejectsRemainingGoingUp(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	nine, eight := linTwoDecisions(t, p)
	require.Equal(t, int64(9), nine.Remaining)
	require.Equal(t, int64(8), eight.Remaining)
	for _, partitioned := range []bool{true, false} {
		spec := &linSpec{partitioned: partitioned, keys: []string{"k", "j"}, maxKeys: 3, pol: p}
		sequential := []porcupine.Operation{
			linAllowOp(0, 1, 2, "k", eight),
			linAllowOp(1, 3, 4, "k", nine),
			linAllowOp(2, 5, 6, "j", nine),
		}
		v, unknown := linCheck(spec, sequential, t.TempDir())
		require.False(t, unknown)
		require.NotNil(t, v, "partitioned=%v", partitioned)
		assert.Equal(t, "linearizability", v.Check)
		assert.Equal(t, "k", v.Key)
		assert.Equal(t, "a linearizable history", v.Want)
		assert.Contains(t, v.Got, "none of these fits next")
		assert.Contains(t, v.Detail, "visualization: ")
		t.Log(v)

		overlapping := []porcupine.Operation{
			linAllowOp(0, 1, 3, "k", eight),
			linAllowOp(1, 2, 4, "k", nine),
		}
		v, unknown = linCheck(spec, overlapping, "")
		assert.False(t, unknown)
		assert.Nil(t, v, "partitioned=%v", partitioned)
	}
}

// TestLinRejectsWrongCounts: in a whole history, a sweep count and a
// KeyCount are checked exactly; a bucket that is not full is not evicted.
func TestLinRejectsWrongCounts(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	nine, _ := linTwoDecisions(t, p)
	spec := &linSpec{keys: []string{"k", "j"}, maxKeys: 1, pol: p}
	sweep := func(call, ret int64, evicted int) []porcupine.Operation {
		out := &linOutput{n: evicted}
		return []porcupine.Operation{
			linOp(1, call, ret, &linInput{kind: linPass, key: "k", sweep: 1, passes: 2, tally: true}, out),
			linOp(1, call, ret, &linInput{kind: linPass, key: "j", sweep: 1, passes: 2, tally: true}, out),
		}
	}
	keyCount := func(call, ret int64, n int) porcupine.Operation {
		return linOp(2, call, ret, &linInput{kind: linKeyCount}, &linOutput{n: n})
	}
	capacity := linOp(0, 9, 10, &linInput{kind: linAllow, key: "j", costs: []int64{1}},
		&linOutput{res: []linResult{{err: engine.ErrKeyCapacity}}})

	good := append([]porcupine.Operation{linAllowOp(0, 1, 2, "k", nine)}, sweep(3, 4, 0)...)
	good = append(good, keyCount(5, 6, 1), capacity)
	v, _ := linCheck(spec, good, "")
	require.Nil(t, v)

	for name, h := range map[string][]porcupine.Operation{
		"sweep evicts a bucket that is not full": append([]porcupine.Operation{linAllowOp(0, 1, 2, "k", nine), keyCount(5, 6, 1)}, sweep(3, 4, 1)...),
		"key count":                              {linAllowOp(0, 1, 2, "k", nine), keyCount(5, 6, 2)},
		"key bound":                              {linAllowOp(0, 1, 2, "k", nine), linAllowOp(0, 3, 4, "j", nine)},
	} {
		v, unknown := linCheck(spec, h, "")
		assert.False(t, unknown, name)
		assert.NotNil(t, v, name)
	}
}

// TestLinRejectsVersionGoingBack: a call invoked after another returned
// never sees an older version, on whatever key.
func TestLinRejectsVersionGoingBack(t *testing.T) {
	d := func(v int64) engine.Decision {
		return engine.Decision{Allowed: true, Remaining: 1, Version: v, Limit: 2}
	}
	h := []porcupine.Operation{
		linAllowOp(0, 1, 2, "a", d(2)),
		linAllowOp(1, 3, 4, "b", d(1)),
	}
	v := linVersions(h)
	require.NotNil(t, v)
	assert.Equal(t, "b", v.Key)
	assert.Equal(t, "version 1", v.Got)
	assert.Contains(t, v.Want, "version >= 2")

	cut := linOp(2, 1, 2, &linInput{kind: linCutover, next: policy.Policy{Version: 3, Capacity: 1, TokensPerSecond: 1}, expected: 2}, &linOutput{})
	require.NotNil(t, linVersions([]porcupine.Operation{cut, linAllowOp(0, 3, 4, "a", d(2))}))
	require.Nil(t, linVersions([]porcupine.Operation{linAllowOp(0, 1, 3, "a", d(2)), linAllowOp(1, 2, 4, "b", d(1))}),
		"overlapping calls may see either order")
}

// TestLinCommand runs the check from the command line for two seconds.
func TestLinCommand(t *testing.T) {
	var buf bytes.Buffer
	status := run(context.Background(), []string{"-check", "linearizability", "-duration", "2s", "-seed", "7"}, &buf, &buf)
	out := buf.String()
	require.Equal(t, 0, status, out)
	m := regexp.MustCompile(`linearizability histories\s*\|\s*(\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	assert.Positive(t, n, out)
	all := regexp.MustCompile(`AllowAll admitted, refused \(over several shards\)\s*\|\s*(\d+), (\d+) \((\d+)\)`).FindStringSubmatch(out)
	require.NotNil(t, all, out)
	for i, what := range []string{"admitted", "refused", "over several shards"} {
		n, err := strconv.Atoi(all[i+1])
		require.NoError(t, err)
		assert.Positive(t, n, "AllowAlls %s\n%s", what, out)
	}
	t.Logf("%d histories in 2s\n%s", n, out)
}

// TestLinRejectsDefaultLimit: the specification gives each key its own
// limit. An overridden key answered under the default limit, a cost within
// the default but above the key's own capacity admitted, and a key a
// cutover moves to an override answered as if it had not moved: none is
// linearizable; the right answers are.
func TestLinRejectsDefaultLimit(t *testing.T) {
	k3 := mustOverrides(policy.Override{Match: "k*", Capacity: 3, TokensPerSecond: 1})
	plain := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	withK3 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: k3}
	allow := func(call int64, key string, cost int64, d engine.Decision, err error) porcupine.Operation {
		return linOp(0, call, call+1, &linInput{kind: linAllow, key: key, costs: []int64{cost}},
			&linOutput{res: []linResult{{d: d, err: err}}})
	}
	decide := func(p policy.Policy, steps func(m *enginemodel.Model)) {
		steps(enginemodel.New(p, 0, 0))
	}
	for _, partitioned := range []bool{true, false} {
		spec := &linSpec{partitioned: partitioned, keys: []string{"k", "j"}, maxKeys: 3, pol: withK3}

		var own, dflt, j engine.Decision
		decide(withK3, func(m *enginemodel.Model) { own, _ = m.Allow(0, "k", 1); j, _ = m.Allow(0, "j", 1) })
		decide(plain, func(m *enginemodel.Model) { dflt, _ = m.Allow(0, "k", 1) })
		require.Equal(t, int64(3), own.Limit)
		require.Equal(t, int64(10), j.Limit, "j matches no override")
		good := []porcupine.Operation{allow(1, "k", 1, own, nil), allow(3, "j", 1, j, nil), allow(5, "k", 5, engine.Decision{}, engine.ErrCostExceedsCapacity)}
		v, _ := linCheck(spec, good, "")
		require.Nil(t, v, "partitioned=%v", partitioned)

		for name, h := range map[string][]porcupine.Operation{
			"default limit": {allow(1, "k", 1, dflt, nil)},
			"cost above the key's own capacity": {allow(1, "k", 1, own, nil), allow(3, "k", 5,
				engine.Decision{Allowed: true, Remaining: 0, Version: 1, Limit: 10, ResetAfter: 5_000_000_000}, nil)},
		} {
			v, unknown := linCheck(spec, h, "")
			assert.False(t, unknown, name)
			assert.NotNil(t, v, "%s, partitioned=%v", name, partitioned)
		}

		// A cutover at 0 moves k from the default to k*'s limit: the
		// bucket spent one of ten tokens and is clamped to three.
		spec = &linSpec{partitioned: partitioned, keys: []string{"k", "j"}, maxKeys: 3, pol: plain}
		next := withK3
		next.Version = 2
		var first, moved, stayed engine.Decision
		decide(plain, func(m *enginemodel.Model) {
			first, _ = m.Allow(0, "k", 1)
			clone := m.Clone()
			require.NoError(t, m.ReplacePolicy(0, next, 1))
			moved, _ = m.Allow(0, "k", 1)
			stale := policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}
			require.NoError(t, clone.ReplacePolicy(0, stale, 1))
			stayed, _ = clone.Allow(0, "k", 1)
		})
		require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 2, Limit: 3, ResetAfter: 1_000_000_000}, moved)
		cut := linOp(1, 3, 4, &linInput{kind: linCutover, next: next, expected: 1}, &linOutput{})
		v, _ = linCheck(spec, []porcupine.Operation{allow(1, "k", 1, first, nil), cut, allow(5, "k", 1, moved, nil)}, "")
		require.Nil(t, v, "partitioned=%v", partitioned)
		v, _ = linCheck(spec, []porcupine.Operation{allow(1, "k", 1, first, nil), cut, allow(5, "k", 1, stayed, nil)}, "")
		require.NotNil(t, v, "partitioned=%v: k kept the default limit across the cutover", partitioned)
		t.Log(v.Want, "; ", v.Got)
	}
}

func linAllowAllOp(client int, call, ret int64, reqs []engine.Request, d engine.Decision, at int, err error) porcupine.Operation {
	return linOp(client, call, ret, &linInput{kind: linAllowAll, reqs: reqs}, &linOutput{res: []linResult{{d: d, err: err}}, n: at})
}

// TestLinAllowAllIsOneStep: an AllowAll takes effect for all its keys at one
// instant. Admitted over a and b (capacity 1 each) while another client
// finds a empty and then b full, it would have to come both before and
// after that client's calls: no linearization, partitioned (a and b joined
// in one part) or whole. Had b been empty too, there is one.
func TestLinAllowAllIsOneStep(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}}
	m := enginemodel.New(p, 0, 0)
	full, err := m.Clone().Allow(0, "b", 1)
	require.NoError(t, err)
	all, at, err := m.AllowAll(0, reqs)
	require.NoError(t, err)
	require.True(t, all.Allowed)
	empty, err := m.Allow(0, "a", 1)
	require.NoError(t, err)
	require.False(t, empty.Allowed)
	for _, partitioned := range []bool{true, false} {
		spec := &linSpec{partitioned: partitioned, shards: 2, keys: []string{"a", "b", "c"}, maxKeys: 4, pol: p}
		h := []porcupine.Operation{
			linAllowAllOp(0, 1, 10, reqs, all, at, nil),
			linAllowOp(1, 2, 3, "a", empty),
			linAllowOp(1, 4, 5, "b", full),
			linAllowOp(2, 6, 7, "c", full),
		}
		if partitioned {
			parts := spec.partition(h)
			require.Len(t, parts, 2, "{a, b} and {c}")
			assert.Len(t, parts[0], 3)
		}
		v, unknown := linCheck(spec, h, "")
		require.False(t, unknown)
		require.NotNil(t, v, "partitioned=%v", partitioned)
		assert.Contains(t, v.Got, "none of these fits next")
		t.Log(v.Got)

		h[2] = linAllowOp(1, 4, 5, "b", empty)
		v, _ = linCheck(spec, h, "")
		assert.Nil(t, v, "partitioned=%v: the AllowAll came first", partitioned)
	}
}

// TestLinAllowAllRefusedTakesNothing: a refused AllowAll takes nothing, so
// after it a fresh key it named is full; an engine that took b's token
// while refusing the call is caught.
func TestLinAllowAllRefusedTakesNothing(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	reqs := []engine.Request{{Key: "b", Cost: 1}, {Key: "a", Cost: 1}}
	m := enginemodel.New(p, 0, 0)
	spent, err := m.Allow(0, "a", 1)
	require.NoError(t, err)
	refused, at, err := m.AllowAll(0, reqs)
	require.NoError(t, err)
	require.False(t, refused.Allowed)
	require.Equal(t, 1, at, "a binds")
	full, err := m.Allow(0, "b", 1)
	require.NoError(t, err)
	require.True(t, full.Allowed)
	empty, err := m.Allow(0, "b", 1)
	require.NoError(t, err)
	for _, partitioned := range []bool{true, false} {
		spec := &linSpec{partitioned: partitioned, shards: 2, keys: []string{"a", "b"}, maxKeys: 3, pol: p}
		h := []porcupine.Operation{
			linAllowOp(0, 1, 2, "a", spent),
			linAllowAllOp(1, 3, 4, reqs, refused, at, nil),
			linAllowOp(0, 5, 6, "b", full),
		}
		v, _ := linCheck(spec, h, "")
		require.Nil(t, v, "partitioned=%v", partitioned)
		h[2] = linAllowOp(0, 5, 6, "b", empty)
		v, _ = linCheck(spec, h, "")
		require.NotNil(t, v, "partitioned=%v: b lost a token to a refused call", partitioned)
		h[1] = linAllowAllOp(1, 3, 4, reqs, refused, 0, nil)
		h[2] = linAllowOp(0, 5, 6, "b", full)
		v, _ = linCheck(spec, h, "")
		require.NotNil(t, v, "partitioned=%v: the binding request misnamed", partitioned)
	}
}

// TestLinAllowAllKeyCapacityIndex: with room for one new key, AllowAll of
// two new keys is ErrKeyCapacity at the second's request on one shard; on
// several, where room is taken shard by shard, at either's; never at a
// tracked key's or a repeated request.
func TestLinAllowAllKeyCapacityIndex(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}
	tracked, err := enginemodel.New(p, 0, 0).Allow(0, "a", 1)
	require.NoError(t, err)
	reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "x", Cost: 1}, {Key: "x", Cost: 1}, {Key: "y", Cost: 1}}
	for _, tc := range []struct {
		shards, at int
		ok         bool
	}{{1, 3, true}, {1, 1, false}, {2, 3, true}, {2, 1, true}, {16, 1, true}, {2, 0, false}, {2, 2, false}} {
		spec := &linSpec{shards: tc.shards, keys: []string{"a", "x", "y"}, maxKeys: 2, pol: p}
		h := []porcupine.Operation{
			linAllowOp(0, 1, 2, "a", tracked),
			linAllowAllOp(0, 3, 4, reqs, engine.Decision{}, tc.at, engine.ErrKeyCapacity),
		}
		v, unknown := linCheck(spec, h, "")
		require.False(t, unknown)
		assert.Equal(t, tc.ok, v == nil, "%d shards, at %d: %v", tc.shards, tc.at, v)
	}
}

// TestLinPartitionJoinsAllowAllKeys: parts are the classes of keys that
// AllowAlls join; an AllowAll answered without reading any key joins
// nothing; every part holds every cutover.
func TestLinPartitionJoinsAllowAllKeys(t *testing.T) {
	spec := &linSpec{partitioned: true, keys: []string{"k0", "k1", "k2", "k3", "k4"}, maxKeys: 9}
	d := engine.Decision{Allowed: true}
	all := func(keys ...string) []engine.Request {
		var reqs []engine.Request
		for _, k := range keys {
			reqs = append(reqs, engine.Request{Key: k, Cost: 1})
		}
		return reqs
	}
	cut := linOp(3, 1, 2, &linInput{kind: linCutover}, &linOutput{})
	h := []porcupine.Operation{
		cut,
		linAllowAllOp(0, 3, 4, all("k2", "k4"), d, 0, nil),
		linAllowAllOp(0, 5, 6, all("k4", "k1", "k4"), d, 0, nil),
		linAllowOp(1, 3, 4, "k3", d),
		linAllowOp(1, 5, 6, "k1", d),
		linAllowAllOp(2, 3, 4, all("k3", " ", "k0"), engine.Decision{}, 1, engine.ErrInvalidKey),
		linAllowAllOp(2, 5, 6, nil, engine.Decision{}, -1, engine.ErrAllowAllSize),
	}
	var got [][]string
	for _, part := range spec.partition(h) {
		assert.Equal(t, cut, part[0], "every part has the cutover")
		var keys []string
		for _, op := range part[1:] {
			keys = append(keys, linDescribeOp(op))
		}
		got = append(got, keys)
	}
	require.Len(t, got, 3, "%q", got)
	assert.Len(t, got[0], 2, "k0's part: the AllowAlls that read nothing: %q", got[0])
	assert.Len(t, got[1], 3, "k1, k2 and k4: %q", got[1])
	assert.Len(t, got[2], 1, "k3 alone: %q", got[2])
}

// TestLinRefund: a Refund's credit is there for the next call, and a Refund
// of an untracked key creates nothing.
func TestLinRefund(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	m := enginemodel.New(p, 0, 0)
	spent, err := m.Allow(0, "a", 1)
	require.NoError(t, err)
	credited, err := m.Refund(0, "a", 1)
	require.NoError(t, err)
	again, err := m.Allow(0, "a", 1)
	require.NoError(t, err)
	denied, err := m.Allow(0, "a", 1)
	require.NoError(t, err)
	untracked, err := m.Refund(0, "b", 1)
	require.NoError(t, err)
	refund := func(client int, call int64, key string, d engine.Decision) porcupine.Operation {
		return linOp(client, call, call+1, &linInput{kind: linRefund, key: key, costs: []int64{1}}, &linOutput{res: []linResult{{d: d}}})
	}
	keyCount := func(call int64, n int) porcupine.Operation {
		return linOp(2, call, call+1, &linInput{kind: linKeyCount}, &linOutput{n: n})
	}
	spec := &linSpec{shards: 1, keys: []string{"a", "b"}, maxKeys: 3, pol: p}
	good := []porcupine.Operation{linAllowOp(0, 1, 2, "a", spent), refund(1, 3, "a", credited), linAllowOp(0, 5, 6, "a", again),
		refund(1, 7, "b", untracked), keyCount(9, 1)}
	v, _ := linCheck(spec, good, "")
	require.Nil(t, v)
	for name, h := range map[string][]porcupine.Operation{
		"credit lost":         {linAllowOp(0, 1, 2, "a", spent), refund(1, 3, "a", credited), linAllowOp(0, 5, 6, "a", denied)},
		"refund created b":    {linAllowOp(0, 1, 2, "a", spent), refund(1, 7, "b", untracked), keyCount(9, 2)},
		"credit not reported": {linAllowOp(0, 1, 2, "a", spent), refund(1, 3, "a", spent)},
	} {
		v, unknown := linCheck(spec, h, "")
		assert.False(t, unknown, name)
		assert.NotNil(t, v, name)
	}
}

// TestParseOptionsAliases: -check takes "linearize" for the
// linearizability check and "diff" for the differential one.
func TestParseOptionsAliases(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-check", "linearize,diff"}, &stderr)
	require.NoError(t, err, stderr.String())
	assert.Equal(t, []string{"linearizability", "differential"}, o.checks)
	_, err = parseOptions([]string{"-check", "linearise"}, &stderr)
	assert.Error(t, err)
}
