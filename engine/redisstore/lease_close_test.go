package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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

// Close under load gives every unspent token back: with the clock still,
// what was admitted plus what the buckets hold is every bucket's capacity.
func TestLeaseCloseUnderLoadReturnsAll(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	const keys = 64
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var started sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i == 2000 {
					started.Done()
				}
				d, err := a.Allow(ctx, fmt.Sprintf("k%d", (i*7+g)%keys), 1)
				if errors.Is(err, engine.ErrClosed) {
					if i < 2000 {
						started.Done()
					}
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	started.Wait()
	require.NoError(t, a.Close())
	wg.Wait()
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	var held int64
	for k := range keys {
		d, err := b.Peek(ctx, fmt.Sprintf("k%d", k))
		require.NoError(t, err)
		held += d.Remaining
	}
	st := a.Stats()
	require.Equal(t, int64(keys)*p.Capacity, admitted.Load()+held, "tokens neither admitted nor back in Redis; stats %+v", st)
}

// A ReplacePolicy that meets a Close under way waits until the closing
// lease shards have given their leases back: under the version they were
// taken under, not judged against the one it publishes (which raises the
// capacity, so they would be given up).
func TestLeaseReplacePolicyWaitsForClose(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	h := hangNextCall(c)
	p1 := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Policy: p1, Leases: &redisstore.Leases{}}, clk)
	waits := make(chan struct{})
	var once sync.Once
	redisstore.SetCombineHook(s, func(point string) {
		if point == redisstore.HookFlushWaits {
			once.Do(func() { close(waits) })
		}
	})
	ctx := context.Background()
	for range 2 { // the second asks for a lease too
		d, err := s.Allow(ctx, "k", 10)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.Eventually(t, func() bool { return s.Stats().LeasedTokens > 0 }, 5*time.Second, time.Millisecond)

	// A request the lease cannot cover takes what it holds to Redis, whose
	// call hangs: Close then waits for its answer.
	h.armed.Store(true)
	allowed := make(chan struct{})
	go func() {
		defer close(allowed)
		_, _ = s.Allow(ctx, "k", 50)
	}()
	<-h.blocked
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = s.Close()
	}()
	require.Eventually(t, func() bool { return redisstore.LeasesClosed(s) }, 5*time.Second, time.Millisecond)

	replaced := make(chan error, 1)
	go func() {
		replaced <- s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 2000, TokensPerSecond: 1}, 1)
	}()
	end := func() { close(h.release); <-allowed; <-closed }
	select {
	case <-waits:
	case err := <-replaced:
		end()
		t.Fatalf("ReplacePolicy returned (%v) while Close still owed a give-back", err)
	}
	// The hook runs before the flush waits: give a ReplacePolicy that went
	// on regardless the time to return (a few round trips) before the
	// give-back can happen. It passes whatever the delay if the flush waits.
	select {
	case err := <-replaced:
		end()
		t.Fatalf("ReplacePolicy returned (%v) past the flush while Close still owed a give-back", err)
	case <-time.After(100 * time.Millisecond):
	}
	end()
	t.Logf("ReplacePolicy: %v", <-replaced)
	st := s.Stats()
	require.Zero(t, st.ForfeitedTokens, "stats %+v", st)
	require.Equal(t, st.LeasedTokens, st.ReturnedTokens, "stats %+v", st)
}

// A lease shard that forgot a key while a request on it was at Redis (the
// sweep, past MaxAge) still gets back the tokens the request took from the
// key's lease, if Redis did not admit it: given back to Redis, not lost.
func TestLeaseForgottenKeyGetsHeldTokensBack(t *testing.T) {
	clk := clock.NewManual(0)
	c := client(t, redisAddr(t))
	h := hangNextCall(c)
	// capacity 1000: a lease at most 62, asked for only while the bucket
	// keeps 500 more than the request's cost
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	s := newStore(t, redisstore.Config{Client: c, Policy: p, Leases: &redisstore.Leases{}}, clk)
	ctx := context.Background()
	for _, cost := range []int64{480, 1} { // the second brings a lease of 1000-480-1-500 = 19
		d, err := s.Allow(ctx, "k", cost)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	require.Eventually(t, func() bool { return s.Stats().LeasedTokens != 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(19), s.Stats().LeasedTokens)

	// A request the lease cannot cover takes its 19 tokens to Redis (and
	// asks for no lease: the bucket keeps too little), whose call hangs
	// while the key is forgotten.
	h.armed.Store(true)
	allowed := make(chan struct{})
	go func() {
		defer close(allowed)
		_, _ = s.Allow(ctx, "k", 20)
	}()
	<-h.blocked
	clk.Advance(redisstore.DefaultLeaseMaxAge)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = s.Close() // its flush sweeps the key away; it waits for the call's answer
	}()
	require.Eventually(t, func() bool { return redisstore.LeasesClosed(s) }, 5*time.Second, time.Millisecond)
	close(h.release) // the call fails: the failure rule denies, and the 19 tokens are the process's still
	<-allowed
	<-closed
	st := s.Stats()
	require.Zero(t, st.ForfeitedTokens, "stats %+v", st)
	require.Equal(t, uint64(19), st.ReturnedTokens, "stats %+v", st)
}

// hungCall makes the next call of the decide script on a client, once
// armed, close blocked and wait for release (a send, or its close); then
// the call fails (hangNextCall) or goes on to Redis (holdNextCall).
type hungCall struct {
	armed            atomic.Bool
	blocked, release chan struct{}
}

func hangNextCall(c *redis.Client) *hungCall { return hookNextCall(c, true) }
func holdNextCall(c *redis.Client) *hungCall { return hookNextCall(c, false) }

func hookNextCall(c *redis.Client, fail bool) *hungCall {
	h := &hungCall{blocked: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		close(h.blocked)
		<-h.release
		if !fail {
			return next(ctx, cmds)
		}
		err := errors.New("test: the call failed")
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}))
	return h
}

