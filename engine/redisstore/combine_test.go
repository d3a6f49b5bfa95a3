package redisstore_test

import (
	"context"
	"errors"
	"runtime"
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

// scriptCalls is how many script calls (EVALSHA, EVAL, FCALL) the server
// has run, from INFO commandstats.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	n := int64(0)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(t, err, line)
		n += v
	}
	return n
}

// TestCombinedAllowsExact: 32 goroutines of single Allows on 4 keys, at a
// rate too slow to refill meanwhile, on a private server: each key admits
// exactly its capacity, every call is answered by Redis (Stats counts each
// once, by its outcome), and the calls were merged: fewer script calls than requests.
func TestCombinedAllowsExact(t *testing.T) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	const capacity, goroutines, per = 100, 32, 40
	keys := []string{"a", "b", "c", "d"}
	s := realStores(t, srv.Addr(), 1, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1},
		Timeout: 20 * time.Second,
	})[0]
	before := scriptCalls(t, c)
	var admitted [4]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*per)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				k := (g + i) % len(keys)
				d, err := s.Allow(context.Background(), keys[k], 1)
				if err != nil {
					errs <- err
					continue
				}
				if d.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	calls := scriptCalls(t, c) - before
	st := s.Stats()
	t.Logf("%d single Allows in %d script calls; stats %+v", goroutines*per, calls, st)
	for k := range keys {
		// 320 requests a key, one token a second: at most a few refilled
		require.InDelta(t, capacity, admitted[k].Load(), 5, "key %s", keys[k])
	}
	require.EqualValues(t, goroutines*per, st.Decisions)
	require.Zero(t, st.Failures)
	var sum int64
	for k := range admitted {
		sum += admitted[k].Load()
	}
	require.EqualValues(t, sum, st.Allowed, "each merged decision counted once, by outcome")
	require.EqualValues(t, goroutines*per-sum, st.Denied)
	require.Less(t, calls, int64(goroutines*per*3/4), "concurrent single Allows were merged into fewer calls")
}

// TestCombinedAllowsKeepTheStoreTimeout: callers with no deadline of their
// own, arriving one after another behind calls Redis does not answer, each
// leave at the store's Timeout from their own start, with the fail-closed
// answer. A combined call runs until its latest caller's deadline, so the
// earlier callers in it leave by their own timers. A caller may return
// 400 ms late (a loaded machine's timers); one held to the end of the
// combined call (the first two callers send calls of their own, the other
// fourteen join one) would be up to about 650 ms late.
func TestCombinedAllowsKeepTheStoreTimeout(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	const timeout = 800 * time.Millisecond
	s, unpause := pausedStore(t, timeout)
	const n = 16
	var wg sync.WaitGroup
	var late, wrong atomic.Int64
	for i := range n {
		wg.Add(1)
		time.AfterFunc(time.Duration(i)*50*time.Millisecond, func() {
			defer wg.Done()
			start := time.Now()
			dec, err := s.Allow(context.Background(), "k", 1)
			if took := time.Since(start); took > timeout+400*time.Millisecond {
				late.Add(1)
				t.Errorf("caller %d returned after %s, with a %s timeout", i, took, timeout)
			}
			if err != nil || dec.Allowed || dec.RetryAfter != redisstore.DefaultFailRetryAfter {
				wrong.Add(1)
				t.Errorf("caller %d: %+v, %v; want the fail-closed answer", i, dec, err)
			}
		})
	}
	wg.Wait()
	require.Zero(t, late.Load())
	require.Zero(t, wrong.Load())
	st := s.Stats()
	require.EqualValues(t, n, st.Failures, "every caller answered by the rule, counted once")
	require.EqualValues(t, 1, st.Decisions)
	requireResumes(t, s, unpause)
}

