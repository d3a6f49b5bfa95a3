package redisstore_test

// Tests of sentences in the package doc and the exported docs that no other
// test pinned.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// TestDefaultPrefixKeyLayout: Config.Prefix "" means DefaultPrefix, and the
// keys are laid out as the package doc says: Prefix + "{" + tag + "}" +
// name; the global "policy", "history" and "blobs" share one tag, "g" and
// more; each of the DefaultVirtualShards shards has a tag of its own with
// its "p" and "h"; a bucket is "k:" + key in its shard's tag, and keys that
// share a hash tag share a shard. A private server: DefaultPrefix may be
// in use on the shared one.
func TestDefaultPrefixKeyLayout(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s, err := redisstore.New(ctx, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, redisstore.Up(s))
	tagged := []string{"{t}b", "{t}c", "{t}d", "{t}e", "{t}f", "{t}g"} // all in one shard by chance: 1 in 16^5
	for _, k := range append([]string{"a"}, tagged...) {
		d, err := s.Allow(ctx, k, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}

	keys, err := c.Keys(ctx, "*").Result()
	require.NoError(t, err)
	globals := map[string]string{} // name -> tag
	shards := map[string]map[string]bool{}
	buckets := map[string]string{} // key -> tag
	for _, rk := range keys {
		rest, ok := strings.CutPrefix(rk, redisstore.DefaultPrefix+"{")
		require.True(t, ok, "%q is not under DefaultPrefix", rk)
		tag, name, ok := strings.Cut(rest, "}")
		require.True(t, ok && tag != "", "%q has no tag", rk)
		switch {
		case name == "policy" || name == "history" || name == "blobs":
			globals[name] = tag
		case name == "p" || name == "h":
			if shards[tag] == nil {
				shards[tag] = map[string]bool{}
			}
			shards[tag][name] = true
		case strings.HasPrefix(name, "k:"):
			buckets[strings.TrimPrefix(name, "k:")] = tag
		default:
			t.Fatalf("unexpected key %q", rk)
		}
	}
	require.Len(t, globals, 3, "policy, history and blobs: %v", keys)
	g := globals["policy"]
	require.True(t, strings.HasPrefix(g, "g"), "the global tag %q", g)
	require.Equal(t, map[string]string{"policy": g, "history": g, "blobs": g}, globals, "the global keys share one tag")
	require.Len(t, shards, redisstore.DefaultVirtualShards, "one tag per virtual shard")
	for tag, names := range shards {
		require.NotEqual(t, g, tag)
		require.Equal(t, map[string]bool{"p": true, "h": true}, names, "shard tag %q", tag)
	}
	require.Len(t, buckets, 1+len(tagged), "%v", keys)
	for k, tag := range buckets {
		require.Contains(t, shards, tag, "bucket %q is not in a shard's tag", k)
	}
	for _, k := range tagged[1:] {
		require.Equal(t, buckets[tagged[0]], buckets[k], "%q and %q share a hash tag, not a shard", tagged[0], k)
	}
	require.Equal(t, redisstore.DefaultPrefix, "tokenshard:")
}

// TestDefaultTimeoutBoundsACall: with Config.Timeout 0 and a context with
// no deadline, a decision against a server that answers nothing is
// answered by the failure rule once DefaultTimeout (250 ms) has passed,
// not before, and not at go-redis's own ReadTimeout (5 s); a call that is
// not a decision returns ErrUnavailable as soon.
func TestDefaultTimeoutBoundsACall(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s, err := redisstore.New(ctx, redisstore.Config{Client: c, Prefix: prefix(t), Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, redisstore.Up(s))
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Degraded)

	require.Equal(t, 250*time.Millisecond, redisstore.DefaultTimeout)
	srv.Hang(t)
	const slack = 750 * time.Millisecond // a loaded machine
	begin := time.Now()
	d, err = s.Allow(ctx, "k", 1)
	took := time.Since(begin)
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Degraded: true, RetryAfter: redisstore.DefaultFailRetryAfter, Version: 1, Limit: 10}, d)
	require.GreaterOrEqual(t, took, redisstore.DefaultTimeout, "answered before the deadline")
	require.Less(t, took, redisstore.DefaultTimeout+slack, "the default timeout did not bound the call")

	begin = time.Now()
	_, err = s.Peek(ctx, "k")
	took = time.Since(begin)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	require.GreaterOrEqual(t, took, redisstore.DefaultTimeout)
	require.Less(t, took, redisstore.DefaultTimeout+slack)
	srv.Resume(t)
}

