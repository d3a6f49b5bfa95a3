package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// rawBuckets reads the bytes and the expiry (PTTL, ms; -2 for no key) of
// each key's bucket, straight from Redis.
func rawBuckets(t *testing.T, c *redis.Client, pfx string, keys ...string) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		v, err := c.Get(context.Background(), redisstore.BucketKey(pfx, k)).Result()
		if errors.Is(err, redis.Nil) {
			v = "(none)"
		} else {
			require.NoError(t, err)
		}
		pttl, err := c.PTTL(context.Background(), redisstore.BucketKey(pfx, k)).Result()
		require.NoError(t, err)
		out[i] = fmt.Sprintf("%s=%q ttl>0:%t", k, v, pttl > 0)
	}
	return out
}

// failPipelines fails every call of the decide script (and the pipeline
// it is in) while failing is set, as a connection reset would, before
// Redis sees it.
func failPipelines(failing *atomic.Bool) hook {
	return decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if failing.Load() {
			err := errors.New("injected: connection reset")
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	})
}

// TestAllowAllRefusalWritesNothing: on the server's TIME, with expiries, a
// denied call and a call with a sum above capacity leave every bucket's
// bytes and expiry as they were and create none; an admitted call writes
// every key, each with an expiry.
func TestAllowAllRefusalWritesNothing(t *testing.T) {
	c := client(t, redisAddr(t))
	pfx := prefix(t)
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerDay(1)} // no refill to speak of meanwhile
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p}, nil)
	ctx := context.Background()
	_, err := s.Allow(ctx, "a", 8)
	require.NoError(t, err)
	before := rawBuckets(t, c, pfx, "a", "b", "c")
	t.Logf("before: %v", before)

	d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "b", Cost: 4}, {Key: "a", Cost: 3}, {Key: "c", Cost: 10}})
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 1, at, "a is short")
	require.Equal(t, int64(2), d.Remaining)
	require.Equal(t, before, rawBuckets(t, c, pfx, "a", "b", "c"), "a denial writes nothing")

	_, at, err = s.AllowAll(ctx, []engine.Request{{Key: "b", Cost: 4}, {Key: "c", Cost: 6}, {Key: "c", Cost: 5}})
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	require.Equal(t, 1, at)
	require.Equal(t, before, rawBuckets(t, c, pfx, "a", "b", "c"), "a sum above capacity writes nothing")
	require.Equal(t, uint64(1+3+3), s.Stats().Decisions, "each request Redis decided counts")

	d, at, err = s.AllowAll(ctx, []engine.Request{{Key: "b", Cost: 4}, {Key: "a", Cost: 2}, {Key: "c", Cost: 10}})
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, 1, at, "a and c keep 0: a is first")
	after := rawBuckets(t, c, pfx, "a", "b", "c")
	t.Logf("after: %v", after)
	for i, k := range []string{"a", "b", "c"} {
		require.NotEqual(t, before[i], after[i], "%s was written", k)
		require.Contains(t, after[i], "ttl>0:true", "%s expires when full", k)
	}
}

// TestAllowAllSumPastMaxInt64: costs of one key that add up past
// math.MaxInt64, on a key of capacity math.MaxInt64, are
// ErrCostExceedsCapacity at the key's first request, also when Redis
// cannot answer; up to it they are summed exactly.
func TestAllowAllSumPastMaxInt64(t *testing.T) {
	c := client(t, redisAddr(t))
	var failing atomic.Bool
	c.AddHook(failPipelines(&failing))
	p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Policy: p}, clock.NewManual(0))
	ctx := context.Background()
	past := []engine.Request{{Key: "j", Cost: 1}, {Key: "k", Cost: math.MaxInt64}, {Key: "j", Cost: 1}, {Key: "k", Cost: 1}}
	d, at, err := s.AllowAll(ctx, past)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	require.Equal(t, 1, at)
	require.Zero(t, d)
	exact := []engine.Request{{Key: "k", Cost: math.MaxInt64 - 1}, {Key: "k", Cost: 1}}
	want, _, err := enginemodel.New(p, 0, 0).AllowAll(0, exact)
	require.NoError(t, err)
	d, at, err = s.AllowAll(ctx, exact)
	require.NoError(t, err)
	require.Equal(t, want, d, "every token taken")
	require.True(t, d.Allowed)
	require.Zero(t, d.Remaining)
	require.Zero(t, at)
	failing.Store(true)
	_, at, err = s.AllowAll(ctx, past)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "Redis down")
	require.Equal(t, 1, at)
}

