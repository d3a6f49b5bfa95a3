package policy_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

func TestValidate(t *testing.T) {
	valid := policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}
	require.NoError(t, valid.Validate())
	require.NoError(t, policy.Policy{Version: maxInt64, Capacity: maxInt64, TokensPerSecond: maxInt64}.Validate())
	require.NoError(t, policy.Policy{Version: 1, Capacity: maxInt64, TokensPerSecond: 1}.Validate())
	require.NoError(t, policy.Policy{Version: 7, Capacity: 10, TokensPerSecond: 2}.Validate())

	fields := []struct {
		name string
		set  func(p *policy.Policy, v int64)
	}{
		{"version", func(p *policy.Policy, v int64) { p.Version = v }},
		{"capacity", func(p *policy.Policy, v int64) { p.Capacity = v }},
		{"tokens per second", func(p *policy.Policy, v int64) { p.TokensPerSecond = v }},
	}
	for _, f := range fields {
		for _, v := range []int64{0, -1, math.MinInt64} {
			p := valid
			f.set(&p, v)
			err := p.Validate()
			require.Error(t, err, "%+v", p)
			require.ErrorIs(t, err, policy.ErrInvalid, "%+v", p)
			require.Contains(t, err.Error(), f.name, "%+v: the message names the field", p)
			for _, other := range fields {
				if other.name != f.name {
					require.NotContains(t, err.Error(), other.name, "%+v: only the bad field is named", p)
				}
			}
		}
	}

	// Several bad fields: the first one is named; the zero Policy is invalid.
	err := policy.Policy{}.Validate()
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.Contains(t, err.Error(), "version")
	err = policy.Policy{Version: 1, Capacity: -5, TokensPerSecond: 0}.Validate()
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.Contains(t, err.Error(), "capacity")

	require.False(t, errors.Is(valid.Validate(), policy.ErrInvalid))
}

func TestPolicyLimitAndComparable(t *testing.T) {
	p := policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2}
	require.Equal(t, policy.Limit{Capacity: 10, TokensPerSecond: 2}, p.Limit())
	q := p
	require.True(t, p == q, "Policy is comparable with ==")
	q.Version++
	require.False(t, p == q)
	require.True(t, p.Limit() == q.Limit(), "Limit is comparable with ==")
}