// TestGoRedisDefaultsTheDocCites: the go-redis defaults the package doc
// quotes for tuning a client are go-redis's: a dial tried five times,
// 100 ms apart; a cluster client's ReadTimeout of 5 s (which a slot map
// reload that asks a hung master waits out), its slot map reloaded every
// minute, and MaxRedirects 3. No server is needed: the options are read
// back from clients that never connect.
func TestGoRedisDefaultsTheDocCites(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	o := c.Options()
	require.Equal(t, 5, o.DialerRetries)
	require.Equal(t, 100*time.Millisecond, o.DialerRetryTimeout)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cc.Close() })
	co := cc.Options()
	require.Equal(t, 5*time.Second, co.ReadTimeout)
	require.Equal(t, time.Minute, co.ClusterStateReloadInterval)
	require.Equal(t, 3, co.MaxRedirects)
}

// TestManualClockSetsNoExpiry: a store with Config.Clock sets no expiries
// (they would run on the server's clock), so its buckets stay until
// EvictFull deletes them; without it a bucket expires.
func TestManualClockSetsNoExpiry(t *testing.T) {
	ctx := context.Background()
	c := client(t, redisAddr(t))
	// Full again a minute after a token is taken: the bucket decided at
	// TIME outlives the New, the Allow and the PTTL that follow it, however
	// long a loaded machine takes over them.
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(1)}

	realPfx := prefix(t)
	atTIME := newStore(t, redisstore.Config{Client: c, Prefix: realPfx, Policy: p}, nil)
	_, err := atTIME.Allow(ctx, "k", 1)
	require.NoError(t, err)
	pfx := prefix(t)
	clk := clock.NewManual(0)
	manual := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: p}, clk)
	_, err = manual.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Positive(t, c.PTTL(ctx, redisstore.BucketKey(realPfx, "k")).Val(), "a bucket decided at the server's TIME expires")
	require.Equal(t, time.Duration(-1), c.PTTL(ctx, redisstore.BucketKey(pfx, "k")).Val(), "a bucket decided at Config.Clock has no expiry")

	clk.Set(time.Hour.Nanoseconds()) // long full
	n, err := manual.KeyCount(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the full bucket stays")
	n, err = manual.EvictFull(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, c.Exists(ctx, redisstore.BucketKey(pfx, "k")).Val())
}

// TestCloseLeavesTheClientOpen: Close gives the leases back and always
// returns nil, but does not close Config.Client, which the caller owns.
func TestCloseLeavesTheClientOpen(t *testing.T) {
	ctx := context.Background()
	c := client(t, redisAddr(t))
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}, Leases: &redisstore.Leases{}}, clock.NewManual(0))
	warm(t, s, "k") // a lease is held
	require.NoError(t, s.Close())
	require.NotZero(t, s.Stats().ReturnedTokens, "Close gave no lease back")
	require.NoError(t, s.Close())
	require.NoError(t, c.Ping(ctx).Err(), "Close closed the client")
	_, err := s.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, engine.ErrClosed)
}

