package redisstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// downServer starts a private redis-server and kills it, so that its port
// has nothing listening until the test restarts it.
func downServer(t *testing.T) *redistest.Server {
	t.Helper()
	srv := startPrivate(t)
	srv.Kill()
	return srv
}

// quickClient is a client that dials once per attempt (go-redis dials five
// times by default, 100ms apart), so that calls while the server is down
// return quickly.
func quickClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// errorLog collects what a store passes to OnError.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// untilDecided calls Allow(key, 1) until Redis decides it (Degraded false)
// and returns that decision; every earlier answer must be the failure
// rule's. It fails the test if Redis has not decided by the deadline (go-redis
// holds off dialing for a second after repeated refusals).
func untilDecided(t *testing.T, s *redisstore.Store, key string, degraded engine.Decision) engine.Decision {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, err := s.Allow(context.Background(), key, 1)
		require.NoError(t, err)
		if !d.Degraded {
			return d
		}
		require.Equal(t, degraded, d)
		require.True(t, time.Now().Before(deadline), "Redis has been back for 15s and the store still answers by the failure rule")
		time.Sleep(5 * time.Millisecond) // polling a real server
	}
}

// failRule is the failure rule's answer under a policy of capacity 3,
// version 1.
func failRule(failOpen bool) engine.Decision {
	d := engine.Decision{Allowed: failOpen, Version: 1, Limit: 3, Degraded: true}
	if !failOpen {
		d.RetryAfter = redisstore.DefaultFailRetryAfter
	}
	return d
}

// TestStartWithoutRedis: New with no server listening returns a store (and
// tells OnError why) that answers every decision by the failure rule,
// marked Degraded and counted apart, and every other call with
// ErrUnavailable; once a server listens on the port, the store installs
// its policy and key map by itself and decides by Redis, with the exact
// bucket arithmetic, and a store opened later shares its state.
func TestStartWithoutRedis(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("failOpen=%t", failOpen), func(t *testing.T) {
			srv := downServer(t)
			ctx := context.Background()
			clk := clock.NewManual(0)
			p := prefix(t)
			pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
			var log errorLog
			s, err := redisstore.New(ctx, redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: p, Policy: pol,
				FailOpen: failOpen, Timeout: 2 * time.Second, Clock: clk, OnError: log.add})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			require.NotEmpty(t, log.all(), "New tells OnError why Redis could not be reached")
			require.ErrorIs(t, log.all()[0], redisstore.ErrUnavailable)
			require.Equal(t, pol, s.Policy())

			want := failRule(failOpen)
			d, err := s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, want, d)
			out := make([]engine.Result, 2)
			require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 2}}, out))
			for _, r := range out {
				require.NoError(t, r.Err)
				require.Equal(t, want, r.Decision)
			}
			d, at, err := s.AllowAll(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}})
			require.NoError(t, err)
			require.Equal(t, want, d)
			require.Zero(t, at)
			_, err = s.Allow(ctx, "k", 4)
			require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "known without Redis")

			// ErrNotReady, which wraps ErrUnavailable
			_, err = s.Peek(ctx, "k")
			require.ErrorIs(t, err, redisstore.ErrNotReady)
			require.ErrorIs(t, err, redisstore.ErrUnavailable)
			require.ErrorIs(t, err, syscall.ECONNREFUSED, "the attempt's error, kept")
			require.Equal(t, 1, strings.Count(err.Error(), redisstore.ErrUnavailable.Error()), "said once: %v", err)
			_, err = s.Refund(ctx, "k", 1)
			require.ErrorIs(t, err, redisstore.ErrNotReady)
			_, err = s.KeyCount(ctx)
			require.ErrorIs(t, err, redisstore.ErrNotReady)
			_, err = s.EvictFull(ctx)
			require.ErrorIs(t, err, redisstore.ErrNotReady)
			require.ErrorIs(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 5, TokensPerSecond: 1}, 1), redisstore.ErrNotReady)

			st := s.Stats()
			require.Zero(t, st.Decisions)
			require.Equal(t, uint64(5), st.Failures)
			// Peek and Refund are errors (Other); the AllowAll is one call,
			// answered as its Decision says.
			errs := engine.Errors{InvalidCost: 1, Other: 2}
			if failOpen {
				require.Equal(t, redisstore.Stats{Failures: 5, DegradedAllowed: 5, Errors: errs, AllowAll: engine.AllowAllStats{Admitted: 1}}, st)
			} else {
				require.Equal(t, redisstore.Stats{Failures: 5, DegradedDenied: 5, Errors: errs, AllowAll: engine.AllowAllStats{Refused: 1}}, st)
			}

			srv.Restart(t)
			d = untilDecided(t, s, "k", want)
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 2, Version: 1, Limit: 3, ResetAfter: time.Second}, d)
			d, err = s.Allow(ctx, "k", 2)
			require.NoError(t, err)
			require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 3, ResetAfter: 3 * time.Second}, d)
			d, err = s.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, engine.Decision{RetryAfter: time.Second, Version: 1, Limit: 3, ResetAfter: 3 * time.Second}, d)
			clk.Advance(time.Second)
			d, err = s.Peek(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, engine.Decision{Allowed: true, Remaining: 1, Version: 1, Limit: 3, ResetAfter: 2 * time.Second}, d)
			require.Equal(t, uint64(3), s.Stats().Decisions)

			// The store installed its policy and key map: a store opened
			// now with another policy adopts them and shares the bucket.
			later := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Prefix: p,
				Policy: policy.Policy{Version: 9, Capacity: 100, TokensPerSecond: 100}}, clk)
			require.Equal(t, pol, later.Policy())
			d, err = later.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.Equal(t, engine.Decision{Allowed: true, Version: 1, Limit: 3, ResetAfter: 3 * time.Second}, d)
		})
	}
}

