package redisstore_test

import (
	"context"
	"fmt"
	"math"
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

// leased is a store with leases on, on its own prefix, at clk.
func leased(t *testing.T, p policy.Policy, clk clock.Clock, pfx string) *redisstore.Store {
	t.Helper()
	return newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
}

// drive admits until the store decides locally (a lease is held), and
// returns the tokens it admitted.
func warm(t *testing.T, s *redisstore.Store, key string) int64 {
	t.Helper()
	ctx := context.Background()
	var admitted int64
	for i := 0; i < 10000 && s.Stats().Local == 0; i++ {
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.NotZero(t, s.Stats().Local, "no lease was granted: %+v", s.Stats())
	return admitted
}

func TestLeaseDecidesLocallyAndConserves(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1_000_000, TokensPerSecond: 1000}
	pfx := prefix(t)
	s := leased(t, p, clk, pfx)
	ctx := context.Background()
	admitted := warm(t, s, "k")
	before := s.Stats()
	for range 1000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		admitted++
	}
	after := s.Stats()
	// Most, not all but a few: on a loaded machine the callers can outrun
	// the fetcher's top-ups, and Redis decides a request while the next
	// lease is on its way (CI saw 900 of 1000).
	require.Greater(t, after.Local-before.Local, uint64(500), "most requests were decided by Redis: %+v", after)
	require.Less(t, after.Decisions-before.Decisions, uint64(500))
	// The clock has not moved: what was admitted, what Redis holds and what
	// the lease holds add up to the capacity at most (a top-up in flight
	// is in neither yet).
	pk, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.LessOrEqual(t, admitted+pk.Remaining, p.Capacity, "admitted %d, peek %+v, stats %+v", admitted, pk, after)
	// Close waits for what is in flight and gives every lease back: the
	// bucket then holds every token not admitted, exactly.
	require.NoError(t, s.Close())
	st := s.Stats()
	require.Zero(t, st.ForfeitedTokens, "stats %+v", st)
	require.Positive(t, st.ReturnedTokens, "stats %+v", st)
	s2 := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	pk, err = s2.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, p.Capacity-admitted, pk.Remaining)
}

func TestLeaseSmallKeyIsNeverLeased(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1000}, clk, prefix(t))
	ctx := context.Background()
	for range 200 {
		_, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		clk.Advance(time.Millisecond)
	}
	require.Zero(t, s.Stats().LeasedTokens)
	require.Zero(t, s.Stats().Local)
}

func TestLeaseLocalAllowDoesNotAllocate(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1000}, clk, prefix(t))
	ctx := context.Background()
	warm(t, s, "k")
	for range 10000 { // let the lease grow past what the measure spends
		_, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
	}
	// A measure counts only if every call in it was local (1000 and the
	// warm-up call): on a loaded machine the lease's top-up may come late
	// and a call go to Redis, so a few measures are allowed.
	for try := 0; ; try++ {
		local := s.Stats().Local
		allocs := testing.AllocsPerRun(1000, func() { _, _ = s.Allow(ctx, "k", 1) })
		if s.Stats().Local-local == 1001 {
			require.Zero(t, allocs)
			return
		}
		require.Less(t, try, 5, "no measure of 1000 Allows was all local")
	}
}

// Several stores share one quota: whatever each admits, from its leases or
// from Redis, all together never pass the capacity plus the refill.
func TestLeaseStoresNeverOver(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 2000, TokensPerSecond: 500}
	pfx := prefix(t)
	stores := []*redisstore.Store{leased(t, p, clk, pfx), leased(t, p, clk, pfx), leased(t, p, clk, pfx)}
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 3000 {
					d, err := s.Allow(ctx, "hot", 1)
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
	}
	for range 20 {
		clk.Advance(10 * time.Millisecond) // 5 tokens each
	}
	wg.Wait()
	elapsed := clk.Now()
	bound := p.Capacity + elapsed*p.TokensPerSecond/int64(time.Second)
	require.LessOrEqual(t, admitted.Load(), bound)
	var leased uint64
	for _, s := range stores {
		leased += s.Stats().LeasedTokens
	}
	require.NotZero(t, leased, "the test leased nothing")
}

// A cutover that raises the capacity tops nobody up: the tokens a process
// still holds stop counting, and the bucket is converted as it stands.
func TestLeaseCutoverRaiseTopsNobodyUp(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	pfx := prefix(t)
	s := leased(t, p, clk, pfx)
	other := leased(t, p, clk, pfx)
	ctx := context.Background()
	admitted := warm(t, s, "k") + warm(t, other, "k")
	require.NoError(t, s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100_000, TokensPerSecond: 1}, 1))
	for _, st := range []*redisstore.Store{s, other} {
		for range 3000 {
			d, err := st.Allow(ctx, "k", 1)
			require.NoError(t, err)
			if d.Allowed {
				admitted++
			}
		}
	}
	require.LessOrEqual(t, admitted, p.Capacity, "the cutover minted tokens")
}

// TestLeaseConfigErrors: a negative Leases field is refused, and the error
// names the field to fix.
func TestLeaseConfigErrors(t *testing.T) {
	for field, l := range map[string]redisstore.Leases{
		"Divisor": {Divisor: -1}, "Horizon": {Horizon: -time.Second}, "MaxAge": {MaxAge: -time.Second},
	} {
		_, err := redisstore.New(context.Background(), redisstore.Config{
			Client: client(t, redisAddr(t)), Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
			Leases: &l,
		})
		require.ErrorIs(t, err, engine.ErrInvalidConfig)
		require.ErrorContains(t, err, "Config.Leases."+field+" is negative")
	}
}

