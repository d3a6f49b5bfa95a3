package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// slowMachine is the Timeout of a store whose test checks what Redis
// answers, not when a call ends: no loaded machine takes it, and a call
// that must fail still fails at once or by its own bound (a reply lost
// behind a dropProxy ends its call as the connection closes).
const slowMachine = 10 * time.Second

// realStores builds n stores as n processes would: one client each, one
// prefix between them, time from the server's TIME. A Timeout of 0 is
// slowMachine, not DefaultTimeout: the tests that leave it unset check
// answers, not deadlines, and 250 ms can run out on a loaded machine (a
// call that reads a cluster prefix's state and then decides does so under
// one Timeout), when the failure rule would answer.
func realStores(t *testing.T, addr string, n int, cfg redisstore.Config) []*redisstore.Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = prefix(t)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = slowMachine
	}
	stores := make([]*redisstore.Store, n)
	for i := range stores {
		c := cfg
		c.Client = anyClient(t, addr)
		s, err := redisstore.New(context.Background(), c)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.NoError(t, redisstore.Up(s), "the store never reached the server")
		stores[i] = s
	}
	t.Cleanup(func() { cleanPrefix(anyClient(t, addr), cfg.Prefix) })
	return stores
}

// TestTwoStoresOneQuota is admissiontest's Concurrent20CallersOneInstant
// example across processes: 20 callers split over two stores, capacity 10, a
// rate too slow to refill meanwhile (a token an hour): exactly 10 admitted.
func TestTwoStoresOneQuota(t *testing.T) { twoStoresOneQuota(t, redisAddr(t), 5) }