// TestStartWithoutRedisAdopts: a store started without Redis that finds,
// once Redis answers, a prefix another store set up meanwhile adopts its
// policy and key map before it decides anything: its first decision by
// Redis is under that policy, on the bucket the other store spent from.
func TestStartWithoutRedisAdopts(t *testing.T) {
	srv := downServer(t)
	ctx := context.Background()
	clk := clock.NewManual(0)
	p := prefix(t)
	s, err := redisstore.New(ctx, redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: p,
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: 2 * time.Second, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, failRule(false), d)

	srv.Restart(t)
	first := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Prefix: p,
		Policy: policy.Policy{Version: 5, Capacity: 10, TokensPerSecond: 2}, VirtualShards: 7}, clk)
	d, err = first.Allow(ctx, "k", 4)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	d = untilDecided(t, s, "k", failRule(false))
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 5, Version: 5, Limit: 10, ResetAfter: 2500 * time.Millisecond}, d)
	require.Equal(t, int64(5), s.Policy().Version)
	d, err = first.Allow(ctx, "k", 5)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Allowed: true, Version: 5, Limit: 10, ResetAfter: 5 * time.Second}, d, "one bucket")
}

// TestStartWithoutRedisKeyTagsConflict: a store started without Redis that
// finds a prefix set up with the other IgnoreKeyTags setting never decides
// by Redis: it goes on answering by the failure rule and tells OnError
// ErrKeyTags.
func TestStartWithoutRedisKeyTagsConflict(t *testing.T) {
	srv := downServer(t)
	ctx := context.Background()
	clk := clock.NewManual(0)
	p := prefix(t)
	var log errorLog
	s, err := redisstore.New(ctx, redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: p, IgnoreKeyTags: true,
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: 2 * time.Second, Clock: clk, OnError: log.add})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	srv.Restart(t)
	newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clk)
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
		errs := log.all()
		if errors.Is(errs[len(errs)-1], redisstore.ErrKeyTags) {
			break
		}
		require.True(t, time.Now().Before(deadline), "no ErrKeyTags reported: %v", errs)
		time.Sleep(5 * time.Millisecond) // polling a real server
	}
	_, err = s.Peek(ctx, "k")
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.ErrorIs(t, err, redisstore.ErrKeyTags)
}