// Wait works in lease mode: it waits out a denial, kept in the process or
// Redis's, on the store's clock.
func TestLeaseWait(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 64, TokensPerSecond: 10}
	s := leased(t, p, clk, prefix(t))
	ctx := context.Background()
	admitted := int64(0)
	for range 200 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.LessOrEqual(t, admitted, p.Capacity)
	done := make(chan engine.Decision)
	go func() {
		d, err := s.Wait(ctx, "k", 1)
		if err != nil {
			t.Error(err)
		}
		done <- d
	}()
	for {
		select {
		case d := <-done:
			require.True(t, d.Allowed)
			require.GreaterOrEqual(t, clk.Now(), int64(100*time.Millisecond), "Wait admitted before a token refilled")
			return
		default:
			clk.Advance(time.Millisecond)
			runtime.Gosched()
		}
	}
}

// With Redis gone, a process spends what its lease holds, answered as
// usual, and then answers by the failure rule, marked Degraded; Stats
// counts the failure rule's answers only for requests, never for leases.
func TestLeaseOutlivesRedis(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1 << 30, TokensPerSecond: 1000}
	s := newStore(t, redisstore.Config{Client: client(t, srv.Addr()), Policy: p, Leases: &redisstore.Leases{},
		Timeout: slowMachine}, clk)
	ctx := context.Background()
	warm(t, s, "k")
	srv.Kill()
	local, degraded := 0, 0
	for range 100_000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if d.Degraded {
			require.False(t, d.Allowed, "fail closed")
			degraded++
			break
		}
		require.True(t, d.Allowed)
		local++
	}
	require.Positive(t, local, "the lease was not spent")
	require.Equal(t, 1, degraded, "the lease ran out and nothing answered by the failure rule")
	st := s.Stats()
	require.Equal(t, uint64(1), st.Failures, "%+v", st)
	require.GreaterOrEqual(t, st.Local, uint64(local), "stats %+v", st)
}

// A lease taken under v1 and given back (here at Close) after another
// process's cutover raised the capacity must not top the bucket up: the
// bucket, full under v1 while the lease was out, is carried over as it
// stood (1000), as it is without leases.
func TestLeaseGiveBackAfterOthersRaise(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 300)
	clk.Advance(200 * time.Second) // the bucket refills to full behind the lease
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100_000, TokensPerSecond: 10}, 1))
	require.NoError(t, a.Close()) // gives the v1 lease back
	pb, err := b.Peek(ctx, "k")
	require.NoError(t, err)
	require.LessOrEqual(t, pb.Remaining, p.Capacity, "a give-back under the raised version topped the key up by %d (held %d)", pb.Remaining-p.Capacity, held)
}

// An Allow the store refuses before Redis is counted in Stats.Errors, with
// leases as without.
func TestLeaseAllowErrorsCounted(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		s := newStore(t, redisstore.Config{Policy: p, Leases: lz}, clk)
		_, err := s.Allow(context.Background(), " ", 1)
		require.Error(t, err)
		_, err = s.Allow(context.Background(), "k", 2000) // over the capacity
		require.Error(t, err)
		_, err = s.Allow(context.Background(), "k", 2000) // the key's lease now exists: decided locally
		require.Error(t, err)
		require.Equal(t, uint64(3), s.Stats().Errors.Sum(), "leases %v: %+v", lz != nil, s.Stats().Errors)
	}
}

// A lease taken before other processes' cutovers goes back only if no
// version since could have clamped or dropped its tokens: judged against
// the version in force alone, a limit lowered and raised again, or a band
// added, let it top the key up past what the cutovers left the bucket. The
// clock never moves, so every balance is exact.
func TestLeaseGiveBackAcrossCutovers(t *testing.T) {
	day, err := policy.NewBands(policy.Band{Name: "day", Capacity: 300, Refill: policy.PerDay(300)})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		cutover []policy.Policy // made by another process, in order
		spend   int64           // then admitted by that process
		atCall  bool            // the lease ends at a's next call on the key, not at Close
		left    int64           // the key's tokens after the lease is settled
		// less up to slack: a top-up a's fetcher had in flight, if Redis
		// granted it under v2, is given up (v2 lowered the limit), at most
		// a lease: 1000/16 tokens
		slack int64
	}{
		// clamped to 100 at v2, carried into v3 as 100
		{name: "lowered then raised", left: 100, slack: 62, cutover: []policy.Policy{
			{Version: 2, Capacity: 100, TokensPerSecond: 1}, {Version: 3, Capacity: 1000, TokensPerSecond: 1}}},
		// the same, and a's call takes one of the 100
		{name: "lowered then raised, at a call", atCall: true, left: 99, slack: 62, cutover: []policy.Policy{
			{Version: 2, Capacity: 100, TokensPerSecond: 1}, {Version: 3, Capacity: 1000, TokensPerSecond: 1}}},
		// the band starts full (300); the other process takes 250 of it
		{name: "a band added", spend: 250, left: 50, cutover: []policy.Policy{
			{Version: 2, Capacity: 1000, TokensPerSecond: 1, Bands: day}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
			a, b := leasedBeside(t, p, clk)
			ctx := context.Background()
			holding(t, a, b, "k", 100)
			for _, next := range tc.cutover {
				require.NoError(t, b.ReplacePolicy(ctx, next, next.Version-1))
			}
			drain(t, b, "k", tc.spend)
			if tc.atCall {
				_, err := a.Allow(ctx, "other", 1) // a's next call to Redis: it meets the version in force
				require.NoError(t, err)
				d, err := a.Allow(ctx, "k", 1) // ends the lease, which goes back (or not) first
				require.NoError(t, err)
				require.True(t, d.Allowed)
			}
			require.NoError(t, a.Close())
			st := a.Stats()
			require.NotZero(t, st.ForfeitedTokens, "%+v", st)
			left := drain(t, b, "k", -1)
			require.LessOrEqual(t, left, tc.left, "the lease topped the key up: %+v", st)
			require.GreaterOrEqual(t, left, tc.left-tc.slack, "%+v", st)
		})
	}
}

