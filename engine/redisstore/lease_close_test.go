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
// armed, close blocked and wait until release is closed, then fail.
type hungCall struct {
	armed            atomic.Bool
	blocked, release chan struct{}
}

func hangNextCall(c *redis.Client) *hungCall {
	h := &hungCall{blocked: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		if !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		close(h.blocked)
		<-h.release
		err := errors.New("test: the call failed")
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}))
	return h
}