// TestAllowAllFailureRule: when the script call fails, the call is
// answered as a whole by the failure rule, with a nil error: fail closed
// denies with FailRetryAfter, fail open admits, both as reqs[0]'s key
// under the policy last seen, at index 0. Each request counts as a
// failure, OnError sees the error, and a sum above a capacity is still that
// error. Once Redis answers again, nothing was taken from any key.
func TestAllowAllFailureRule(t *testing.T) {
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 50, TokensPerSecond: 5, Name: "gold"})
	require.NoError(t, err)
	p := policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 1, Overrides: ov}
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%t", failOpen), func(t *testing.T) {
			c := client(t, redisAddr(t))
			var failing atomic.Bool
			c.AddHook(failPipelines(&failing))
			var seen atomic.Int32
			s := newStore(t, redisstore.Config{
				Client: c, Policy: p, FailOpen: failOpen, FailRetryAfter: 3 * time.Second,
				OnError: func(error) { seen.Add(1) },
			}, clock.NewManual(0))
			ctx := context.Background()
			_, err := s.Allow(ctx, "x", 4)
			require.NoError(t, err)
			failing.Store(true)
			reqs := []engine.Request{{Key: "vip", Cost: 2}, {Key: "x", Cost: 1}, {Key: "y", Cost: 3}}
			d, at, err := s.AllowAll(ctx, reqs)
			require.NoError(t, err)
			want := engine.Decision{Allowed: failOpen, Version: 3, Limit: 50, Band: "gold", Degraded: true}
			if !failOpen {
				want.RetryAfter = 3 * time.Second
			}
			require.Equal(t, want, d)
			require.Zero(t, at)
			require.Equal(t, uint64(3), s.Stats().Failures)
			require.Equal(t, int32(1), seen.Load())

			_, at, err = s.AllowAll(ctx, []engine.Request{{Key: "vip", Cost: 2}, {Key: "x", Cost: 6}, {Key: "x", Cost: 5}})
			require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "known without Redis")
			require.Equal(t, 1, at)
			require.Equal(t, uint64(3), s.Stats().Failures, "an error is not a failure answer")

			failing.Store(false)
			for _, k := range []struct {
				key  string
				cost int64
				want engine.Decision
			}{
				{"x", 6, engine.Decision{Allowed: true, Version: 3, Limit: 10, ResetAfter: 10 * time.Second}},
				{"vip", 50, engine.Decision{Allowed: true, Version: 3, Limit: 50, ResetAfter: 10 * time.Second, Band: "gold"}},
				{"y", 10, engine.Decision{Allowed: true, Version: 3, Limit: 10, ResetAfter: 10 * time.Second}},
			} {
				d, err := s.Allow(ctx, k.key, k.cost)
				require.NoError(t, err)
				require.Equal(t, k.want, d, "%s: nothing was taken while Redis was down", k.key)
			}
		})
	}
}

// TestAllowAllOutOfMemory: a Redis at its maxmemory refuses an admission's
// writes, all of them: ErrKeyCapacity at index 0, no bucket changed. A
// denial writes nothing, so Redis decides it still.
func TestAllowAllOutOfMemory(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	pfx := prefix(t)
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p, FailOpen: true}, clock.NewManual(0))
	_, err := s.Allow(ctx, "before", 2)
	require.NoError(t, err)
	raw := rawBuckets(t, c, pfx, "before", "after")
	outOfMemory(t, c)

	d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "before", Cost: 1}, {Key: "after", Cost: 1}})
	require.ErrorIs(t, err, engine.ErrKeyCapacity)
	require.Zero(t, at)
	require.Zero(t, d)
	require.Zero(t, s.Stats().Failures)
	require.Equal(t, uint64(1), s.Stats().Decisions, "Redis decided nothing")
	require.Equal(t, raw, rawBuckets(t, c, pfx, "before", "after"), "nothing written")

	d, at, err = s.AllowAll(ctx, []engine.Request{{Key: "after", Cost: 1}, {Key: "before", Cost: 2}})
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Version: 1, Remaining: 1, RetryAfter: time.Second, Limit: 3, ResetAfter: 2 * time.Second}, d)
	require.Equal(t, 1, at)

	_, at, err = s.AllowAll(ctx, []engine.Request{{Key: "after", Cost: 2}, {Key: "after", Cost: 2}})
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "before the key bound")
	require.Zero(t, at)
}

// TestAllowAllChain: a bucket behind a version with overrides makes the
// script stop for the key's chain before anything is written; the call is
// sent again with it and decided once: the key decided before it pays
// once, not twice. If fetching the chain fails, the call is answered by
// the failure rule and nothing is taken from any key.
func TestAllowAllChain(t *testing.T) {
	for _, fetchFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("fetchFails=%t", fetchFails), func(t *testing.T) {
			clk := clock.NewManual(0)
			c := client(t, redisAddr(t))
			var failing atomic.Bool
			var lranges atomic.Int32
			c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				if cmd.Name() == "lrange" {
					lranges.Add(1)
				}
				if failing.Load() && cmd.Name() == "lrange" {
					err := errors.New("injected: connection reset")
					cmd.SetErr(err)
					return err
				}
				return next(ctx, cmd)
			}})
			pfx := prefix(t)
			s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
			ctx := context.Background()
			_, err := s.Allow(ctx, "old", 4) // 6 left under version 1
			require.NoError(t, err)
			ov, err := policy.NewOverrideSet(policy.Override{Match: "old", Capacity: 8, TokensPerSecond: 1})
			require.NoError(t, err)
			require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
			p3 := policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1}
			require.NoError(t, s.ReplacePolicy(ctx, p3, 2))
			before := rawBuckets(t, c, pfx, "fresh", "old")

			failing.Store(fetchFails)
			lranges.Store(0)
			d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "fresh", Cost: 3}, {Key: "old", Cost: 1}})
			failing.Store(false)
			require.NoError(t, err)
			require.Equal(t, int32(1), lranges.Load(), "the script stopped for old's chain")
			if fetchFails {
				require.Equal(t, engine.Decision{Version: 3, Limit: 5, RetryAfter: redisstore.DefaultFailRetryAfter, Degraded: true}, d, "fail closed")
				require.Zero(t, at)
				require.Equal(t, before, rawBuckets(t, c, pfx, "fresh", "old"), "nothing taken")
				return
			}
			// old: 6 under v1, clamped to 6 under v2's override (8), to 5
			// under v3; pays 1, 4 left. fresh: 5, pays 3, 2 left, and binds.
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 3, Limit: 5, ResetAfter: 3 * time.Second}, d)
			require.Zero(t, at)
			for _, k := range []struct {
				key  string
				cost int64
			}{{"fresh", 2}, {"old", 4}} {
				d, err := s.Allow(ctx, k.key, k.cost)
				require.NoError(t, err)
				require.Equal(t, engine.Decision{Allowed: true, Version: 3, Limit: 5, ResetAfter: 5 * time.Second}, d, "%s paid once", k.key)
			}
		})
	}
}

