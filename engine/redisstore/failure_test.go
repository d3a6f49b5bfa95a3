package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestFailureCostAboveCapacity: a cost above the key's capacity can never be
// admitted (ErrCostExceedsCapacity, which matches ErrInvalidCost, never a
// finite retry). The store knows the capacity without Redis, so an outage
// does not change that answer into a fail-open admission or a fail-closed
// RetryAfter.
func TestFailureCostAboveCapacity(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	for _, failOpen := range []bool{true, false} {
		srv := startPrivate(t)
		s := realStores(t, srv.Addr(), 1, redisstore.Config{
			Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, FailOpen: failOpen, Timeout: 200 * time.Millisecond,
		})[0]
		_, err := s.Allow(context.Background(), "k", 11)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
		srv.Kill()
		d, err := s.Allow(context.Background(), "k", 11)
		t.Logf("failOpen=%t, Redis down, cost 11 > capacity 10: %+v, %v", failOpen, d, err)
		require.ErrorIs(t, err, engine.ErrCostExceedsCapacity)
	}
}

// TestHungRedis: a Redis that stops answering (SIGSTOP) rather than
// refusing connections: every call returns by its deadline. The server
// stays stopped until the test ends; a call that waited past its deadline
// would wait for go-redis's ReadTimeout (3 s).
func TestHungRedis(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	const timeout = 400 * time.Millisecond
	s := realStores(t, srv.Addr(), 1, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: timeout})[0]
	ctx := context.Background()
	_, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	srv.Hang(t)
	for _, call := range []struct {
		name string
		f    func() error
	}{
		{"Allow", func() error { _, err := s.Allow(ctx, "k", 1); return err }},
		{"EvictFull", func() error { _, err := s.EvictFull(ctx); return err }},
		{"ReplacePolicy", func() error {
			return s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 30, TokensPerSecond: 1}, 1)
		}},
		{"ReplacePolicy with a 100ms deadline", func() error {
			dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			return s.ReplacePolicy(dctx, policy.Policy{Version: 2, Capacity: 30, TokensPerSecond: 1}, 1)
		}},
	} {
		begin := time.Now()
		err := call.f()
		took := time.Since(begin)
		// Allow answers fail-closed; the others report the outage. Each
		// returns by two deadlines (ReplacePolicy's lock, then the release
		// it attempts on its way out), plus slack for a loaded machine.
		if call.name == "Allow" {
			require.NoError(t, err)
		} else {
			require.Error(t, err, call.name)
		}
		require.Less(t, took, 2*timeout+600*time.Millisecond, "%s took %v (%v)", call.name, took, err)
	}
}

// TestChainFetchFailureKeepsLaterDecisions: chunk 0 stops for a chain, chunk
// 1 (same pipeline) is decided by Redis; fetching the chain fails. Chunk 1's
// requests get the decisions Redis made, not the fail-closed rule: Redis has
// taken their tokens.
func TestChainFetchFailureKeepsLaterDecisions(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	var failing atomic.Bool // LRANGE (the chain fetch) fails while set
	c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if failing.Load() && cmd.Name() == "lrange" {
			err := errors.New("injected: connection reset")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}})
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: c, Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	_, err := s.Allow(ctx, "old", 10)
	require.NoError(t, err)
	ov, err := policy.NewOverrideSet(policy.Override{Match: "vip", Capacity: 5, TokensPerSecond: 1})
	require.NoError(t, err)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 10, TokensPerSecond: 1, Overrides: ov}, 1))
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 5, TokensPerSecond: 1}, 2))

	reqs := make([]engine.Request, redisstore.ChunkSize+1)
	reqs[0] = engine.Request{Key: "old", Cost: 1}
	for i := 1; i < redisstore.ChunkSize; i++ {
		reqs[i] = engine.Request{Key: fmt.Sprint("filler", i), Cost: 1}
	}
	reqs[redisstore.ChunkSize] = engine.Request{Key: "y", Cost: 3}
	out := make([]engine.Result, len(reqs))
	failing.Store(true)
	require.NoError(t, s.AllowBatch(ctx, reqs, out))
	failing.Store(false)
	y := redisstore.DecimalBucket(c.Get(ctx, redisstore.BucketKey(p, "y")).Val())
	t.Logf("y answered %+v; y in Redis %q; old %+v; stats %+v", out[redisstore.ChunkSize], y, out[0], s.Stats())
	require.Equal(t, "2000000000 0 3 5 1", y, "Redis decided y: 3 of 5 taken")
	require.Equal(t, engine.Result{Decision: engine.Decision{Allowed: true, Remaining: 2, Version: 3, Limit: 5, ResetAfter: 3e9}}, out[redisstore.ChunkSize],
		"y must get the decision Redis made, not the fail-closed rule")
	require.Equal(t, engine.Result{Decision: engine.Decision{RetryAfter: redisstore.DefaultFailRetryAfter, Version: 3, Limit: 5, Degraded: true}}, out[0],
		"old, in the chunk whose chain could not be fetched, is the fail-closed rule's, marked Degraded")
}

// TestOutageDegraded: while the server is down, every decision (Allow,
// concurrent Allows sharing calls, each result of AllowBatch, AllowAll) is
// the failure rule's, marked Degraded and counted as admitted or denied;
// decisions by Redis before and after are not marked.
func TestOutageDegraded(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%t", failOpen), func(t *testing.T) {
			srv := startPrivate(t)
			ctx := context.Background()
			clk := clock.NewManual(0)
			s := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), FailOpen: failOpen, FailRetryAfter: 1500 * time.Millisecond,
				Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}, Timeout: 2 * time.Second}, clk)
			d, err := s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 4, Version: 1, Limit: 5, ResetAfter: time.Second}, d)

			srv.Kill()
			want := engine.Decision{Allowed: failOpen, Version: 1, Limit: 5, Degraded: true}
			if !failOpen {
				want.RetryAfter = 1500 * time.Millisecond
			}
			d, err = s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, want, d)
			var wg sync.WaitGroup
			ds := make([]engine.Decision, 8)
			errs := make([]error, len(ds))
			for i := range ds {
				wg.Go(func() { ds[i], errs[i] = s.Allow(ctx, fmt.Sprint("c", i%2), 1) })
			}
			wg.Wait()
			for i := range ds {
				require.NoError(t, errs[i])
				require.Equal(t, want, ds[i])
			}
			out := make([]engine.Result, 3)
			require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 2}, {Key: "k", Cost: 1}}, out))
			for _, r := range out {
				require.Equal(t, engine.Result{Decision: want}, r)
			}
			d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}})
			require.NoError(t, err)
			require.Equal(t, want, d)
			require.Zero(t, at)
			st := s.Stats()
			require.Equal(t, uint64(1), st.Decisions)
			require.Equal(t, uint64(1+8+3+2), st.Failures)
			if failOpen {
				require.Equal(t, st.Failures, st.DegradedAllowed)
				require.Zero(t, st.DegradedDenied)
			} else {
				require.Equal(t, st.Failures, st.DegradedDenied)
				require.Zero(t, st.DegradedAllowed)
			}

			srv.Restart(t) // empty: the store reinstalls its policy
			d = untilDecided(t, s, "k", want)
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 4, Version: 1, Limit: 5, ResetAfter: time.Second}, d)
		})
	}
}