// TestOutOfMemoryRefusesWritesNotDenials: at maxmemory (noeviction) Redis
// refuses a decision's write on an existing key too (ErrKeyCapacity, unlike
// the engine's key bound), still answers a call whose requests are all
// denials (it writes nothing), and refuses a call that also writes whole:
// its denials answer ErrKeyCapacity too. Stats count each as
// Errors.KeyCapacity, none as a failure.
func TestOutOfMemoryRefusesWritesNotDenials(t *testing.T) {
	exactBalances(t)
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, FailOpen: true}, clock.NewManual(0))
	_, err := s.Allow(ctx, "{x}some", 1)
	require.NoError(t, err)
	d, err := s.Allow(ctx, "{x}drained", 3)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	outOfMemory(t, c)
	before := s.Stats()

	_, err = s.Allow(ctx, "{x}some", 1)
	require.ErrorIs(t, err, engine.ErrKeyCapacity, "an existing key's write is refused too")
	require.NotErrorIs(t, err, redisstore.ErrUnavailable, "out of memory is not an outage")
	d, err = s.Allow(ctx, "{x}drained", 1)
	require.NoError(t, err, "a denial writes nothing")
	require.Equal(t, engine.Decision{RetryAfter: time.Second, Version: 1, Limit: 3, ResetAfter: 3 * time.Second}, d)
	out := make([]engine.Result, 2)
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: "{x}drained", Cost: 1}, {Key: "{x}some", Cost: 1}}, out))
	for i, r := range out {
		require.ErrorIs(t, r.Err, engine.ErrKeyCapacity, "request %d of a call that writes", i)
		require.NotErrorIs(t, r.Err, redisstore.ErrUnavailable, "request %d: out of memory is not an outage", i)
	}

	after := s.Stats()
	require.Equal(t, before.Errors.KeyCapacity+3, after.Errors.KeyCapacity)
	require.Equal(t, before.Denied+1, after.Denied)
	require.Equal(t, before.Allowed, after.Allowed)
	require.Zero(t, after.Failures)
}

// TestLeaseGivenBackBeforeOwnReplacePolicy: a store gives its leases back
// before its own ReplacePolicy, under the version they were taken under, so
// a cutover that raises the capacity (across which a lease met later is
// given up) loses none of them: the bucket holds every token the process
// did not admit, exactly (the clock stands still). A lease bound of 2
// tokens (Divisor 500) asks for no top-up once one token is spent, so no
// grant is in flight at the cutover.
func TestLeaseGivenBackBeforeOwnReplacePolicy(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{Divisor: 500, Horizon: time.Hour, MaxAge: time.Hour}}, clk)
	plain := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	admitted := warm(t, a, "k")
	st := a.Stats()
	require.Equal(t, uint64(2), st.LeasedTokens, "%+v", st)
	require.Equal(t, uint64(1), st.Local, "%+v", st)

	require.NoError(t, a.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 2000, TokensPerSecond: 1}, 1))
	require.NoError(t, a.Close())
	st = a.Stats()
	require.Zero(t, st.ForfeitedTokens, "%+v", st)
	require.Equal(t, uint64(1), st.ReturnedTokens, "%+v", st)
	d, err := plain.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version)
	require.Equal(t, p.Capacity-admitted, d.Remaining, "the lease's unspent token is not back")
}

// TestMaxKeyBytesBoundsKeys: Config.MaxKeyBytes bounds len(key) in bytes
// for every call that takes a key (the default, 256, is the parity
// tests').
func TestMaxKeyBytesBoundsKeys(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, MaxKeyBytes: 4}, clock.NewManual(0))
	for _, key := range []string{"abcd", "é\xff!"} { // 4 bytes each
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err, "%q", key)
		require.True(t, d.Allowed)
	}
	over := "é\xff!!" // 5 bytes
	_, err := s.Allow(ctx, over, 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, err = s.Charge(ctx, over, 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, err = s.Peek(ctx, over)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, err = s.Refund(ctx, over, 1)
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	_, i, err := s.AllowAll(ctx, []engine.Request{{Key: "abcd", Cost: 1}, {Key: over, Cost: 1}})
	require.ErrorIs(t, err, engine.ErrInvalidKey)
	require.Equal(t, 1, i)
	out := make([]engine.Result, 2)
	require.NoError(t, s.AllowBatch(ctx, []engine.Request{{Key: over, Cost: 1}, {Key: "abcd", Cost: 1}}, out))
	require.ErrorIs(t, out[0].Err, engine.ErrInvalidKey)
	require.NoError(t, out[1].Err)
	require.True(t, out[1].Decision.Allowed)
}

// TestWaitWaitsRetryAfterOnTheClock: Wait on a denial waits its RetryAfter
// on Config.Clock (a clock.Manual) and decides again, admitting once a
// token has refilled and not before; a context canceled while it waits
// returns its error and leaves no timer.
func TestWaitWaitsRetryAfterOnTheClock(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}}, clk)
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	type result struct {
		d   engine.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := s.Wait(ctx, "k", 1)
		done <- result{d, err}
	}()
	spinUntil(t, "Wait parks on the clock", func() bool { return clk.Waiting() > 0 })
	clk.Advance(time.Second - time.Nanosecond)
	require.Equal(t, 1, clk.Waiting(), "the wait ended before the RetryAfter")
	require.Equal(t, uint64(1), s.Stats().Denied, "decided again before the RetryAfter")
	clk.Advance(time.Nanosecond)
	r := <-done
	require.NoError(t, r.err)
	require.True(t, r.d.Allowed)
	require.Equal(t, uint64(2), s.Stats().Allowed)

	cctx, cancel := context.WithCancel(ctx)
	go func() {
		d, err := s.Wait(cctx, "k", 1)
		done <- result{d, err}
	}()
	spinUntil(t, "Wait parks on the clock", func() bool { return clk.Waiting() > 0 })
	cancel()
	r = <-done
	require.ErrorIs(t, r.err, context.Canceled)
	require.Zero(t, clk.Waiting(), "the canceled wait left its timer")
}