// drain admits requests of one token on key until n are admitted, or, for
// n < 0, until one is denied, and returns how many were admitted. The
// clock must stand still.
func drain(t *testing.T, s *redisstore.Store, key string, n int64) int64 {
	t.Helper()
	var admitted int64
	for ; admitted != n; admitted++ {
		d, err := s.Allow(context.Background(), key, 1)
		require.NoError(t, err)
		require.False(t, d.Degraded)
		if !d.Allowed {
			require.Negative(t, n, "denied after %d", admitted)
			break
		}
	}
	return admitted
}

// holding admits n requests of one token on key through a, a store with
// leases, then more until a's lease holds tokens, and returns them: what
// a's Peek reports beyond b's, a store without leases on the same prefix.
// A top-up those requests started has landed by then (see leaseLanded):
// the reading is taken twice, each after leaseLanded, and kept only when
// the two agree.
func holding(t *testing.T, a, b *redisstore.Store, key string, n int) int64 {
	t.Helper()
	ctx := context.Background()
	warm(t, a, key)
	held := func() int64 {
		leaseLanded(t, a, b, key)
		return peek(t, a, key).Remaining - peek(t, b, key).Remaining
	}
	for i := 0; i < n+1000; i++ {
		if i >= n {
			if h := held(); h > 0 && held() == h {
				return h
			}
		}
		_, err := a.Allow(ctx, key, 1)
		require.NoError(t, err)
	}
	t.Fatalf("a's lease on %q held nothing: %+v", key, a.Stats())
	return 0
}

// leaseLanded waits until every top-up of a's leases has landed: a's
// fetchers hold no job whose answer they have not posted, and the bucket
// (as b, a store without leases, reads it) and the tokens a has been
// granted stay the same over several round trips through a's lease shard,
// which takes the posts in first, and Redis. The clock must stand still,
// and nothing but the caller may send a requests meanwhile.
func leaseLanded(t *testing.T, a, b *redisstore.Store, key string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		if redisstore.LeaseFetching(a) != 0 {
			return false
		}
		leased := a.Stats().LeasedTokens
		before, err := b.Peek(ctx, key)
		if err != nil {
			return false
		}
		for range 3 {
			if _, err := a.Peek(ctx, key); err != nil {
				return false
			}
		}
		after, err := b.Peek(ctx, key)
		return err == nil && after.Remaining == before.Remaining && a.Stats().LeasedTokens == leased
	}, 10*time.Second, time.Millisecond, "a top-up of %q stayed on its way", key)
}

func peek(t *testing.T, s *redisstore.Store, key string) engine.Decision {
	t.Helper()
	d, err := s.Peek(context.Background(), key)
	require.NoError(t, err)
	return d
}

// A leased answer's Remaining is at most its Limit: the bucket's tokens at
// its last answer plus the lease's pass the capacity once the bucket has
// refilled behind the lease and a top-up reported it full.
func TestLeaseRemainingAtMostLimit(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	holding(t, a, b, "k", 100)
	clk.Advance(200 * time.Second) // the bucket refills to full behind the lease
	ctx := context.Background()
	local := a.Stats().Local
	// Until the lease has decided 400, which takes as many requests as
	// the fetcher's top-ups take to land; the bucket holds 1,000.
	for i := 0; i < 900 && a.Stats().Local-local < 400; i++ {
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.LessOrEqual(t, d.Remaining, d.Limit, "%+v", d)
	}
	require.Greater(t, a.Stats().Local-local, uint64(50), "the lease decided too few: its answers went unchecked")
	d, err := a.Peek(ctx, "k")
	require.NoError(t, err)
	require.LessOrEqual(t, d.Remaining, d.Limit, "%+v", d)
}

// A give-back that meets a cutover published after it read the version in
// force is judged again under the new one: a limit lowered and raised
// again between that read and the refund does not let the lease top the
// key up.
func TestLeaseGiveBackMeetsCutover(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	a, b := leasedBeside(t, p, clk)
	holding(t, a, b, "k", 100)
	var once sync.Once
	redisstore.SetCombineHook(a, func(point string) {
		if point != redisstore.HookGiveBack {
			return
		}
		once.Do(func() {
			ctx := context.Background()
			require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1}, 1))
			require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 3, Capacity: 1000, TokensPerSecond: 1}, 2))
		})
	})
	require.NoError(t, a.Close()) // gives the v1 lease back, judged under v1
	st := a.Stats()
	require.NotZero(t, st.ForfeitedTokens, "%+v", st)
	// 100, less a top-up in flight that Redis granted under v2 (at most a
	// lease: 1000/16), given up
	left := drain(t, b, "k", -1)
	require.LessOrEqual(t, left, int64(100), "the lease topped the key up: %+v", st)
	require.GreaterOrEqual(t, left, int64(100-62), "%+v", st)
}