// TestStartWithoutRedisConcurrent: many callers of every decision method
// across the moment Redis comes back: one of them at a time reads the
// prefix's state, the others are answered by the failure rule meanwhile,
// and every token Redis admitted is spent from the one bucket exactly once.
func TestStartWithoutRedisConcurrent(t *testing.T) {
	srv := downServer(t)
	ctx := context.Background()
	clk := clock.NewManual(0)
	const capacity = 100_000
	s, err := redisstore.New(ctx, redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1}, Timeout: 2 * time.Second, Clock: clk, FailOpen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	var spent, degraded atomic.Int64
	var restarted atomic.Bool
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	met := make(chan struct{}, 6) // each caller's first answer by the failure rule
	for g := range 6 {
		wg.Go(func() {
			metOutage := false
			decidedAfter := 0 // decisions by Redis: stop after a few
			for decidedAfter < 20 && time.Now().Before(deadline) {
				var ds []engine.Decision
				switch g % 3 {
				case 0:
					d, err := s.Allow(ctx, "k", 1)
					if err != nil {
						t.Error(err)
						return
					}
					ds = append(ds, d)
				case 1:
					out := make([]engine.Result, 2)
					if err := s.AllowBatch(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "k", Cost: 1}}, out); err != nil {
						t.Error(err)
						return
					}
					for _, r := range out {
						if r.Err != nil {
							t.Error(r.Err)
							return
						}
						ds = append(ds, r.Decision)
					}
				case 2:
					d, _, err := s.AllowAll(ctx, []engine.Request{{Key: "k", Cost: 1}})
					if err != nil {
						t.Error(err)
						return
					}
					ds = append(ds, d)
				}
				for _, d := range ds {
					switch {
					case d.Degraded:
						degraded.Add(1)
						if !metOutage {
							metOutage = true
							met <- struct{}{}
						}
					case !d.Allowed:
						t.Errorf("denied by Redis with %d tokens: %+v", capacity, d)
						return
					default:
						spent.Add(1)
						if restarted.Load() {
							decidedAfter++
						}
					}
				}
				time.Sleep(time.Millisecond) // pacing the calls while go-redis redials
			}
		})
	}
	for range 6 { // every caller meets the outage before the server is back
		select {
		case <-met:
		case <-time.After(time.Until(deadline)):
			t.Fatal("the callers did not all meet the outage")
		}
	}
	srv.Restart(t)
	restarted.Store(true)
	wg.Wait()
	require.False(t, t.Failed())
	require.Positive(t, degraded.Load())
	d, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, capacity-spent.Load(), d.Remaining, "every token Redis admitted, spent once")
	st := s.Stats()
	require.Equal(t, uint64(spent.Load()), st.Decisions)
	require.Equal(t, uint64(degraded.Load()), st.Failures)
}

// TestStartWhileRedisCannotServe: a server that answers but cannot serve
// the store now is an outage, not a configuration error: busy with a
// script (BUSY), refusing writes for want of replicas
// (min-replicas-to-write: NOREPLICAS), or taking writes no replica
// acknowledges under WaitForReplicas. New returns a store that answers by
// the failure rule, and Redis decides once it can.
func TestStartWhileRedisCannotServe(t *testing.T) {
	// Not parallel: its BUSY case keeps a core in a script loop, which the
	// tight deadlines of the parallel tests would feel.
	pol := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}
	ctx := context.Background()
	t.Run("busy", func(t *testing.T) {
		srv := startPrivate(t)
		admin := client(t, srv.Addr())
		require.NoError(t, admin.ConfigSet(ctx, "lua-time-limit", "50").Err()) // busy-reply-threshold from 7.0, which keeps this name
		looping := client(t, srv.Addr())
		var wg sync.WaitGroup
		t.Cleanup(func() { _ = admin.ScriptKill(context.Background()).Err(); wg.Wait() })
		wg.Go(func() { // a script that loops until SCRIPT KILL ends it
			_ = looping.Eval(context.Background(), "while true do end", nil).Err()
		})
		for !redis.HasErrorPrefix(admin.Ping(ctx).Err(), "BUSY") {
			time.Sleep(5 * time.Millisecond) // polling a real server
		}
		var log errorLog
		s, err := redisstore.New(ctx, redisstore.Config{Client: client(t, srv.Addr()), Prefix: prefix(t), Policy: pol,
			Clock: clock.NewManual(0), OnError: log.add})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.ErrorContains(t, log.all()[0], "BUSY")
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
		require.NoError(t, admin.ScriptKill(ctx).Err())
		d = untilDecided(t, s, "k", failRule(false))
		require.True(t, d.Allowed)
		require.Equal(t, int64(2), d.Remaining)
	})
	t.Run("too few replicas to write", func(t *testing.T) {
		srv := startPrivate(t) // no replica
		admin := client(t, srv.Addr())
		require.NoError(t, admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err())
		if admin.Eval(ctx, "return redis.call('DEL', KEYS[1])", []string{"probe"}).Err() == nil {
			t.Skip("the server's scripts write without the replicas min-replicas-to-write asks (Redis 6.0)")
		}
		var log errorLog
		s, err := redisstore.New(ctx, redisstore.Config{Client: client(t, srv.Addr()), Prefix: prefix(t), Policy: pol,
			Clock: clock.NewManual(0), OnError: log.add})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.ErrorContains(t, log.all()[0], "NOREPLICAS")
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
		require.NoError(t, admin.ConfigSet(ctx, "min-replicas-to-write", "0").Err())
		d = untilDecided(t, s, "k", failRule(false))
		require.True(t, d.Allowed)
		require.Equal(t, int64(2), d.Remaining)
	})
	t.Run("not replicated", func(t *testing.T) {
		srv := startPrivate(t) // no replica
		c := client(t, srv.Addr())
		require.NoError(t, redisstore.WaitForReplicas(c, 1, 20*time.Millisecond))
		var log errorLog
		s, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t), Policy: pol, OnError: log.add})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.ErrorIs(t, log.all()[0], redisstore.ErrNotReplicated)
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.Equal(t, failRule(false), d)
	})
}

