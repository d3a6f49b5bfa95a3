package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestFunctionRefusedFallsBackToEvalsha: a user that may not run FCALL or
// FUNCTION (as on Redis 6.2, which has neither) gets the decide script by
// EVALSHA: every decision is Redis's, none answered by the failure rule.
func TestFunctionRefusedFallsBackToEvalsha(t *testing.T) {
	srv := startPrivate(t)
	admin := client(t, srv.Addr())
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "nofunc", "on", ">pw", "~*", "+@all", "-fcall", "-function").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nofunc", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	st, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	defer st.Close()
	for i := range 5 {
		d, err := st.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, i < 3, d.Allowed, "request %d", i)
	}
	require.Zero(t, st.Stats().Failures)
	require.EqualValues(t, 5, st.Stats().Decisions)
	info := admin.Info(ctx, "commandstats").Val()
	require.Contains(t, info, "cmdstat_fcall:calls=0,", "FCALL was refused, never run")
	require.Regexp(t, `cmdstat_evalsha:calls=([5-9]|\d\d+),`, info, "the decisions ran by EVALSHA")
}