// TestLeaseNeverPastItsBound: a process's lease on a key, with what it
// has asked for and not yet received, never holds more than the key's
// capacity divided by Leases.Divisor (Leases.Divisor's doc; "P processes
// hold at most P*capacity/Divisor of a key together"). The clock stands
// still, so the bucket, what was admitted and what the process holds add
// up to the capacity exactly: a store without leases on the prefix reads
// the bucket, and the rest is held.
func TestLeaseNeverPastItsBound(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 16000, TokensPerSecond: 1}
	const bound = 16000 / redisstore.DefaultLeaseDivisor
	pfx := prefix(t)
	s := leased(t, p, clk, pfx)
	plain := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	var admitted, most int64
	for i := range 4000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d", i)
		admitted++
		pk, err := plain.Peek(ctx, "k")
		require.NoError(t, err)
		held := p.Capacity - admitted - pk.Remaining
		most = max(most, held)
		require.LessOrEqual(t, held, int64(bound), "after %d admitted the process holds (or awaits) %d tokens", admitted, held)
	}
	require.Positive(t, most, "no lease was ever held")
	require.Positive(t, s.Stats().Local)
}

// TestLeaseKeptDenialOnlyForItsCost: with leases, a denial Redis gave is
// kept for the same cost on the key only ("the same cost on the same key
// is denied in the process until its RetryAfter has passed"); a larger
// cost is decided by Redis, with its own RetryAfter (the engine's rule:
// ceil((cost - balance) / rate)), not the smaller cost's.
func TestLeaseKeptDenialOnlyForItsCost(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, clk, prefix(t))
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Second, d.RetryAfter)
	d, err = s.Allow(ctx, "k", 5)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 5*time.Second, d.RetryAfter, "a cost of 5 on an empty bucket at 1/s")
	d, err = s.Allow(ctx, "k", 1) // the first denial, still kept
	require.NoError(t, err)
	require.Equal(t, time.Second, d.RetryAfter)
}

// leasedBeside returns two stores on a prefix of their own at clk: a with
// leases that no sweep gives back during a test, and b without, which
// reads and changes the buckets as another process would.
func leasedBeside(t *testing.T, p policy.Policy, clk clock.Clock) (a, b *redisstore.Store) {
	t.Helper()
	pfx := prefix(t)
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}
	return newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: lz}, clk), newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
}

// TestLeaseChargeGivesTheLeaseBackFirst: a Charge on a leased key first
// gives the key's lease back, so that the charge takes its tokens from the
// bucket as a whole, and none of the lease's tokens is lost: also when a
// cutover has just ended the lease, which then goes back under the version
// it was taken under. The clock stands still and the cutover raises no
// band, so after Close the bucket holds every token not admitted or
// charged, exactly.
func TestLeaseChargeGivesTheLeaseBackFirst(t *testing.T) {
	for _, cutover := range []bool{false, true} {
		t.Run(fmt.Sprintf("cutover=%t", cutover), func(t *testing.T) {
			clk := clock.NewManual(0)
			p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
			a, b := leasedBeside(t, p, clk)
			ctx := context.Background()
			admitted := warm(t, a, "k")
			for held := int64(0); held <= 0; {
				d, err := a.Allow(ctx, "k", 1)
				require.NoError(t, err)
				if d.Allowed {
					admitted++
				}
				pa, err := a.Peek(ctx, "k")
				require.NoError(t, err)
				pb, err := b.Peek(ctx, "k")
				require.NoError(t, err)
				held = pa.Remaining - pb.Remaining
				require.Less(t, admitted, p.Capacity/2, "a's lease on k held nothing: %+v", a.Stats())
			}
			leaseLanded(t, a, b, "k") // no top-up on its way: the lease holds what it will hold
			held := peek(t, a, "k").Remaining - peek(t, b, "k").Remaining
			returned := a.Stats().ReturnedTokens
			if cutover {
				require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1000, TokensPerSecond: 1}, 1))
				_, err := a.Allow(ctx, "other", 1) // a's next call to Redis: it meets the version in force
				require.NoError(t, err)
			}
			d, err := a.Charge(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			require.False(t, d.Degraded)
			// The lease went back with the charge, not at Close.
			require.Equal(t, uint64(held), a.Stats().ReturnedTokens-returned, "%+v", a.Stats())
			require.Equal(t, p.Capacity-admitted-5, peek(t, b, "k").Remaining, "the charge left the lease in place: %+v", a.Stats())
			require.NoError(t, a.Close())
			st := a.Stats()
			require.Zero(t, st.ForfeitedTokens, "%+v", st)
			pk, err := b.Peek(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, p.Capacity-admitted-5, pk.Remaining, "the lease's tokens were lost: %+v", st)
		})
	}
}

// TestLeaseConcurrentChargesLoseNothing: Charges racing leased Allows on
// the same keys, each Charge giving its key's lease back first, lose no
// token and take none twice. The clock stands still and no key nears its
// floor, so after Close the bucket has lost exactly what was admitted,
// charged and forfeited.
func TestLeaseConcurrentChargesLoseNothing(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 100_000, TokensPerSecond: 1}
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	keys := []string{"k", "j"}
	var admitted, charged atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				key := keys[i%len(keys)]
				if (i+g)%7 == 0 {
					d, err := a.Charge(ctx, key, 3)
					if err != nil || !d.Allowed || d.Degraded {
						t.Errorf("Charge(%q, 3) = %+v, %v", key, d, err)
					}
					charged.Add(3)
					continue
				}
				d, err := a.Allow(ctx, key, 1)
				if err != nil {
					t.Errorf("Allow(%q, 1): %v", key, err)
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, a.Close())
	st := a.Stats()
	require.NotZero(t, st.Local, "no lease was ever used: %+v", st)
	var spent int64
	for _, key := range keys {
		d, err := b.Peek(ctx, key)
		require.NoError(t, err)
		spent += p.Capacity - d.Remaining
	}
	require.Equal(t, admitted.Load()+charged.Load()+int64(st.ForfeitedTokens), spent, "%+v", st)
}

