package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
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

// atSpy is a Manual clock that tells which instants Wait asks to wake at.
type atSpy struct {
	*clock.Manual
	at chan int64
}

func (c atSpy) At(t int64) (<-chan struct{}, func()) {
	c.at <- t
	return c.Manual.At(t)
}

// TestWaitModelThroughTheScript: a key drained at t0 by an Allow or a
// Charge (into debt), and waited on for cost tokens a little later, is
// waited for until exactly the first instant T at which every band holds
// cost (math/big, from the documented refill, with the script deciding):
// Wait asks its clock to wake at T, not a nanosecond before or after, and
// at T is admitted with exactly cost taken.
func TestWaitModelThroughTheScript(t *testing.T) {
	exactBalances(t)
	const seed = 7331
	r := rand.New(rand.NewPCG(seed, 2))
	c := client(t, redisAddr(t))
	for i := range 40 {
		rate := func() (int64, int64) {
			switch r.IntN(3) {
			case 0:
				return 1 + r.Int64N(1_000), int64(time.Second)
			case 1:
				return 1 + r.Int64N(7), 1 + r.Int64N(50)
			default:
				return 1 + r.Int64N(100), 1 + r.Int64N(int64(time.Minute))
			}
		}
		type band struct {
			name    string
			c, n, p int64
		}
		p := policy.Policy{Version: 1, Capacity: 1 + r.Int64N(200)}
		n, per := rate()
		p.Refill = policy.Rate{Tokens: n, Per: time.Duration(per)}
		bs := []band{{"", p.Capacity, n, per}}
		var extra []policy.Band
		for j := range r.IntN(3) {
			n, per := rate()
			b := policy.Band{Name: fmt.Sprintf("b%d", j), Capacity: 1 + r.Int64N(200), Refill: policy.Rate{Tokens: n, Per: time.Duration(per)}}
			extra = append(extra, b)
			bs = append(bs, band{b.Name, b.Capacity, n, per})
		}
		var err error
		p.Bands, err = policy.NewBands(extra...)
		require.NoError(t, err)
		minCap := p.Capacity
		for _, b := range bs {
			minCap = min(minCap, b.c)
		}
		charge := r.IntN(3) == 0
		drain := 1 + r.Int64N(minCap)
		if charge {
			drain = 1 + r.Int64N(3*minCap)
		}
		cost := 1 + r.Int64N(minCap)
		t0 := r.Int64N(int64(time.Hour))
		asked := t0 + r.Int64N(50)
		name := fmt.Sprintf("seed %d case %d: %+v bands %+v charge %v drain %d cost %d t0 %d asked %d", seed, i, p, bs, charge, drain, cost, t0, asked)

		b := big.NewInt
		units := make([]*big.Int, len(bs))
		T := t0
		for j, bd := range bs {
			units[j] = new(big.Int).Mul(b(max(bd.c-drain, -bd.c)), b(bd.p))
			need := new(big.Int).Sub(new(big.Int).Mul(b(cost), b(bd.p)), units[j])
			if need.Sign() > 0 {
				w := new(big.Int).Add(need, b(bd.n-1))
				T = max(T, t0+w.Div(w, b(bd.n)).Int64())
			}
		}
		at := max(T, asked)
		bind, remain := -1, int64(0)
		for j, bd := range bs {
			u := new(big.Int).Add(units[j], new(big.Int).Mul(b(at-t0), b(bd.n)))
			if full := new(big.Int).Mul(b(bd.c), b(bd.p)); u.Cmp(full) > 0 {
				u = full
			}
			u.Sub(u, new(big.Int).Mul(b(cost), b(bd.p)))
			if rem := new(big.Int).Div(u, b(bd.p)).Int64(); bind < 0 || rem < remain {
				bind, remain = j, rem
			}
		}

		clk := atSpy{clock.NewManual(t0), make(chan int64, 4)}
		s := newStore(t, redisstore.Config{Client: c, Policy: p}, clk)
		ctx := context.Background()
		if charge {
			_, err = s.Charge(ctx, "k", drain)
		} else {
			var d engine.Decision
			d, err = s.Allow(ctx, "k", drain)
			require.True(t, d.Allowed, name)
		}
		require.NoError(t, err, name)
		clk.Set(asked)
		got := make(chan waitResult, 1)
		go func() {
			d, err := s.Wait(ctx, "k", cost)
			got <- waitResult{d, err}
		}()
		if T > asked {
			select {
			case w := <-clk.at:
				require.Equal(t, T, w, "%s: the instant Wait wakes at", name)
			case res := <-got:
				t.Fatalf("%s: Wait returned at %d, want at %d: %+v", name, asked, T, res)
			}
			spinUntil(t, name+": Wait parks on the clock", func() bool { return clk.Waiting() > 0 })
			clk.Set(T)
		}
		res := <-got
		require.NoError(t, res.err, name)
		require.True(t, res.d.Allowed, name)
		require.Equal(t, remain, res.d.Remaining, name)
		require.Equal(t, bs[bind].c, res.d.Limit, name)
		require.Empty(t, clk.at, "%s: Wait slept again", name)
		require.NoError(t, s.Close())
	}
}

