package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/policy"
)

// TestConfigShardsBound: Shards up to maxShards is used as given, and one
// more is ErrInvalidConfig. Checked on the validation itself: an engine of
// 65,536 shards is too costly for a unit test, and New fails the same way
// for every count past the bound (errors_test.go).
func TestConfigShardsBound(t *testing.T) {
	valid := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	c, err := Config{Policy: valid, Shards: maxShards}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, maxShards, c.Shards)
	_, err = Config{Policy: valid, Shards: maxShards + 1}.withDefaults()
	assert.ErrorIs(t, err, ErrInvalidConfig)
}
