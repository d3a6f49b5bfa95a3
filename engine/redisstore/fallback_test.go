package redisstore_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// noFuncClient is a client of srv that may not run FCALL or FUNCTION, as
// on Redis 6, which has neither (there, any user), and an admin client.
func noFuncClient(t *testing.T, srv *redistest.Server) (c, admin *redis.Client) {
	admin = client(t, srv.Addr())
	ctx := context.Background()
	deny := []any{"-fcall", "-function"}
	if redis.HasErrorPrefix(admin.Do(ctx, "FUNCTION", "LIST").Err(), "unknown command") {
		deny = nil // an ACL refuses to name them
	}
	require.NoError(t, admin.Do(ctx, append([]any{"ACL", "SETUSER", "nofunc", "on", ">pw", "~*", "+@all"}, deny...)...).Err())
	c = redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nofunc", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c, admin
}

// TestFunctionRefusedFallsBackToEvalsha: a user that may not run FCALL or
// FUNCTION (as on Redis 6, which has neither) gets the decide script by
// EVALSHA: every decision is Redis's, none answered by the failure rule.
func TestFunctionRefusedFallsBackToEvalsha(t *testing.T) {
	c, admin := noFuncClient(t, startPrivate(t))
	ctx := context.Background()
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
	require.NotRegexp(t, `cmdstat_fcall:calls=[1-9]`, info, "FCALL was refused, never run")
	require.Regexp(t, `cmdstat_evalsha:calls=([5-9]|\d\d+),`, info, "the decisions ran by EVALSHA")
}

// TestFunctionRefusedConcurrentFirstCalls: of two first calls in flight at
// once, both sent by FCALL and refused, the one whose refusal is read after
// the other has turned the store to EVALSHA is sent again by EVALSHA too,
// not answered by the failure rule. A hook holds the first call's refusal
// until the second's has loaded the script.
func TestFunctionRefusedConcurrentFirstCalls(t *testing.T) {
	c, _ := noFuncClient(t, startPrivate(t))
	ctx := context.Background()
	held, loaded := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var load sync.Once
	c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		switch {
		case cmd.Name() == "script": // SCRIPT LOAD, after the second call's refusal
			load.Do(func() { close(loaded) })
		case cmd.Name() == "fcall" && first.CompareAndSwap(false, true):
			close(held)
			select { // bounded: without the second call, the test fails below
			case <-loaded:
			case <-time.After(5 * time.Second):
			}
		}
		return err
	}})
	st, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: 10 * time.Second})
	require.NoError(t, err)
	defer st.Close()
	answer := make(chan engine.Decision, 1)
	go func() {
		d, _ := st.Allow(ctx, "a", 1)
		answer <- d
	}()
	<-held
	d, err := st.Allow(ctx, "b", 1)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, d, "the second call")
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, <-answer, "the first call")
	require.Zero(t, st.Stats().Failures)
}

// TestScriptsNeedOnlyRedis60: the scripts send no command or option that
// Redis 6.0 lacks, so that the store runs there (its suite passes on
// 6.0.16): SET's PXAT (6.2) was a syntax error there, which failed every
// decision that set an expiry. decide.lua sends it only where the server's
// REDIS_VERSION_NUM (7.0 and later: v7) says it has it, since a PEXPIREAT
// after the SET costs a written bucket about twice the script's time.
func TestScriptsNeedOnlyRedis60(t *testing.T) {
	const guarded = "IF AT AND V7 THEN RCALL('SET', KEY, VAL, 'PXAT'"
	for _, f := range []string{"decide.lua", "admin.lua"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		src := strings.ToUpper(string(b))
		if f == "decide.lua" {
			require.Equal(t, 1, strings.Count(src, guarded), "decide.lua sends PXAT under the version's guard once")
			src = strings.ReplaceAll(src, guarded, "")
		}
		for _, w := range []string{"PXAT", "EXAT", "GETEX", "GETDEL", "COPY", "LMOVE", "LMPOP", "EXPIRETIME", "PEXPIRETIME", "SINTERCARD"} {
			if strings.Contains(src, "'"+w+"'") {
				t.Errorf("%s sends %s, which Redis 6.0 lacks", f, w)
			}
		}
	}
}