// TestStartWaitRefused: a WAIT that an ACL refuses is a reply every later
// attempt gets too, not an outage: New fails with it, rather than start a
// store that would answer by the failure rule for ever.
func TestStartWaitRefused(t *testing.T) {
	srv := startPrivate(t)
	ctx := context.Background()
	admin := client(t, srv.Addr())
	err := admin.Do(ctx, "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait").Err()
	if err != nil && strings.Contains(err.Error(), "'&*'") { // Redis 6.0: no channel rules, every channel allowed
		err = admin.Do(ctx, "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "+@all", "-wait").Err()
	}
	require.NoError(t, err)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nowait", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, redisstore.WaitForReplicas(c, 1, 20*time.Millisecond))
	s, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t), Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}})
	require.ErrorIs(t, err, redisstore.ErrNotReplicated)
	require.ErrorContains(t, err, "NOPERM")
	require.Nil(t, s)
}

// slowRedis is a go-redis hook: while down, every command fails as a
// refused connection does; once up, the commands named in slow each take
// delay longer (or until their context ends), as a server that is slow to
// answer.
type slowRedis struct {
	up    atomic.Bool
	slow  map[string]bool
	delay time.Duration
}

func (h *slowRedis) wait(ctx context.Context, cmds []redis.Cmder) error {
	if !h.up.Load() {
		return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return h.slow[c.Name()] }) {
		return nil
	}
	return redisstore.Sleep(ctx, h.delay)
}

// hook is h as a go-redis hook (see hook_test.go).
func (h *slowRedis) hook() hook {
	fail := func(err error, cmds ...redis.Cmder) error {
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
	return hook{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if err := h.wait(ctx, []redis.Cmder{cmd}); err != nil {
				return fail(err, cmd)
			}
			return next(ctx, cmd)
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			if err := h.wait(ctx, cmds); err != nil {
				return fail(err, cmds...)
			}
			return next(ctx, cmds)
		},
	}
}

// TestStartWithoutRedisOneDeadline: the first call of a store started
// without Redis reads the prefix's state and then makes its own exchange
// under one deadline, Config.Timeout's: with Redis slow to answer both, it
// is answered by the failure rule by then, not after a Timeout each.
func TestStartWithoutRedisOneDeadline(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a fresh prefix of the shared server
	// Half of it is slack for a loaded machine, still under the 1.2 s that
	// two exchanges of 0.6 Timeout take.
	const timeout = time.Second
	calls := map[string]func(s *redisstore.Store) (engine.Decision, error){
		"Allow": func(s *redisstore.Store) (engine.Decision, error) { return s.Allow(context.Background(), "k", 1) },
		"AllowBatch": func(s *redisstore.Store) (engine.Decision, error) {
			out := make([]engine.Result, 1)
			err := s.AllowBatch(context.Background(), []engine.Request{{Key: "k", Cost: 1}}, out)
			return out[0].Decision, cmp.Or(err, out[0].Err)
		},
		"AllowAll": func(s *redisstore.Store) (engine.Decision, error) {
			d, _, err := s.AllowAll(context.Background(), []engine.Request{{Key: "k", Cost: 1}})
			return d, err
		},
		"Peek": func(s *redisstore.Store) (engine.Decision, error) { return s.Peek(context.Background(), "k") },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			// Reading the prefix's state begins with HEXISTS, and each
			// takes 0.6 Timeout: both together pass it.
			h := &slowRedis{slow: map[string]bool{"hexists": true, "fcall": true, "evalsha": true}, delay: timeout * 6 / 10}
			c, p := client(t, redisAddr(t)), prefix(t)
			t.Cleanup(func() { cleanPrefix(c, p) })
			c.AddHook(h.hook())
			s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: p,
				Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: timeout})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			h.up.Store(true)
			start := time.Now()
			d, err := call(s)
			took := time.Since(start)
			if name == "Peek" {
				require.ErrorIs(t, err, redisstore.ErrUnavailable)
			} else {
				require.NoError(t, err)
				require.True(t, d.Degraded, "%+v", d)
			}
			require.Less(t, took, timeout*3/2, "one Timeout, with room for a slow machine, not two")
			require.GreaterOrEqual(t, took, timeout*6/10, "it waited for Redis")
		})
	}
}