// TestWaitWaitsOutTheFailureRule: with Redis unreachable and fail closed,
// Wait waits a degraded denial's Config.FailRetryAfter on the clock and
// decides again, until Redis is back and admits.
func TestWaitWaitsOutTheFailureRule(t *testing.T) {
	srv := downServer(t)
	clk := clock.NewManual(0)
	const retry = 3 * time.Second
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, FailRetryAfter: retry, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	done := make(chan error, 1)
	var got engine.Decision
	go func() {
		d, err := s.Wait(context.Background(), "k", 1)
		got = d
		done <- err
	}()
	spinUntil(t, "Wait parks on the clock", func() bool { return clk.Waiting() > 0 })
	require.Equal(t, uint64(1), s.Stats().Failures)
	clk.Advance(retry - time.Nanosecond)
	require.Equal(t, 1, clk.Waiting(), "the wait ended before FailRetryAfter")
	require.Equal(t, uint64(1), s.Stats().Failures, "decided again before FailRetryAfter")
	clk.Advance(time.Nanosecond)
	// Decided again, by the failure rule: Redis is still down.
	spinUntil(t, "Wait decides again", func() bool { return s.Stats().Failures >= 2 })

	srv.Restart(t)
	tick := time.NewTicker(10 * time.Millisecond) // paces the retries while the real server comes back
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.True(t, got.Allowed)
			require.False(t, got.Degraded)
			return
		case <-tick.C:
			if clk.Waiting() > 0 {
				clk.Advance(retry)
			}
		case <-deadline:
			t.Fatal("Redis has been back for 15 s and Wait still waits")
		}
	}
}

// TestEvictFullCountSoFar: an EvictFull whose context ends part-way
// returns the context's error with the count of the buckets it deleted so
// far, exactly: the buckets left are the others. Every bucket is full; the
// context is canceled once the pass's first call has deleted some, and
// the keyspace spans several SCAN pages.
func TestEvictFullCountSoFar(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var armed atomic.Bool
	c.AddHook(decideHook(func(hctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		err := next(hctx, cmds)
		if err == nil && armed.Load() {
			cancel()
		}
		return err
	}))
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	const keys = 3000
	reqs := make([]engine.Request, keys)
	for i := range reqs {
		reqs[i] = engine.Request{Key: fmt.Sprint("k", i), Cost: 1}
	}
	out := make([]engine.Result, keys)
	require.NoError(t, s.AllowBatch(context.Background(), reqs, out))
	for i, r := range out {
		require.NoError(t, r.Err, "request %d", i)
		require.True(t, r.Decision.Allowed, "request %d", i)
	}
	clk.Set(time.Hour.Nanoseconds()) // every bucket full

	armed.Store(true)
	n, err := s.EvictFull(ctx)
	armed.Store(false)
	require.ErrorIs(t, err, context.Canceled)
	require.Positive(t, n, "the first call's deletions are counted")
	require.Less(t, n, keys, "the pass went on after its context ended")
	left, err := s.KeyCount(context.Background())
	require.NoError(t, err)
	require.Equal(t, keys-n, left, "the count is not what was deleted")
}