type waitResult struct {
	d   engine.Decision
	err error
}

// TestWaitLostReplyMaySpend: a Wait whose call Redis ran but whose reply
// was lost is answered by the failure rule; with a deadline before its
// FailRetryAfter it returns ErrWouldExceedDeadline wrapping ErrUnavailable,
// and the key has paid the cost all the same.
func TestWaitLostReplyMaySpend(t *testing.T) {
	exactBalances(t)
	clk := clock.NewManual(0)
	var lose atomic.Bool
	c := client(t, redisAddr(t))
	c.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		err := next(ctx, cmds)
		if lose.Swap(false) { // Redis ran the call; its reply is lost
			return context.DeadlineExceeded
		}
		return err
	}))
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}}, clk)
	// The script loaded first, so the reply dropped is the decision's, not
	// the "Function not found" of a server that has never run it.
	_, err := s.Peek(context.Background(), "k")
	require.NoError(t, err)
	lose.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // under FailRetryAfter (1 s), with room for a loaded machine
	defer cancel()
	_, err = s.Wait(ctx, "k", 4)
	require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
	pk, err := s.Peek(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(6), pk.Remaining, "Redis took the cost of the call whose reply was lost")
}

// countingAlarm is a Manual clock that counts the alarms Wait sets, and
// after limit of them sets none that ever rings, so that a Wait that would
// spin parks instead and the test can count.
type countingAlarm struct {
	*clock.Manual
	limit int64
	set   atomic.Int64
}

func (c *countingAlarm) At(t int64) (<-chan struct{}, func()) {
	if c.set.Add(1) > c.limit {
		return make(chan struct{}), func() {}
	}
	return c.Manual.At(t)
}

// TestWaitPastTheClocksEnd: a wait that ends past math.MaxInt64, the last
// reading Config.Clock has, never ends: Wait with no deadline waits for
// its context or Close, with no alarm, rather than waking at math.MaxInt64
// and asking Redis again and again; one with a deadline returns
// engine.ErrWouldExceedDeadline at once.
func TestWaitPastTheClocksEnd(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 2, Refill: policy.Rate{Tokens: 1, Per: math.MaxInt64}}
	clk := &countingAlarm{Manual: clock.NewManual(0), limit: 10}
	s := newStore(t, redisstore.Config{Policy: p}, clk)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := s.Allow(ctx, "k", 2)
	require.NoError(t, err)
	got := make(chan waitResult, 1)
	go func() {
		d, err := s.Wait(ctx, "k", 2) // 2*MaxInt64 ns from 0
		got <- waitResult{d, err}
	}()
	spinUntil(t, "Wait parks on the clock", func() bool { return clk.Waiting() > 0 })
	clk.Set(math.MaxInt64) // the key holds one token, and never more
	spinUntil(t, "Wait asks again at the clock's end", func() bool { return s.Stats().Denied >= 2 })
	cancel()
	require.ErrorIs(t, (<-got).err, context.Canceled)
	require.Equal(t, int64(1), clk.set.Load(), "Wait set an alarm at the clock's end and woke to ask again")

	s = newStore(t, redisstore.Config{Policy: p}, clk)
	dl, cancelDl := context.WithTimeout(context.Background(), time.Hour)
	defer cancelDl()
	_, err = s.Wait(dl, "k2", 2) // a fresh key at MaxInt64, full
	require.NoError(t, err)
	_, err = s.Wait(dl, "k2", 1)
	require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
	// A deadline as far as time.Until reaches (it saturates) is still
	// before an instant that never comes.
	far, cancelFar := context.WithDeadline(context.Background(), time.Unix(1<<62, 0))
	defer cancelFar()
	_, err = s.Wait(far, "k2", 1)
	require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
}

// TestWaitPastTheClocksEndDegraded: when the failure rule's RetryAfter
// ends past the clock's last reading, a Wait with a deadline returns at
// once an error wrapping ErrWouldExceedDeadline and ErrUnavailable, as
// every wait of the failure rule that the deadline cuts short does: the
// outage is told apart from the key's limit there too.
func TestWaitPastTheClocksEndDegraded(t *testing.T) {
	srv := downServer(t)
	clk := clock.NewManual(math.MaxInt64 - int64(time.Millisecond))
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Timeout: 2 * time.Second, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	_, err = s.Wait(ctx, "k", 1) // denied by the rule, retry after FailRetryAfter (1 s)
	require.ErrorIs(t, err, engine.ErrWouldExceedDeadline)
	require.ErrorIs(t, err, redisstore.ErrUnavailable)
}
