package redisstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// The cutover carries the primary to the primary whatever its name
// (policy.CutoverLevels): a key that moves from the policy's limit to an
// override of a higher capacity is a raise.
func TestLeaseRaisesPairsPrimaries(t *testing.T) {
	lim := func(c int64) policy.Limit {
		p := policy.Policy{Version: 1, Capacity: c, TokensPerSecond: 1}
		_, idx := p.Resolve("k")
		return p.ShapeAt(idx).Primary
	}
	prev := policy.Shape{Name: "", Primary: lim(100)}
	next := policy.Shape{Name: "gold", Primary: lim(10_000)}
	require.True(t, raises(prev, next))
}