// TestOnErrorSaysWhere: a decision whose deadline (the store's Timeout,
// or the caller's) passes while Redis is slow to answer is answered by the
// failure rule, and OnError is told an error that wraps ErrUnavailable (and
// the deadline), not a bare "context deadline exceeded" that names
// nothing: Allow, AllowBatch, AllowAll and Charge alike.
func TestOnErrorSaysWhere(t *testing.T) {
	t.Parallel()     // waits on deadlines and outages; on a fresh prefix of the shared server
	exactBalances(t) // counts OnError's calls, one per call: with leases AllowBatch decides its requests one by one
	for _, c := range []struct {
		name            string
		timeout, caller time.Duration
	}{{"Timeout", 200 * time.Millisecond, 0}, {"caller's deadline", 5 * time.Second, 200 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			h := &slowRedis{slow: map[string]bool{"fcall": true, "evalsha": true}, delay: time.Minute}
			h.up.Store(true)
			cl := client(t, redisAddr(t))
			var log errorLog
			s := newStore(t, redisstore.Config{Client: cl, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1},
				Timeout: c.timeout, OnError: log.add}, nil)
			// On a loaded machine New's own attempt, bounded by a 200 ms
			// Timeout, may fail, and be told to OnError, before anything is
			// slow: the store reaches Redis first, and the calls' errors are
			// counted from there.
			require.NoError(t, redisstore.Up(s))
			before := len(log.all())
			cl.AddHook(h.hook())
			ctx := func() context.Context {
				if c.caller == 0 {
					return context.Background()
				}
				ctx, cancel := context.WithTimeout(context.Background(), c.caller)
				t.Cleanup(cancel)
				return ctx
			}
			d, err := s.Allow(ctx(), "k", 1)
			require.NoError(t, err)
			require.True(t, d.Degraded)
			out := make([]engine.Result, 2)
			require.NoError(t, s.AllowBatch(ctx(), []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}}, out))
			d, _, err = s.AllowAll(ctx(), []engine.Request{{Key: "k", Cost: 1}})
			require.NoError(t, err)
			require.True(t, d.Degraded)
			d, err = s.Charge(ctx(), "k", 1)
			require.NoError(t, err)
			require.True(t, d.Degraded)
			errs := log.all()[before:]
			require.Len(t, errs, 4, "one per call")
			for i, err := range errs {
				require.ErrorIs(t, err, redisstore.ErrUnavailable, "call %d", i)
				require.ErrorIs(t, err, context.DeadlineExceeded, "call %d", i)
			}
		})
	}
}

// TestStartWithoutRedisDialsOncePerCall: while a store started without
// Redis tries again at each call, each try dials once (with DialerRetries
// 1), so the failure rule answers at once: go-redis's command retries,
// each after a backoff, would hold every call for about 100 ms.
func TestStartWithoutRedisDialsOncePerCall(t *testing.T) {
	srv := downServer(t)
	var dials atomic.Int64
	c := quickClient(t, srv.Addr())
	c.AddHook(hook{dial: func(ctx context.Context, network, addr string, next redis.DialHook) (net.Conn, error) {
		dials.Add(1)
		return next(ctx, network, addr)
	}})
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, OnError: func(error) {}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	const calls = 10
	for range calls {
		d, err := s.Allow(context.Background(), "k", 1)
		require.NoError(t, err)
		require.True(t, d.Degraded)
	}
	require.LessOrEqual(t, dials.Load(), int64(calls+1), "New and each call dial once")
}