// requireSettled checks a closed leased store owes nothing: every post its
// lease shards counted came, none came uncounted, and no key holds tokens
// or counts any as out or on their way back.
func requireSettled(t *testing.T, s *redisstore.Store) {
	t.Helper()
	pending, unread, left, out, back := redisstore.LeaseDebts(s)
	require.Zero(t, pending, "posts owed")
	require.Zero(t, unread, "posts left unread")
	require.Zero(t, left, "tokens held")
	require.Zero(t, out, "tokens out")
	require.Zero(t, back, "tokens on their way back")
}

// Close while a Charge's give-back is at Redis waits for it: the shard
// counts it as owed, takes its post, then closes; nothing is lost.
func TestLeaseCloseWaitsForChargeGiveBack(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	require.Positive(t, held)
	var armed atomic.Bool
	armed.Store(true)
	redisstore.SetCombineHook(a, func(point string) {
		if point == redisstore.HookGiveBack && armed.CompareAndSwap(true, false) {
			closed := make(chan struct{})
			go func() { defer close(closed); _ = a.Close() }()
			require.Eventually(t, func() bool { return redisstore.LeasesClosed(a) }, 5*time.Second, time.Millisecond)
			select {
			case <-closed:
				t.Error("Close returned with the Charge's give-back on its way")
			case <-time.After(20 * time.Millisecond): // passes whatever the delay if Close waits
			}
		}
	})
	d, err := a.Charge(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.NoError(t, a.Close())
	requireSettled(t, a)
	st := a.Stats()
	require.Zero(t, st.ForfeitedTokens, "%+v", st)
}

// Leased load with everything that hands tokens back at once: Charges,
// cutovers by another store, the store's own ReplacePolicy (flushes),
// sweeps as the clock moves, Peeks and Refunds, then Close under load
// racing a ReplacePolicy. Close returns, leaves no goroutine, and every
// post the shards counted came, none uncounted.
func TestLeaseGiveBacksSettleUnderLoad(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 2000, TokensPerSecond: 1000}
			pfx := prefix(t)
			a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
			b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
			ctx := context.Background()
			var ver atomic.Int64
			ver.Store(1)
			replace := func(s *redisstore.Store) error {
				v := ver.Load()
				err := s.ReplacePolicy(ctx, policy.Policy{Version: v + 1, Capacity: 2000 - 100*(v%3), TokensPerSecond: 1000}, v)
				if err == nil {
					ver.CompareAndSwap(v, v+1)
				}
				return err
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						key := fmt.Sprintf("k%d", (i+g)%8)
						var err error
						switch i % 50 {
						case 7:
							_, err = a.Charge(ctx, key, 3)
						case 19:
							_, err = a.Peek(ctx, key)
						case 31:
							_, err = a.Refund(ctx, key, 2)
						default:
							_, err = a.Allow(ctx, key, 1+int64(i%3))
						}
						if errors.Is(err, engine.ErrClosed) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			cutovers := make(chan struct{})
			go func() { // cutovers by another process, and by a itself, under the load
				defer close(cutovers)
				for i := 0; i < 6; i++ {
					s := b
					if i%2 == 1 {
						s = a
					}
					if err := replace(s); err != nil && !errors.Is(err, engine.ErrStalePolicy) {
						t.Error(err)
					}
					for n := a.Stats().Allowed + 300; a.Stats().Allowed < n; {
						runtime.Gosched() // some load between cutovers
					}
					clk.Advance(300 * time.Millisecond) // sweeps: leases idle, or kept MaxAge
				}
			}()
			<-cutovers
			replaced := make(chan error, 1)
			go func() { replaced <- replace(a) }()
			require.NoError(t, a.Close())
			close(stop)
			wg.Wait()
			if err := <-replaced; err != nil && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrStalePolicy) {
				t.Logf("ReplacePolicy racing Close: %v", err)
			}
			requireSettled(t, a)
			t.Logf("stats %+v", a.Stats())
		})
	}
}