// decideMode is the mode argument of a decide script call: the first
// argument after its keys.
func decideMode(cmd redis.Cmder) string {
	a := cmd.Args()
	if len(a) < 3 {
		return ""
	}
	n, err := strconv.Atoi(fmt.Sprint(a[2]))
	if err != nil || len(a) <= 3+n {
		return ""
	}
	return fmt.Sprint(a[3+n])
}

// TestOnErrorToldWhatACutoverCannotReturn: Config.OnError hears the
// failures a ReplacePolicy cannot return once it has published: the expiry
// pass after a lengthening cutover (the call returns nil, the cutover is
// in force, its record stays and the buckets keep no expiry until the next
// ReplacePolicy runs the pass first), and releasing the cutover lock
// (which then stays until its TTL).
func TestOnErrorToldWhatACutoverCannotReturn(t *testing.T) {
	exactBalances(t)
	ctx := context.Background()
	c := client(t, redisAddr(t))
	var failPass, failRelease atomic.Bool
	injected := errors.New("injected: connection reset")
	fail := func(cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cmd.SetErr(injected)
		}
		return injected
	}
	c.AddHook(decideHook(func(hctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if failPass.Load() && decideMode(cmds[0]) == "c" {
			return fail(cmds)
		}
		return next(hctx, cmds)
	}))
	pfx := prefix(t)
	lockKey := redisstore.GlobalKey(pfx, "lock")
	c.AddHook(hook{pipeline: func(hctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if failRelease.Load() && slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool {
			return cmd.Name() == "eval" && slices.Contains(cmd.Args(), any(lockKey))
		}) {
			return fail(cmds)
		}
		return next(hctx, cmds)
	}})
	var mu sync.Mutex
	var told []error
	s := newStore(t, redisstore.Config{Client: c, Prefix: pfx, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		OnError: func(err error) { mu.Lock(); told = append(told, err); mu.Unlock() }}, nil)
	saw := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(told, func(err error) bool { return errors.Is(err, injected) && strings.Contains(err.Error(), what) })
	}
	_, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	bucket := redisstore.BucketKey(pfx, "k")
	require.Positive(t, c.PTTL(ctx, bucket).Val())

	failPass.Store(true)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 1}, 1), "published: the pass's failure is not returned")
	failPass.Store(false)
	require.True(t, saw("setting expiries after the cutover to version 2"), "OnError heard %v", told)
	require.Equal(t, int64(2), s.Policy().Version)
	require.Equal(t, time.Duration(-1), c.PTTL(ctx, bucket).Val(), "the bucket keeps no expiry until the pass runs")
	require.NotEmpty(t, c.HGet(ctx, redisstore.GlobalKey(pfx, "policy"), "next").Val(), "the record waits for the expiry pass")

	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 20, TokensPerSecond: 1}, 2))
	require.Positive(t, c.PTTL(ctx, bucket).Val(), "the next ReplacePolicy ran the pass first")
	require.Empty(t, c.HGet(ctx, redisstore.GlobalKey(pfx, "policy"), "next").Val())

	failRelease.Store(true)
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 4, Capacity: 20, TokensPerSecond: 1}, 3), "made: the release's failure is not returned")
	failRelease.Store(false)
	require.True(t, saw("releasing the cutover lock"), "OnError heard %v", told)
	require.Positive(t, c.PTTL(ctx, lockKey).Val(), "the lock stays until its TTL")
	require.NoError(t, c.Del(ctx, lockKey).Err())
}

// spinUntil yields until cond holds, and fails t if it does not within
// 10 s: a Wait that returned early, say, fails the test rather than hang it.
func spinUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		runtime.Gosched()
	}
}