// TestRetriedConnectKeepsNewerVersion: a store's first connection read the
// prefix's newer policy (version 2, installed by another store) and then
// failed setting up the virtual shards, so it started without Redis. The
// prefix's global keys are then lost while the shards, at version 2,
// survive. The store's next attempt reinstalls them at version 2, the
// version it read and the shards hold, never at its Config.Policy's
// version 1 below them: every call on the shards would then answer stale.
func TestRetriedConnectKeepsNewerVersion(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	ctx := context.Background()
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
	a := newStore(t, redisstore.Config{Client: client(t, addr), Prefix: p, Policy: v1}, nil)
	require.NoError(t, a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1))

	var failing atomic.Bool
	failing.Store(true)
	bc := client(t, addr)
	bc.AddHook(hook{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if !failing.Load() || slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() != "eval" }) {
			return next(ctx, cmds)
		}
		for _, c := range cmds { // the virtual shards' setup: lost, as to a timeout
			c.SetErr(context.DeadlineExceeded)
		}
		return context.DeadlineExceeded
	}})
	b, err := redisstore.New(ctx, redisstore.Config{Client: bc, Prefix: p, Policy: v1, Timeout: slowMachine})
	require.NoError(t, err, "started without Redis")
	t.Cleanup(func() { _ = b.Close() })
	failing.Store(false)
	for _, name := range []string{"policy", "history", "blobs", "lock"} {
		require.NoError(t, bc.Del(ctx, redisstore.GlobalKey(p, name)).Err())
	}

	d, err := b.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Degraded, "decided by Redis")
	require.True(t, d.Allowed)
	require.Equal(t, int64(2), d.Version)
	v, err := bc.HGet(ctx, redisstore.GlobalKey(p, "policy"), "v").Result()
	require.NoError(t, err)
	require.Equal(t, "2", v, "the global keys reinstalled at the shards' version")
	d, err = a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Degraded)
	require.Equal(t, int64(2), d.Version)
}

// TestOnErrorSaysWhereAtStart: New's attempt to read the prefix's state
// that runs out of its deadline after Redis has answered its first
// commands (here the pipelined scripts that set up the virtual shards
// never come back) is told to OnError as an error that wraps
// ErrUnavailable and the deadline, and says what the attempt was, not a
// bare "context deadline exceeded" that names nothing: on one server,
// where the attempt fails, and on a cluster, where the store starts with
// the shards it could not set up left to the calls that meet them.
//
// The deadline passes when the scripts are held, not at a time: it is
// New's context's (a giveUpCtx), under which the attempt runs (its
// Timeout is slowMachine's). A 200 ms Timeout had to cover the commands
// before the scripts, which a loaded machine stretched past it: the
// deadline then met the reading of the shards' versions, which says so
// ("reading virtual shard 5's version"), and the test failed 1 run in 20
// on one CPU shared with 17 busy loops.
func TestOnErrorSaysWhereAtStart(t *testing.T) {
	t.Parallel() // waits on a deadline; on a fresh prefix of the shared server and cluster
	onBoth(t, func(t *testing.T, addr string) {
		c, p := anyClient(t, addr), prefix(t)
		t.Cleanup(func() { cleanPrefix(c, p) })
		newCtx := newGiveUpCtx(slowMachine)
		held := sync.OnceFunc(func() { close(newCtx.done) }) // one pipeline per master on a cluster
		c.AddHook(hook{pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			if len(cmds) == 1 || cmds[0].Name() != "eval" {
				return next(ctx, cmds)
			}
			held()
			<-ctx.Done() // the shards' set-up scripts, one per shard: never answered
			for _, c := range cmds {
				c.SetErr(ctx.Err())
			}
			return ctx.Err()
		}})
		var log errorLog
		s, err := redisstore.New(newCtx, redisstore.Config{Client: c, Prefix: p,
			Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: slowMachine, OnError: log.add})
		require.NoError(t, err, "a server too slow to answer is one New starts without")
		t.Cleanup(func() { _ = s.Close() })
		errs := log.all()
		require.Len(t, errs, 1, "New's one attempt")
		require.ErrorIs(t, errs[0], redisstore.ErrUnavailable)
		require.ErrorIs(t, errs[0], context.DeadlineExceeded)
		require.ErrorContains(t, errs[0], "reading the prefix's state")
	})
}