// TestCombinedAllowsKeepTheirDeadlines: with Redis paused, concurrent
// single Allows with deadlines from 100 to 800 ms each return by their own
// deadline (the fail-closed answer), whether they send their own call or
// wait for one, canceled callers return context.Canceled, and Stats counts
// each fail-closed answer once. The calls they made end by the latest of
// those deadlines too, not when go-redis's ReadTimeout (3 s) gives up on
// a reply.
func TestCombinedAllowsKeepTheirDeadlines(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	s, unpause := pausedStore(t, 5*time.Second)
	const n = 24
	var wg sync.WaitGroup
	var late, wrong, canceled atomic.Int64
	var mu sync.Mutex
	var latest time.Time // the callers' latest deadline
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := time.Duration(100+700*i/n) * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), d)
			dl, _ := ctx.Deadline()
			mu.Lock()
			latest = later(latest, dl)
			mu.Unlock()
			defer cancel()
			if i%6 == 5 {
				time.AfterFunc(d/2, cancel)
			}
			start := time.Now()
			dec, err := s.Allow(ctx, "k", 1)
			took := time.Since(start)
			if took > d+400*time.Millisecond { // slack for a loaded machine's timers; one held to its call's end is up to 700 ms late
				late.Add(1)
				t.Errorf("caller %d with a %s deadline returned after %s", i, d, took)
			}
			switch {
			case i%6 == 5:
				if errors.Is(err, context.Canceled) {
					canceled.Add(1)
				} else if err != nil || dec.Allowed {
					wrong.Add(1)
				}
			case err != nil || dec.Allowed || dec.RetryAfter != redisstore.DefaultFailRetryAfter:
				wrong.Add(1)
				t.Errorf("caller %d: %+v, %v; want the fail-closed answer", i, dec, err)
			}
		}()
	}
	wg.Wait()
	require.Zero(t, late.Load())
	require.Zero(t, wrong.Load())
	// A second of slack: a call held to go-redis's ReadTimeout ends 3 s
	// after it was sent.
	pollUntil(t, max(0, time.Until(latest.Add(time.Second))),
		"no call on k in flight after its callers' latest deadline", func() bool {
			_, inFlight := redisstore.Queued(s, "k")
			return inFlight == 0
		})
	st := s.Stats()
	t.Logf("stats %+v; %d canceled callers got context.Canceled", st, canceled.Load())
	// Every caller not canceled got the fail-closed answer, counted once;
	// a canceled one gets its error (or, when it led the call, the rule).
	require.GreaterOrEqual(t, st.Failures, uint64(n-n/6))
	require.LessOrEqual(t, st.Failures, uint64(n))
	require.EqualValues(t, 1, st.Decisions)
	requireResumes(t, s, unpause)
}

// pausedStore is a store with the given Timeout on a private server, with
// key "k" decided once (its bucket and the script are in place), and then
// the server's writes paused until unpause (pauseWrites).
func pausedStore(t *testing.T, timeout time.Duration) (s *redisstore.Store, unpause func()) {
	srv := startPrivate(t)
	c := client(t, srv.Addr())
	needPauseWrite(t, c)
	s = realStores(t, srv.Addr(), 1, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1},
		Timeout: timeout,
	})[0]
	_, err := s.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	unpause, err = pauseWrites(t, c)
	require.NoError(t, err)
	return s, unpause
}

// requireResumes ends the pause of s's server and requires s to admit "k"
// again.
func requireResumes(t *testing.T, s *redisstore.Store, unpause func()) {
	unpause()
	require.Eventually(t, func() bool {
		d, err := s.Allow(context.Background(), "k", 1)
		return err == nil && d.Allowed
	}, 10*time.Second, 50*time.Millisecond)
}

// cancelCtx is a context whose Done closes when the test says: the
// combiner's waiter is canceled at the very point the test picks.
type cancelCtx struct {
	context.Context
	done chan struct{}
}

func (c *cancelCtx) Done() <-chan struct{} { return c.done }