// TestLeaseWantScalesDemandToHorizon: the lease asked for with a request
// Redis decides is the key's demand over the last Horizon: the tokens
// admitted since demand began counting, scaled down by Horizon/elapsed
// (rounded down) once more than a Horizon has passed. One nanosecond past
// it, 1000 tokens weigh 999; the count goes on from the same start (it is
// rescaled only once it covers two Horizons).
func TestLeaseWantScalesDemandToHorizon(t *testing.T) {
	clk := clock.NewManual(0)
	// a bound (capacity/16) and a reserve (capacity/2) far above the demand
	s := leased(t, policy.Policy{Version: 1, Capacity: 1 << 20, TokensPerSecond: 1}, clk, prefix(t))
	ctx := context.Background()
	allow := func(cost int64) {
		t.Helper()
		d, err := s.Allow(ctx, "k", cost)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	allow(1000) // no demand yet: no lease
	require.Zero(t, s.Stats().LeasedTokens)
	clk.Advance(redisstore.DefaultLeaseHorizon + 1)
	allow(1) // 1000 over a Horizon and 1ns
	require.Eventually(t, func() bool { return s.Stats().LeasedTokens != 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(999), s.Stats().LeasedTokens)
	clk.Advance(1)
	allow(1000) // beyond the lease: 1,001 over a Horizon and 2ns, scaled to 1,000
	require.Eventually(t, func() bool { return s.Stats().LeasedTokens != 999 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(999+1000), s.Stats().LeasedTokens)
}

// TestLeaseDemandSaturates: a key's demand is counted without wrapping.
// Two admissions of the whole int64 range within a Horizon are a demand of
// math.MaxInt64, not a negative one: once Redis has answered that the
// bucket is full again, the next request asks for the largest lease
// (capacity/16).
func TestLeaseDemandSaturates(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: math.MaxInt64}
	lz := &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}
	s := newStore(t, redisstore.Config{Policy: p, Prefix: prefix(t), Leases: lz}, clk)
	ctx := context.Background()
	for _, cost := range []int64{math.MaxInt64, math.MaxInt64, 1, 1} {
		d, err := s.Allow(ctx, "k", cost)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		clk.Advance(time.Second) // the bucket full again
	}
	require.Eventually(t, func() bool { return s.Stats().LeasedTokens != 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(math.MaxInt64/16), s.Stats().LeasedTokens)
}

// TestLeaseSteadyDemandAfterPause: a key that one caller takes up again
// after a pause longer than a Horizon, at a steady 10,000 requests a
// second, is leased within a Horizon and then decided in the process. Its
// demand count used to be scaled down at every request once it counted
// over more than a Horizon, and rounding down kept it at nothing.
func TestLeaseSteadyDemandAfterPause(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 1 << 30, TokensPerSecond: 1 << 20}, clk, prefix(t))
	ctx := context.Background()
	allow := func() {
		t.Helper()
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	allow()
	clk.Advance(redisstore.DefaultLeaseHorizon * 3 / 2)
	for range 10_000 { // one second
		allow()
		clk.Advance(100 * time.Microsecond)
	}
	st := s.Stats()
	require.Greater(t, st.Local, uint64(8_000), "%+v", st)
}

// TestLeaseLongHorizon: a Horizon as long as a Duration goes does not
// overflow the idle time after which a lease goes back (two Horizons, at
// most MaxAge): leases are kept, and requests decided in the process.
func TestLeaseLongHorizon(t *testing.T) {
	clk := clock.NewManual(0)
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 1 << 30, TokensPerSecond: 1000}, Prefix: prefix(t),
		Leases: &redisstore.Leases{Horizon: math.MaxInt64}}, clk)
	ctx := context.Background()
	for range 10_000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	st := s.Stats()
	require.Greater(t, st.Local, uint64(9_000), "%+v", st)
	require.Zero(t, st.ReturnedTokens, "no lease went back: the key was never idle")
}

