package redisstore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestExecAnswersEveryRound: requests of one key past ChunkSize go in
// later rounds, and every one is answered, also when a whole round is
// answered without a call to Redis (requests pinned to a version no longer
// in force, answered errMoved): the rounds after it are still sent, or
// answered so.
func TestExecAnswersEveryRound(t *testing.T) {
	s := &Store{shards: make([]shardKeys, 1)}
	s.cur.Store(newState(policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1}))
	s.kmap.Store(&keyMap{})
	const n = 3*ChunkSize + 1
	items := make([]item, n)
	out := make([]engine.Result, n)
	for i := range items {
		items[i] = item{out: &out[i], key: "hot", cost: 1, pin: 1}
	}
	_, err := s.exec(context.Background(), "a", "", items)
	require.NoError(t, err)
	for i := range items {
		require.True(t, items[i].done, "request %d not answered", i)
		require.ErrorIs(t, out[i].Err, errMoved, "request %d", i)
	}
}