func (c *cancelCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// TestCombinedCancelAfterSend: a single Allow merged into a call that has
// gone to Redis, whose context then ends, is answered by Redis, as an
// Allow in a call of its own is: Redis took its cost, and answering
// context.Canceled would tell its caller that nothing was spent.
func TestCombinedCancelAfterSend(t *testing.T) {
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}, Timeout: 5 * time.Second}, clock.NewManual(0))
	release := make(chan struct{})
	w := &cancelCtx{Context: context.Background(), done: make(chan struct{})}
	type answer struct {
		d   engine.Decision
		err error
	}
	answered := make(chan answer, 1)
	redisstore.SetCombineHook(s, func(point string) {
		switch point {
		case redisstore.HookAlone:
			<-release
		case redisstore.HookSent: // the call with w has returned; w is not answered yet
			select {
			case <-w.done:
			default:
				close(w.done)
				select { // time for a waiter that would give up to do so
				case a := <-answered:
					answered <- a
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	})
	ctx := context.Background()
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := s.Allow(ctx, "k", 1); errs <- err }()
	}
	for q, f := redisstore.Queued(s, "k"); q != 0 || f != 2; q, f = redisstore.Queued(s, "k") {
		runtime.Gosched() // polling the combiner until both calls are in flight
	}
	go func() { d, err := s.Allow(w, "k", 10); answered <- answer{d, err} }()
	for q, _ := redisstore.Queued(s, "k"); q != 1; q, _ = redisstore.Queued(s, "k") {
		runtime.Gosched()
	}
	close(release)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	a := <-answered
	redisstore.SetCombineHook(s, nil)
	require.NoError(t, a.err, "Redis answered it")
	require.True(t, a.d.Allowed)
	p, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(88), p.Remaining, "every cost taken was answered")
}

// TestCombinedCancelDuringFailedCall: a merged Allow canceled during a
// call that fails answers the context's error, counted once, as an error,
// as an Allow in a call of its own does: not also a failure-rule answer
// in Failures, nor a report to OnError.
func TestCombinedCancelDuringFailedCall(t *testing.T) {
	exactBalances(t) // counts what the combiner answers; with leases, Allow decides in the lease's shard first
	c := client(t, redisAddr(t))
	var failing atomic.Bool
	c.AddHook(failPipelines(&failing))
	var reports atomic.Int32
	s := newStore(t, redisstore.Config{Client: c, Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}, Timeout: 5 * time.Second,
		OnError: func(error) { reports.Add(1) }}, clock.NewManual(0))
	release := make(chan struct{})
	w := &cancelCtx{Context: context.Background(), done: make(chan struct{})}
	errs, alone := make(chan error, 2), make(chan error, 2)
	redisstore.SetCombineHook(s, func(point string) {
		switch point {
		case redisstore.HookAlone:
			<-release
		case redisstore.HookTaken: // the call with w, about to be sent: it alone fails
			alone <- <-errs
			alone <- <-errs
			close(w.done)
			failing.Store(true)
		}
	})
	ctx := context.Background()
	for range 2 {
		go func() { _, err := s.Allow(ctx, "k", 1); errs <- err }()
	}
	for q, f := redisstore.Queued(s, "k"); q != 0 || f != 2; q, f = redisstore.Queued(s, "k") {
		runtime.Gosched() // polling the combiner until both calls are in flight
	}
	answered := make(chan error, 1)
	go func() { _, err := s.Allow(w, "k", 10); answered <- err }()
	for q, _ := redisstore.Queued(s, "k"); q != 1; q, _ = redisstore.Queued(s, "k") {
		runtime.Gosched()
	}
	close(release)
	require.ErrorIs(t, <-answered, context.Canceled)
	require.NoError(t, <-alone)
	require.NoError(t, <-alone)
	redisstore.SetCombineHook(s, nil)
	st := s.Stats()
	require.Zero(t, st.Failures, "not answered by the failure rule")
	require.Equal(t, uint64(1), st.Errors.Sum(), "counted once, as an error")
	require.Zero(t, reports.Load())
}