// TestLeaseBoundCountsTokensAtRedis: the bound holds while a request that
// the lease could not cover is at Redis with the lease's tokens: a request
// meanwhile asks only for what the bound leaves, so that when Redis denies
// the first and its tokens come back, the process holds no more than
// capacity/Divisor (here 62 of 1,000).
func TestLeaseBoundCountsTokensAtRedis(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	const bound = 1000 / redisstore.DefaultLeaseDivisor
	c := client(t, redisAddr(t))
	h := holdNextCall(c)
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Client: c, Policy: p, Prefix: pfx, Leases: &redisstore.Leases{Horizon: time.Hour, MaxAge: time.Hour}}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	allow := func(s *redisstore.Store, cost int64, allowed bool) {
		t.Helper()
		d, err := s.Allow(ctx, "k", cost)
		require.NoError(t, err)
		require.Equal(t, allowed, d.Allowed, "%+v", d)
	}
	allow(a, 60, true) // a demand of 60, decided by Redis
	allow(a, 2, true)  // decided by Redis, with a lease of 60 (the demand)
	allow(b, 1000-62-60-200, true)
	// The bucket keeps 200; a asks for 600 with its 60, and no lease (the
	// bucket, as a last heard it, keeps too little). Its call is held.
	h.armed.Store(true)
	denied := make(chan error)
	go func() {
		d, err := a.Allow(ctx, "k", 600)
		if err == nil && d.Allowed {
			err = fmt.Errorf("admitted: %+v", d)
		}
		denied <- err
	}()
	<-h.blocked
	allow(a, 1, true) // a lease, of what the bound leaves with the 60 at Redis
	close(h.release)
	require.NoError(t, <-denied)
	pk, err := b.Peek(ctx, "k")
	require.NoError(t, err)
	var local int64 // the lease's tokens, spent in the process
	var first engine.Decision
	for {
		before := a.Stats().Local
		d, err := a.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if a.Stats().Local == before || !d.Allowed {
			break
		}
		if local++; local == 1 {
			first = d
		}
	}
	require.LessOrEqual(t, local, int64(bound), "the process held more than capacity/Divisor")
	require.GreaterOrEqual(t, local, int64(60), "the 60 came back to the lease")
	// The first local answer's Remaining: the bucket as Redis last told it
	// (the clock stands still, so as it is), and the lease after it, the
	// 60 counted once.
	require.Equal(t, pk.Remaining+local-1, first.Remaining)
}

// TestLeaseBoundCountsTokensGoingBack: a lease given back (here before a
// Charge) is out of the bucket until Redis has credited it, and counts
// against the process's bound until then: requests meanwhile get a lease
// of what the bound leaves, not a whole new one ("P processes hold at most
// P*capacity/Divisor of a key together"). Before, the process held 62 and
// had 58 on their way back: 120 out of the bucket on its account. The
// clock stands still, so what a has admitted, what is out of the bucket
// on its account and the bucket add up to the capacity.
func TestLeaseBoundCountsTokensGoingBack(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	const bound = 1000 / redisstore.DefaultLeaseDivisor
	a, b := leasedBeside(t, p, clk)
	ctx := context.Background()
	require.Positive(t, holding(t, a, b, "k", 100))
	var most int64
	var giving atomic.Bool
	redisstore.SetCombineHook(a, func(point string) {
		if point != redisstore.HookGiveBack || !giving.CompareAndSwap(false, true) {
			return
		}
		for range 200 { // the Charge's give-back is on its way: spend
			_, err := a.Allow(ctx, "k", 1)
			require.NoError(t, err)
			pk, err := b.Peek(ctx, "k")
			require.NoError(t, err)
			most = max(most, p.Capacity-int64(a.Stats().Allowed)-pk.Remaining)
		}
	})
	_, err := a.Charge(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, giving.Load(), "no give-back")
	require.Positive(t, most)
	require.LessOrEqual(t, most, int64(bound), "out of the bucket on the process's account")
}

// TestLeaseCostAboveAnOldCapacity: a cost above the capacity of the policy
// a store with leases last saw is sent to Redis, which answers under the
// policy in force, as a store without leases does; it is not refused in
// the process.
func TestLeaseCostAboveAnOldCapacity(t *testing.T) {
	clk := clock.NewManual(0)
	p1 := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p1, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	other := newStore(t, redisstore.Config{Policy: p1, Prefix: pfx}, clk)
	ctx := context.Background()
	for _, cost := range []int64{2, 1} { // a lease on k, under version 1
		_, err := a.Allow(ctx, "k", cost)
		require.NoError(t, err)
	}
	require.NoError(t, other.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 1000, TokensPerSecond: 1}, 1))
	d, err := a.Allow(ctx, "j", 500) // a new key: a full bucket under version 2
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	require.Equal(t, int64(2), d.Version)
	_, err = a.Allow(ctx, "j", 1001)
	require.ErrorIs(t, err, engine.ErrCostExceedsCapacity, "above the capacity in force")
}

// TestLeaseRefundEndsKeptDenial: a denial Redis gave is kept in the
// process until its RetryAfter, but a Refund goes to Redis and ends it: the
// bucket then holds the refunded tokens, and the same request, at the same
// instant, is admitted.
func TestLeaseRefundEndsKeptDenial(t *testing.T) {
	clk := clock.NewManual(0)
	s := leased(t, policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, clk, prefix(t))
	ctx := context.Background()
	d, err := s.Allow(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Second, d.RetryAfter)
	r, err := s.Refund(ctx, "k", 5)
	require.NoError(t, err)
	require.Equal(t, int64(5), r.Remaining)
	d, err = s.Allow(ctx, "k", 1) // the clock has not moved: only the refund admits it
	require.NoError(t, err)
	require.True(t, d.Allowed, "a denial kept past a Refund that made room: %+v", d)
	require.Equal(t, int64(4), d.Remaining)
}

// TestLeasePeekAtMostLimit: Peek adds what the process's lease holds to
// Redis's answer, at most Limit: once the bucket has refilled to full
// behind a lease, the sum passes the capacity, and Peek reports the
// capacity, never more.
func TestLeasePeekAtMostLimit(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	held := holding(t, a, b, "k", 100)
	require.Positive(t, held)
	clk.Advance(200 * time.Second) // the bucket refills to full behind the lease
	ctx := context.Background()
	pb, err := b.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, p.Capacity, pb.Remaining, "the bucket alone is full")
	pa, err := a.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, p.Capacity, pa.Remaining, "a full bucket plus a lease of %d: %+v", held, pa)
	require.Equal(t, p.Capacity, pa.Limit)
}