// Close while the fetcher gives a swept lease back waits for it too: the
// shard counts the fetcher's give-back as owed until its post.
func TestLeaseCloseWaitsForSweptGiveBack(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	// The default Horizon: the shard's timer sweeps every Horizon.
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	require.Positive(t, holding(t, a, b, "k", 100))
	var armed atomic.Bool
	armed.Store(true)
	started, swept := make(chan struct{}), make(chan struct{})
	redisstore.SetCombineHook(a, func(point string) {
		if point == redisstore.HookGiveBack && armed.CompareAndSwap(true, false) {
			close(started)
			defer close(swept)
			closed := make(chan struct{})
			go func() { defer close(closed); _ = a.Close() }()
			require.Eventually(t, func() bool { return redisstore.LeasesClosed(a) }, 5*time.Second, time.Millisecond)
			select {
			case <-closed:
				t.Error("Close returned with the sweep's give-back on its way")
			case <-time.After(20 * time.Millisecond): // passes whatever the delay if Close waits
			}
		}
	})
	// MaxAge without a grant: the sweep on the shard's timer gives the
	// lease back through the fetcher, or if a top-up is still on its way
	// (the sweep leaves a key that awaits one), a sweep after it has
	// landed, MaxAge later. No request is made on the key: one would give
	// its expired lease back itself, on its caller's goroutine.
	for i := 0; i < 100 && armed.Load(); i++ {
		clk.Advance(redisstore.DefaultLeaseMaxAge)
		select {
		case <-started:
		case <-time.After(300 * time.Millisecond): // the timer's period (the default Horizon, 100 ms) and more; else MaxAge more
		}
	}
	select {
	case <-swept:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep gave nothing back")
	}
	require.NoError(t, a.Close())
	requireSettled(t, a)
	st := a.Stats()
	require.Zero(t, st.ForfeitedTokens, "%+v", st)
}

// A give-back Redis refuses is given up, and still settled: the shard
// takes its post (the tokens count against the bound no more) and Close
// owes nothing.
func TestLeaseFailedGiveBackSettles(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	c := client(t, redisAddr(t))
	var failing atomic.Bool
	var calls atomic.Int64 // decide calls in flight
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if !failing.Load() {
			calls.Add(1)
			defer calls.Add(-1)
			return next(ctx, cmds)
		}
		err := errors.New("test: refused")
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}))
	pfx := prefix(t)
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}
	a := newStore(t, redisstore.Config{Client: c, Policy: p, Prefix: pfx, Leases: lz}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	// A top-up holding's requests started must be over, answered and taken
	// in, or it would fail below, or land after the count of leases taken.
	require.Eventually(t, func() bool {
		if calls.Load() != 0 {
			return false
		}
		leased := a.Stats().LeasedTokens
		for range 2 { // through the lease's shard, and Redis
			if _, err := a.Peek(ctx, "k"); err != nil {
				return false
			}
		}
		return calls.Load() == 0 && a.Stats().LeasedTokens == leased
	}, 5*time.Second, time.Millisecond)
	failing.Store(true)
	_, err := a.Charge(ctx, "k", 5) // its give-back fails: given up
	require.NoError(t, err)
	failing.Store(false)
	require.GreaterOrEqual(t, a.Stats().ForfeitedTokens, uint64(held))
	// The next request Redis decides brings a whole lease: the tokens given
	// up count against the bound no more.
	leased := a.Stats().LeasedTokens
	d, err := a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Eventually(t, func() bool { return a.Stats().LeasedTokens != leased }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(p.Capacity/redisstore.DefaultLeaseDivisor), a.Stats().LeasedTokens-leased)
	require.NoError(t, a.Close())
	requireSettled(t, a)
}