// TestAllowAllTwoStoresConcurrent: 40 callers over two stores on the
// server's TIME, each asking for a token of "s" (capacity 10, one a day)
// and one of its own key, in either order: exactly 10 admitted, and each
// own key paid for its admitted callers only, so no call took part of its
// tokens.
func TestAllowAllTwoStoresConcurrent(t *testing.T) {
	const callers, own = 40, 4
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerDay(1)}
	stores := realStores(t, redisAddr(t), 2, redisstore.Config{Policy: p, Timeout: 10 * time.Second})
	var wg sync.WaitGroup
	var admitted atomic.Int32
	var paid [own]atomic.Int64
	errs := make(chan error, callers)
	start := make(chan struct{})
	for g := range callers {
		reqs := []engine.Request{{Key: "s", Cost: 1}, {Key: fmt.Sprint("p", g%own), Cost: 1}}
		if g%2 == 1 {
			reqs[0], reqs[1] = reqs[1], reqs[0]
		}
		wg.Go(func() {
			<-start
			d, at, err := stores[g%2].AllowAll(context.Background(), reqs)
			switch {
			case err != nil:
				errs <- err
			case d.Allowed:
				admitted.Add(1)
				paid[g%own].Add(1)
			case at != g%2:
				errs <- fmt.Errorf("caller %d: denied at %d, not at s's request", g, at)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(10), admitted.Load())
	require.Zero(t, stores[0].Stats().Failures+stores[1].Stats().Failures)
	for k := range own {
		key := fmt.Sprint("p", k)
		d, err := stores[k%2].Allow(context.Background(), key, 10-paid[k].Load())
		require.NoError(t, err)
		require.True(t, d.Allowed, "%s paid for its %d admitted callers only: %+v", key, paid[k].Load(), d)
		require.Zero(t, d.Remaining, "%s paid for its %d admitted callers, no fewer", key, paid[k].Load())
	}
	d, err := stores[0].Allow(context.Background(), "s", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed, "s is empty: %+v", d)
}

// TestAllowAllErrorAtKeysFirstRequest: a key's summed cost above its
// capacity is reported at the key's first request, not at the key's place
// among the distinct keys, whether Redis answers or not; and a call the
// failure rule answers counts each of its requests, a key's repeats too.
func TestAllowAllErrorAtKeysFirstRequest(t *testing.T) {
	c := client(t, redisAddr(t))
	var failing atomic.Bool
	c.AddHook(failPipelines(&failing))
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Policy: p}, clock.NewManual(0))
	ctx := context.Background()
	over := []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 1}, {Key: "b", Cost: 6}, {Key: "b", Cost: 5}}
	for _, down := range []bool{false, true} {
		failing.Store(down)
		_, at, err := s.AllowAll(ctx, over)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "Redis down: %t", down)
		require.Equal(t, 2, at, "b's first request; Redis down: %t", down)
	}
	d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
	require.NoError(t, err)
	require.True(t, d.Degraded)
	require.Zero(t, at)
	require.Equal(t, uint64(3), s.Stats().Failures, "one failure per request")
}

// TestAllowAllCanceledMidCall: a call whose context is canceled while
// Redis decides it returns the context's error at index -1, not the
// failure rule's answer.
func TestAllowAllCanceledMidCall(t *testing.T) {
	c := client(t, redisAddr(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var armed atomic.Bool
	c.AddHook(decideHook(func(hctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if !armed.Load() {
			return next(hctx, cmds)
		}
		cancel()
		for _, cmd := range cmds {
			cmd.SetErr(context.Canceled)
		}
		return context.Canceled
	}))
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clock.NewManual(0))
	_, err := s.Allow(context.Background(), "a", 1) // the store has read the prefix's state
	require.NoError(t, err)
	armed.Store(true)
	d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, -1, at)
	require.Zero(t, d)
	require.Zero(t, s.Stats().Failures)
}