// TestLeaseResetAfterNeverNegative: a leased answer's ResetAfter counts
// down from the bucket's last answer; once that much time has passed, the
// bucket is full as far as the process knows, and ResetAfter is 0, never
// below.
func TestLeaseResetAfterNeverNegative(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 10}
	a, b := leasedBeside(t, p, clk)
	holding(t, a, b, "k", 100)
	clk.Advance(200 * time.Second) // past any ResetAfter the bucket gave
	ctx := context.Background()
	local := a.Stats().Local
	d, err := a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	require.Equal(t, local+1, a.Stats().Local, "the lease did not decide")
	require.GreaterOrEqual(t, d.ResetAfter, time.Duration(0), "%+v", d)
}

// TestLeaseFailOpenGrantsNothing: with Redis gone and the store failing
// open, the failure rule admits the requests it answers, marked Degraded,
// and a lease asked for meanwhile (with a request, or as a top-up) is
// "admitted" by the same rule; but no bucket gave those tokens, so they
// must not become a lease the process spends as its own. Every answer not
// marked Degraded is a token taken from the bucket: the clock stands still,
// so those answers together never pass the capacity.
func TestLeaseFailOpenGrantsNothing(t *testing.T) {
	srv := startPrivate(t)
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	// Each call to the dead server fails at its one dial, at once. A pool
	// larger than the dials that fail keeps go-redis from starting its
	// background redial loop, which outlives a short test by a second.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, PoolSize: 1 << 16})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, redisstore.Config{Client: c, Policy: p, Leases: &redisstore.Leases{}, FailOpen: true,
		Timeout: 200 * time.Millisecond}, clk)
	ctx := context.Background()
	admitted := warm(t, s, "k") // admitted by the bucket, directly or by a lease
	srv.Kill()
	var local, degraded int64
	for range 5000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "fail open")
		if d.Degraded {
			degraded++
		} else {
			local++
		}
	}
	require.Positive(t, degraded, "the lease never ran out")
	require.LessOrEqual(t, admitted+local, p.Capacity,
		"answers not marked Degraded past what the bucket gave: %d before Redis went, %d after (stats %+v)", admitted, local, s.Stats())
}

// A lease holds tokens of every band: with the clock still, one leased
// process admits at most the tightest band's capacity, and once its leases
// are back every band holds exactly its capacity less what was admitted.
func TestLeaseBandsConserve(t *testing.T) {
	clk := clock.NewManual(0)
	day, err := policy.NewBands(policy.Band{Name: "day", Capacity: 800, Refill: policy.PerDay(800)})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 5000, TokensPerSecond: 5000, Bands: day}
	pfx := prefix(t)
	s := leased(t, p, clk, pfx)
	ctx := context.Background()
	var admitted int64
	for range 2000 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
	}
	require.NotZero(t, s.Stats().Local, "stats %+v", s.Stats())
	require.LessOrEqual(t, admitted, int64(800))
	require.NoError(t, s.Close())
	plain := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	pk, err := plain.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 800-admitted, pk.Remaining, "day band after give-back; admitted %d stats %+v", admitted, s.Stats())
	t.Logf("admitted %d, stats %+v", admitted, s.Stats())
}

// AllowBatch in lease mode decides request by request as Allow would, and
// never passes a key's bound.
func TestLeaseAllowBatchConserves(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 640, TokensPerSecond: 640}
	pfx := prefix(t)
	s := leased(t, p, clk, pfx)
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	admitted := map[string]int64{}
	reqs := make([]engine.Request, 0, 30)
	for range 10 {
		for _, k := range keys {
			reqs = append(reqs, engine.Request{Key: k, Cost: 1})
		}
	}
	out := make([]engine.Result, len(reqs))
	for range 40 {
		require.NoError(t, s.AllowBatch(ctx, reqs, out))
		for i, r := range out {
			require.NoError(t, r.Err)
			if r.Decision.Allowed {
				admitted[reqs[i].Key]++
			}
		}
	}
	require.NoError(t, s.Close())
	plain := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	for _, k := range keys {
		require.LessOrEqual(t, admitted[k], int64(640))
		pk, err := plain.Peek(ctx, k)
		require.NoError(t, err)
		require.Equal(t, 640-admitted[k], pk.Remaining, "key %s", k)
	}
	t.Logf("admitted %v, stats %+v", admitted, s.Stats())
}

// A key whose smallest band is small is never leased, however large its
// primary capacity.
func TestLeaseSmallBandIsNeverLeased(t *testing.T) {
	clk := clock.NewManual(0)
	b, err := policy.NewBands(policy.Band{Name: "minute", Capacity: 20, Refill: policy.PerMinute(20)})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 100000, TokensPerSecond: 100000, Bands: b}
	s := leased(t, p, clk, prefix(t))
	ctx := context.Background()
	var admitted int64
	for i := range 200 {
		d, err := s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		if i%20 == 19 {
			clk.Advance(3 * time.Second)
		}
	}
	st := s.Stats()
	require.Zero(t, st.LeasedTokens, "stats %+v", st)
	t.Logf("admitted %d", admitted)
}

