package main

import (
	"errors"
	"go/parser"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// overrideOf returns the override that gives key its limit under p, and
// how it matched: "exact", or "pattern" with where its stars are; ok is
// false when key gets the default. It is written apart from both policy's
// resolver and the model's, to classify what the harness generates, not to
// judge answers.
func overrideOf(p policy.Policy, key string) (o policy.Override, how []string, ok bool) {
	all := p.Overrides.Overrides()
	for _, o := range all {
		if o.Match == key && !strings.Contains(o.Match, "*") {
			return o, []string{"exact"}, true
		}
	}
	for _, o := range all {
		if strings.Contains(o.Match, "*") && starMatch(o.Match, key) {
			how := []string{"pattern"}
			if strings.HasPrefix(o.Match, "*") {
				how = append(how, "pattern with '*' first")
			}
			if len(o.Match) > 2 && strings.Contains(o.Match[1:len(o.Match)-1], "*") {
				how = append(how, "pattern with '*' inside")
			}
			if strings.HasSuffix(o.Match, "*") {
				how = append(how, "pattern with '*' last")
			}
			return o, how, true
		}
	}
	return policy.Override{}, nil, false
}

// starMatch matches key against pattern, each '*' any run of bytes, by
// dynamic programming over (pattern prefix, key prefix).
func starMatch(pattern, key string) bool {
	prev := make([]bool, len(key)+1) // prev[j]: pattern[:i] matches key[:j]
	prev[0] = true
	for i := range len(pattern) {
		cur := make([]bool, len(key)+1)
		for j := range len(key) + 1 {
			if pattern[i] == '*' {
				cur[j] = prev[j] || (j > 0 && cur[j-1])
			} else {
				cur[j] = j > 0 && prev[j-1] && pattern[i] == key[j-1]
			}
		}
		prev = cur
	}
	return prev[len(key)]
}

func TestStarMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"*", "", true}, {"*", "abc", true}, {"a*", "a", true}, {"a*", "ba", false},
		{"*c", "abc", true}, {"*c", "ca", false}, {"a*c", "ac", true}, {"a*c", "abbc", true},
		{"a*c", "abcd", false}, {"*b*", "abc", true}, {"*b*", "ac", false}, {"a*b*c", "aXbYc", true},
		{"a*b", "a*b", true}, {"ab*ba", "aba", false}, {"\xff*", "\xff\xfe", true},
	} {
		assert.Equal(t, c.want, starMatch(c.pattern, c.key), "%q ~ %q", c.pattern, c.key)
	}
}

// diffOverrideEvents replays tr on the model and counts what it does with
// overrides: decisions under each kind of override, per-key cost bounds,
// keys moving between limits at cutovers, sweeps of overridden keys.
func diffOverrideEvents(tr diffTrace, ev map[string]int) {
	m := enginemodel.New(tr.cfg.policy, tr.cfg.maxKeys, tr.cfg.maxKeyBytes)
	decided := func(p policy.Policy, key string, cost int64, err error) {
		_, how, ok := overrideOf(p, key)
		if err == nil {
			for _, h := range how {
				ev["decided under an override: "+h]++
			}
			if strings.Contains(key, "*") {
				ev["decided a key with '*'"]++
				if ok {
					ev["decided a key with '*' under an override"]++
				}
			}
			if ok && cost > p.Capacity {
				ev["allowed or denied a cost above the default capacity"]++
			}
		}
		if ok && errors.Is(err, engine.ErrInvalidCost) && cost >= 1 && cost <= p.Capacity {
			ev["ErrInvalidCost for a cost within the default capacity"]++
		}
	}
	for _, op := range tr.ops {
		if op.kind == diffBatch && diffAmbiguous(m, tr.cfg, op.reqs) {
			return
		}
		op = op.resolve(m.Policy().Version)
		p := m.Policy()
		switch op.kind {
		case diffAllow:
			_, err := m.Allow(op.t, op.key, op.cost)
			decided(p, op.key, op.cost, err)
		case diffBatch:
			for i, res := range m.AllowBatch(op.t, op.reqs) {
				decided(p, op.reqs[i].Key, op.reqs[i].Cost, res.Err)
			}
		case diffEvict:
			before := m.Keys()
			if _, err := m.EvictFull(op.t); err != nil {
				continue
			}
			after := m.Keys()
			for _, k := range before {
				if _, _, ok := overrideOf(p, k); ok && !slices.Contains(after, k) {
					ev["evicted a key under an override"]++
				}
			}
		case diffCutover:
			keys := m.Keys()
			if m.ReplacePolicy(op.t, op.next, op.expected) != nil {
				continue
			}
			for _, k := range keys {
				oldO, _, oldOK := overrideOf(p, k)
				newO, _, newOK := overrideOf(op.next, k)
				switch {
				case !oldOK && newOK:
					ev["cutover: default -> override"]++
				case oldOK && !newOK:
					ev["cutover: override -> default"]++
				case oldOK && newOK && oldO != newO:
					ev["cutover: override -> another override"]++
				}
				switch oldL, newL := model.LimitOf(p, k), model.LimitOf(op.next, k); {
				case newL.Capacity > oldL.Capacity:
					ev["cutover: a key's own capacity goes up"]++
				case newL.Capacity < oldL.Capacity:
					ev["cutover: a key's own capacity goes down"]++
				}
			}
		}
	}
}

// TestDiffPolicyPrintsAsGo: a policy with overrides prints as the Go
// expression that builds it, here pasted back as code and compared.
func TestDiffPolicyPrintsAsGo(t *testing.T) {
	p := policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2, Overrides: mustOverrides(
		policy.Override{Match: "k1", Capacity: 3, TokensPerSecond: 1},
		policy.Override{Match: "*\xff", Capacity: 20, TokensPerSecond: 7},
		policy.Override{Match: strings.Repeat("x", 13), Capacity: 1, TokensPerSecond: 2})}
	printed := `policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2, Overrides: mustOverrides(` +
		`policy.Override{Match: "k1", Capacity: 3, TokensPerSecond: 1}, ` +
		`policy.Override{Match: "*\xff", Capacity: 20, TokensPerSecond: 7}, ` +
		`policy.Override{Match: strings.Repeat("x", 13), Capacity: 1, TokensPerSecond: 2})}`
	assert.Equal(t, printed, diffPolicy(p))
	_, err := parser.ParseExpr(diffPolicy(p))
	require.NoError(t, err)
	assert.Equal(t, "policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 3}",
		diffPolicy(policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 3}), "no overrides: as before")

	// Every policy the generator makes prints as a Go expression.
	for seed := uint64(1); seed <= 20; seed++ {
		tr := diffGenerate(seed, []int{1, 2, 16}, diffOpsPerTrace)
		_, err := parser.ParseExpr(diffPolicy(tr.cfg.policy))
		require.NoError(t, err, "seed %d: %s", seed, diffPolicy(tr.cfg.policy))
		for _, op := range tr.ops {
			if op.kind == diffCutover {
				_, err := parser.ParseExpr(diffPolicy(op.next))
				require.NoError(t, err, "seed %d: %s", seed, diffPolicy(op.next))
			}
		}
	}
}