// A Charge during an outage gives its key's lease up, not back to the
// process: the give-back Redis did not answer may yet be credited (here
// once the hung server resumes), so a process that kept the tokens could
// spend them after the bucket took them back. The key under-admits by
// them meanwhile, as after a crash, and ForfeitedTokens counts them.
func TestLeaseChargeInOutageGivesTheLeaseUp(t *testing.T) {
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}
	a := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Policy: p, Prefix: pfx, Timeout: 200 * time.Millisecond, Leases: lz}, clk)
	b := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	require.Greater(t, held, int64(5))
	before := peek(t, b, "k").Remaining
	var armed atomic.Bool
	armed.Store(true)
	redisstore.SetCombineHook(a, func(point string) {
		if point == redisstore.HookGiveBack && armed.CompareAndSwap(true, false) {
			srv.Hang(t) // the Charge's give-back is sent to a server that answers nothing
		}
	})
	d, err := a.Charge(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, d.Degraded, "%+v", d)
	require.False(t, armed.Load(), "the Charge gave no lease back")
	require.Equal(t, uint64(held), a.Stats().ForfeitedTokens, "the lease is given up: %+v", a.Stats())
	srv.Resume(t)
	// The charge may or may not have been taken; the give-back is credited.
	require.Eventually(t, func() bool { return peek(t, b, "k").Remaining >= before+held-5 }, 5*time.Second, time.Millisecond,
		"the give-back, sent before the outage ended, is credited once the server resumes")
	after := peek(t, b, "k").Remaining
	require.Less(t, after, before+held+5, "credited once: the bucket refills a token a second")
	require.Equal(t, after, peek(t, a, "k").Remaining, "a holds none of what it gave up")
	requireSettled(t, a)
}

// A lease the sweep gives back reads, from the fetcher, the policy of each
// version since the one it was taken under that the store has not seen
// (here another store's cutovers): that read ends within the store's
// Timeout. The fetcher's context has no deadline, and the client here has
// no read timeout either, so a server that stops answering mid-read would
// otherwise hold the fetcher, and Close, which waits for its give-back,
// until the server came back.
func TestLeaseSweptGiveBackEndsOnAHungServer(t *testing.T) {
	srv := startPrivate(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var armed atomic.Bool
	reached, hung := make(chan struct{}), make(chan struct{})
	c.AddHook(hook{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		// the read of version 2's policy, which only a give-back makes
		if a := cmd.Args(); cmd.Name() == "hget" && len(a) == 3 && fmt.Sprint(a[2]) == "2" && armed.CompareAndSwap(true, false) {
			close(reached)
			<-hung // the test has stopped the server
		}
		return next(ctx, cmd)
	}})
	clk := clock.NewManual(0)
	const timeout = 200 * time.Millisecond
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Client: c, Policy: p, Prefix: pfx, Timeout: timeout, Leases: &redisstore.Leases{}}, clk)
	b := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 100)
	require.Positive(t, held)
	// Cutovers a never sees, none raising the capacity: the give-back
	// reads version 2 from Redis to judge the lease (3 it reads anyway,
	// as the version in force).
	for v := int64(2); v <= 3; v++ {
		require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: v, Capacity: 1000, TokensPerSecond: v}, v-1))
	}
	armed.Store(true)
	clk.Advance(redisstore.DefaultLeaseMaxAge) // the lease's key idle, and kept MaxAge: the sweep's timer gives it back
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep's give-back never read version 2's policy")
	}
	srv.Hang(t)
	close(hung)
	closed := make(chan struct{})
	go func() { defer close(closed); _ = a.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second): // many Timeouts
		srv.Resume(t)
		<-closed
		t.Fatalf("Close waited more than 5 s (Timeout %v) on a give-back's read from a hung server", timeout)
	}
	srv.Resume(t)
	requireSettled(t, a)
	st := a.Stats()
	require.Equal(t, uint64(held), st.ForfeitedTokens, "the lease, judged without version 2, is given up: %+v", st)
}

// An AllowBatch that meets a Close under way, its lease shards stopped,
// returns engine.ErrClosed, as its requests do: here Close waits for a
// call a lease shard still awaits (held on its way), and the batch comes
// meanwhile, before the store counts as closed.
func TestLeaseAllowBatchDuringClose(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 16_000, TokensPerSecond: 1}
	c := client(t, redisAddr(t))
	h := holdNextCall(c)
	a := newStore(t, redisstore.Config{Client: c, Policy: p, Leases: &redisstore.Leases{}}, clk)
	ctx := context.Background()
	h.armed.Store(true)
	go func() { _, _ = a.Allow(ctx, "k", 1) }() // its call is held: its shard awaits it
	<-h.blocked
	closed := make(chan struct{})
	go func() { _ = a.Close(); close(closed) }()
	require.Eventually(t, func() bool {
		_, err := a.Allow(ctx, "k", 1)
		return errors.Is(err, engine.ErrClosed)
	}, 10*time.Second, time.Millisecond, "the lease shards did not stop")
	out := make([]engine.Result, 2)
	err := a.AllowBatch(ctx, []engine.Request{{Key: "k", Cost: 1}, {Key: "j", Cost: 1}}, out)
	close(h.release)
	<-closed
	require.ErrorIs(t, out[0].Err, engine.ErrClosed)
	require.ErrorIs(t, out[1].Err, engine.ErrClosed)
	require.ErrorIs(t, err, engine.ErrClosed, "a batch whose requests met Close")
}