// AllowBatch in lease mode returns the context's error when the context
// is canceled part-way, as it does without leases, and writes it into
// every request it did not decide: the first request, sent to Redis,
// meets the cancel on its way; the others are never decided. A caller
// that reads only AllowBatch's error must not take the batch for decided.
func TestLeaseAllowBatchCanceledPartWay(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 640, TokensPerSecond: 1}
	s := leased(t, p, clk, prefix(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	redisstore.SetCombineHook(s, func(point string) {
		if point == redisstore.HookAlone {
			cancel() // the caller goes away while its batch is decided
		}
	})
	reqs := []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}, {Key: " ", Cost: 1}, {Key: "c", Cost: 1}}
	out := make([]engine.Result, len(reqs))
	err := s.AllowBatch(ctx, reqs, out)
	require.ErrorIs(t, err, context.Canceled, "results %+v", out)
	require.ErrorIs(t, out[0].Err, context.Canceled)
	require.ErrorIs(t, out[1].Err, context.Canceled, "decided after the context ended")
	require.ErrorIs(t, out[2].Err, engine.ErrInvalidKey, "a bad key keeps its own error")
	require.ErrorIs(t, out[3].Err, context.Canceled, "decided after the context ended")
}

// flipCtx is a context that reads as canceled from its n-th Err on: one
// canceled at some moment inside a call.
type flipCtx struct {
	context.Context
	n atomic.Int64
}

func (c *flipCtx) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// TestLeaseAllowBatchCanceledAmongLeases: a batch whose every key is
// decided from its lease, with no request to Redis to notice, still ends
// at a cancel that comes after it started: it returns the cancel, and the
// requests after it are not decided.
func TestLeaseAllowBatchCanceledAmongLeases(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 640, TokensPerSecond: 1}
	s := leased(t, p, clk, prefix(t))
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys { // until a request on k is decided from its lease
		for i, local := 0, s.Stats().Local; s.Stats().Local == local; i++ {
			require.Less(t, i, 10000, "no lease on %s", k)
			_, err := s.Allow(context.Background(), k, 1)
			require.NoError(t, err)
		}
	}
	var reqs []engine.Request
	for range 4 {
		for _, k := range keys {
			reqs = append(reqs, engine.Request{Key: k, Cost: 1})
		}
	}
	before := s.Stats()
	ctx := &flipCtx{Context: context.Background()}
	ctx.n.Store(2) // the batch's first look, and one more
	out := make([]engine.Result, len(reqs))
	err := s.AllowBatch(ctx, reqs, out)
	require.ErrorIs(t, err, context.Canceled, "results %+v", out)
	require.ErrorIs(t, out[len(out)-1].Err, context.Canceled, "decided after the context ended")
	require.Equal(t, uint64(decided(out)), s.Stats().Local-before.Local, "every request decided was decided from a lease")
}

// decided counts the results of out that are decisions.
func decided(out []engine.Result) int {
	n := 0
	for _, r := range out {
		if r.Err == nil {
			n++
		}
	}
	return n
}

// A lease whose key went idle ends at the next request, not only at the
// sweep, which runs after a group of requests or on a timer: spent after
// it, a lease taken before another process's cutover answered under the
// old limit past MaxAge (here, 100,000 where 500 is in force).
func TestLeaseIdleLeaseEndsAtTheNextRequest(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 100_000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	held := holding(t, a, b, "k", 300)
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 500, TokensPerSecond: 1}, 1))
	clk.Advance(redisstore.DefaultLeaseMaxAge) // idle for ten Horizons, and MaxAge since the grant
	d, err := a.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Version, "a lease of %d tokens idle for MaxAge was spent: %+v", held, d)
	require.Equal(t, int64(500), d.Limit)
}

// A denial kept in the process ends MaxAge after Redis gave it, however
// long its RetryAfter: kept for its 50 s here, it answered under version 1
// long after another process's cutover to a rate that refills 2,000 tokens
// a second.
func TestLeaseKeptDenialFollowsAnotherCutover(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{}}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	ctx := context.Background()
	d, err := a.Allow(ctx, "k", 100)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = a.Allow(ctx, "k", 50)
	require.NoError(t, err)
	require.Equal(t, 50*time.Second, d.RetryAfter)
	require.NoError(t, b.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 100, TokensPerSecond: 1000}, 1))
	clk.Advance(time.Second / 2)
	d, err = a.Allow(ctx, "k", 50) // within MaxAge: the denial is kept
	require.NoError(t, err)
	require.Equal(t, engine.Decision{Version: 1, Limit: 100, RetryAfter: 49500 * time.Millisecond, ResetAfter: 99500 * time.Millisecond}, d)
	clk.Advance(redisstore.DefaultLeaseMaxAge / 2)
	d, err = a.Allow(ctx, "k", 50)
	require.NoError(t, err)
	require.True(t, d.Allowed, "%+v", d)
	require.Equal(t, int64(2), d.Version)
}

// A lease goes back once its key has had no request for two Horizons,
// though the key is peeked meanwhile: a Peek takes nothing, so it is no
// demand the lease serves (here every 150 ms, for 1.5 s, with a Horizon of
// 100 ms and MaxAge an hour).
func TestLeasePeeksKeepNoIdleLease(t *testing.T) {
	clk := clock.NewManual(0)
	p := policy.Policy{Version: 1, Capacity: 100_000, TokensPerSecond: 1}
	pfx := prefix(t)
	a := newStore(t, redisstore.Config{Policy: p, Prefix: pfx, Leases: &redisstore.Leases{MaxAge: time.Hour}}, clk)
	b := newStore(t, redisstore.Config{Policy: p, Prefix: pfx}, clk)
	held := holding(t, a, b, "k", 300)
	for range 10 {
		clk.Advance(150 * time.Millisecond)
		peek(t, a, "k")
	}
	require.Zero(t, peek(t, a, "k").Remaining-peek(t, b, "k").Remaining, "Peeks kept a lease of %d tokens on a key with no request", held)
}