// twoStoresOneQuota is TestTwoStoresOneQuota on the server (or cluster) at
// addr, for rounds rounds.
func twoStoresOneQuota(t *testing.T, addr string, rounds int) {
	for round := range rounds {
		stores := realStores(t, addr, 2, redisstore.Config{
			Policy:  policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(1)},
			Timeout: 10 * time.Second,
		})
		var allowed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 20 {
			wg.Go(func() {
				<-start
				d, err := stores[i%2].Allow(context.Background(), "shared", 1)
				assert.NoError(t, err)
				if d.Allowed {
					allowed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		// a refill during the round would admit an 11th: at a token a
		// second, a round on a loaded machine (20 goroutines dialing two
		// pools, under -race) that outlasts a second admitted one
		require.Equal(t, int64(10), allowed.Load(), "round %d", round)
		for _, s := range stores {
			require.Zero(t, s.Stats().Failures)
		}
	}
}

// soakDuration is how long TestSharedLoadCreditBound runs: 10 s unless
// TOKENSHARD_SOAK says otherwise (a Go duration): this package's race run
// is CI's longest step, and a longer soak is one variable away.
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("TOKENSHARD_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "TOKENSHARD_SOAK")
		return d
	}
	return 10 * time.Second
}

// TestSharedLoadCreditBound runs a mixed load (Allow, AllowBatch, EvictFull)
// from two stores on one Redis and checks, for every key, that the tokens
// admitted never exceed the credit bound: the capacity plus the rate times
// the time elapsed. Time is the server's TIME, which the scripts decide
// at, read before the first call and after the last.
func TestSharedLoadCreditBound(t *testing.T) {
	const (
		keys     = 8
		capacity = 40
		rate     = 200 // tokens per second per key
		workers  = 4   // per store
	)
	stores := realStores(t, redisAddr(t), 2, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate},
		Timeout: 10 * time.Second,
	})
	var admitted [keys]atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), soakDuration(t))
	defer cancel()
	// The bound is in the clock the scripts decide at, the server's TIME: a
	// wall clock, which a time daemon may slew or step while the test's
	// monotonic clock does not follow.
	rdb := anyClient(t, redisAddr(t))
	begin, err := rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range 2 * workers {
		s := stores[w%2]
		r := rand.New(rand.NewPCG(uint64(w), 99))
		wg.Go(func() {
			reqs := make([]engine.Request, 16)
			out := make([]engine.Result, 16)
			for ctx.Err() == nil {
				switch n := r.IntN(20); {
				case n == 0 && w == 0:
					_, err := s.EvictFull(context.Background())
					assert.NoError(t, err)
				case n < 10:
					k, cost := r.IntN(keys), 1+r.Int64N(3)
					d, err := s.Allow(context.Background(), fmt.Sprint("key", k), cost)
					if assert.NoError(t, err) && d.Allowed {
						admitted[k].Add(cost)
					}
				default:
					for i := range reqs {
						reqs[i] = engine.Request{Key: fmt.Sprint("key", r.IntN(keys)), Cost: 1 + r.Int64N(3)}
					}
					assert.NoError(t, s.AllowBatch(context.Background(), reqs, out))
					for i, res := range out {
						if assert.NoError(t, res.Err) && res.Decision.Allowed {
							var k int
							_, _ = fmt.Sscanf(reqs[i].Key, "key%d", &k)
							admitted[k].Add(reqs[i].Cost)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	end, err := rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	elapsed := end.Sub(begin)
	bound := capacity + int64(rate*elapsed.Seconds()+1)
	total := int64(0)
	for k := range admitted {
		got := admitted[k].Load()
		total += got
		require.LessOrEqual(t, got, bound, "key%d admitted %d tokens in %v, over the credit bound %d", k, got, elapsed, bound)
	}
	t.Logf("%v: %d tokens admitted over %d keys, bound %d per key; decisions %d + %d",
		elapsed.Round(time.Millisecond), total, keys, bound, stores[0].Stats().Decisions, stores[1].Stats().Decisions)
	for _, s := range stores {
		require.Zero(t, s.Stats().Failures)
	}
}

// TestRedisKilledMidRun kills the store's Redis under load: every call
// returns within its deadline with the configured answer, and once Redis is
// back (empty: no persistence) the store reinstalls its policy and decides
// again, without a new Store.
func TestRedisKilledMidRun(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%t", failOpen), func(t *testing.T) {
			srv := redistest.Start(t)
			const deadline = 200 * time.Millisecond
			var failures atomic.Int64
			stores := realStores(t, srv.Addr(), 1, redisstore.Config{
				Policy:         policy.Policy{Version: 3, Capacity: 1000, TokensPerSecond: 1},
				FailOpen:       failOpen,
				FailRetryAfter: 7 * time.Second,
				Timeout:        deadline,
				OnError:        func(error) { failures.Add(1) },
			})
			s := stores[0]
			ctx := context.Background()
			// Up before the first call, which must be Redis's answer within
			// the deadline: New's own attempt to read the prefix's state may
			// have run out of it on a loaded machine.
			require.NoError(t, redisstore.Up(s))

			call := func() engine.Decision {
				t.Helper()
				begin := time.Now()
				d, err := s.Allow(ctx, "k", 1)
				took := time.Since(begin)
				require.NoError(t, err)
				// the deadline, plus slack for a loaded machine under -race
				require.Less(t, took, deadline+300*time.Millisecond, "a call outlived its deadline")
				return d
			}
			d := call()
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 999, Version: 3, Limit: 1000, ResetAfter: time.Second}, d)

			srv.Kill()
			for range 5 {
				d := call()
				want := engine.Decision{Allowed: failOpen, Version: 3, Limit: 1000, Degraded: true}
				if !failOpen {
					want.RetryAfter = 7 * time.Second
				}
				require.Equal(t, want, d)
			}
			out := make([]engine.Result, 3)
			require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "", Cost: 1}, {Key: "b", Cost: 1}}, out))
			require.Equal(t, failOpen, out[0].Decision.Allowed)
			require.True(t, out[0].Decision.Degraded)
			require.ErrorIs(t, out[1].Err, engine.ErrInvalidKey, "a request that never needs Redis keeps its own error")
			require.Equal(t, failOpen, out[2].Decision.Allowed)
			require.True(t, out[2].Decision.Degraded)
			require.GreaterOrEqual(t, s.Stats().Failures, uint64(7))
			require.Positive(t, failures.Load())
			_, err := s.EvictFull(ctx)
			require.ErrorIs(t, err, redisstore.ErrUnavailable)
			require.ErrorIs(t, s.ReplacePolicy(ctx, policy.Policy{Version: 4, Capacity: 1, TokensPerSecond: 1}, 3), redisstore.ErrUnavailable)

			srv.Restart(t)
			// the pool may hold dead connections: go-redis drops each on its
			// first error, so allow a few failed calls before service resumes
			var back engine.Decision
			for i := 0; ; i++ {
				require.Less(t, i, 50, "service did not resume after Redis came back")
				before := s.Stats().Failures
				back = call()
				if s.Stats().Failures == before {
					break
				}
			}
			// Redis came back empty: the bucket starts full again, under the
			// policy the store reinstalled
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 999, Version: 3, Limit: 1000, ResetAfter: time.Second}, back)
			require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 4, Capacity: 5, TokensPerSecond: 1}, 3))
			d = call()
			require.Equal(t, int64(4), d.Version)
		})
	}
}
