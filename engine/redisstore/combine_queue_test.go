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
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// giveUpCtx is a context whose deadline the test makes pass, at the
// instant it chooses (closing done), rather than the clock's.
type giveUpCtx struct {
	context.Context
	dl   time.Time
	done chan struct{}
}

func newGiveUpCtx(in time.Duration) *giveUpCtx {
	return &giveUpCtx{Context: context.Background(), dl: time.Now().Add(in), done: make(chan struct{})}
}

func (c *giveUpCtx) Deadline() (time.Time, bool) { return c.dl, true }
func (c *giveUpCtx) Done() <-chan struct{}       { return c.done }
func (c *giveUpCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// combinedGiveUp runs four single Allows of one token on one key of a
// store whose combiner it drives through hooks: two that find the queue
// free, held at their start until two more have queued behind them, w1
// and w2, which a drainer sends in one call, w2's deadline made to pass at
// the hook point giveUpAt of that call, after which the call goes on. It returns w1's and w2's answers, the
// store's Stats, the key's balance and how often OnError was called.
func combinedGiveUp(t *testing.T, giveUpAt string) (d1, d2 engine.Decision, st redisstore.Stats, remaining int64, onErrors int64) {
	t.Helper()
	// The decide script is loaded when a call first misses it: on a fresh
	// server, at the cost of a retry. Another store pays it here, so that
	// the Stats compared are of the calls this helper drives alone.
	_, err := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}}, clock.NewManual(0)).Allow(context.Background(), "warm", 1)
	require.NoError(t, err)
	var errs atomic.Int64
	const capacity = 100
	s := newStore(t, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1},
		Timeout: 5 * time.Second,
		OnError: func(error) { errs.Add(1) },
	}, clock.NewManual(0))
	// Where the server has no FUNCTION (Redis 6), a store's first decide
	// call is refused as FCALL and sent again by EVALSHA: s pays that here,
	// on another key, and the Stats returned leave this Peek out.
	_, err = s.Peek(context.Background(), "warm")
	require.NoError(t, err)
	warm := s.Stats()
	release := make(chan struct{})
	w2ctx := newGiveUpCtx(4 * time.Second)
	w2done := make(chan struct{})
	var once sync.Once
	redisstore.SetCombineHook(s, func(point string) {
		switch point {
		case redisstore.HookAlone:
			<-release
		case giveUpAt:
			once.Do(func() {
				close(w2ctx.done)
				<-w2done // w2 has given up and answered itself
			})
		}
	})
	ctx := context.Background()
	var wg sync.WaitGroup
	allow := func(ctx context.Context, into *engine.Decision) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := s.Allow(ctx, "k", 1)
			if err != nil {
				t.Errorf("Allow: %v", err)
			}
			if into != nil {
				*into = d
			}
		}()
	}
	waitFor := func(queued, inFlight int) {
		require.Eventually(t, func() bool {
			q, f := redisstore.Queued(s, "k")
			return q == queued && f == inFlight
		}, 5*time.Second, time.Millisecond)
	}
	allow(ctx, nil)
	allow(ctx, nil)
	waitFor(0, 2)
	w1ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	allow(w1ctx, &d1)
	waitFor(1, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(w2done)
		var err error
		d2, err = s.Allow(w2ctx, "k", 1)
		if err != nil {
			t.Errorf("Allow: %v", err)
		}
	}()
	waitFor(2, 2)
	close(release)
	wg.Wait()
	redisstore.SetCombineHook(s, nil)
	p, err := s.Peek(ctx, "k")
	require.NoError(t, err)
	st = s.Stats()
	st.Peeks, st.Retries = st.Peeks-warm.Peeks, st.Retries-warm.Retries
	return d1, d2, st, capacity - p.Remaining, errs.Load()
}

// TestCombinedGiveUpBeforeSend: a caller whose deadline passes after its
// request was taken by a drainer but before the drainer sends it is not
// sent: it gets the failure rule, counted once, and Redis takes none of
// its tokens; the others are decided by Redis and counted once each.
func TestCombinedGiveUpBeforeSend(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a fresh prefix of the shared server
	d1, d2, st, taken, onErrors := combinedGiveUp(t, redisstore.HookTaken)
	require.True(t, d1.Allowed, "w1: %+v", d1)
	require.False(t, d2.Allowed, "w2: %+v", d2)
	require.Equal(t, redisstore.DefaultFailRetryAfter, d2.RetryAfter, "w2 gets the fail-closed answer")
	require.True(t, d2.Degraded, "w2: %+v", d2)
	require.False(t, d1.Degraded, "w1: %+v", d1)
	require.Equal(t, redisstore.Stats{Allowed: 3, Decisions: 3, Failures: 1, DegradedDenied: 1, Peeks: 1}, st, "and the helper's Peek")
	require.EqualValues(t, 3, taken, "w2's request was not sent: 3 tokens taken, not 4")
	require.EqualValues(t, 1, onErrors)
}

// TestCombinedGiveUpDuringCall: a caller whose deadline passes while its
// request's call is out (here: after Redis answered, before the drainer
// takes the answers) is answered and counted by itself alone, by the
// failure rule: Redis's decision is neither counted nor delivered, and
// OnError is called once. (Its tokens are taken, as for any lost reply.)
func TestCombinedGiveUpDuringCall(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a fresh prefix of the shared server
	d1, d2, st, taken, onErrors := combinedGiveUp(t, redisstore.HookSent)
	require.True(t, d1.Allowed, "w1: %+v", d1)
	require.False(t, d2.Allowed, "w2: %+v", d2)
	require.Equal(t, redisstore.DefaultFailRetryAfter, d2.RetryAfter, "w2 gets the fail-closed answer")
	require.True(t, d2.Degraded, "w2: %+v", d2)
	require.Equal(t, redisstore.Stats{Allowed: 3, Decisions: 3, Failures: 1, DegradedDenied: 1, Peeks: 1}, st, "every request counted once (and the helper's Peek)")
	require.EqualValues(t, 4, taken, "w2 was sent: Redis took its token")
	require.EqualValues(t, 1, onErrors)
}

// TestCombinedAllowsStress: many goroutines of single Allows with deadlines
// short enough that some pass during calls, on a store without refill:
// every call is counted once, as a decision or a failure, and the tokens
// Redis took cover every admission its callers were told of.
func TestCombinedAllowsStress(t *testing.T) {
	exactBalances(t)
	const capacity, goroutines, per = 1 << 40, 16, 60
	s := newStore(t, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 1},
		Timeout: 5 * time.Second,
	}, clock.NewManual(0))
	keys := []string{"a", "b"}
	var admitted [2]atomic.Int64
	var calls atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				k := (g + i) % len(keys)
				// 0.5 to 5 ms: about the length of a call under -race
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(500+(g*per+i)*37%4500)*time.Microsecond)
				d, err := s.Allow(ctx, keys[k], int64(1+i%3))
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					continue // done before the call started: no call
				}
				if err != nil {
					t.Errorf("Allow: %v", err)
					continue
				}
				calls.Add(1)
				if d.Allowed {
					admitted[k].Add(int64(1 + i%3))
				}
			}
		}()
	}
	wg.Wait()
	st := s.Stats()
	t.Logf("stats %+v for %d calls", st, calls.Load())
	require.EqualValues(t, calls.Load(), st.Decisions+st.Failures)
	for k, key := range keys {
		p, err := s.Peek(context.Background(), key)
		require.NoError(t, err)
		require.LessOrEqual(t, admitted[k].Load(), capacity-p.Remaining, "key %s: admissions beyond the tokens taken", key)
	}
}

// holdHook holds every script call to one node, once armed, until release
// is closed or the call's context ends, and then fails it as a reply that
// came too late: a master that is slow (or a host that hangs) rather than
// one that refuses connections. ended counts the calls it let go.
type holdHook struct {
	armed   *atomic.Bool
	release chan struct{}
	ended   *atomic.Int64
}

// errLate is a held call's error once released.
var errLate = errors.New("the slow master answered past the deadline")

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		return true
	}
	return false
}

func (h holdHook) wait(ctx context.Context) error {
	if !h.armed.Load() {
		return nil
	}
	defer h.ended.Add(1)
	select {
	case <-h.release:
		return errLate
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			if err := h.wait(ctx); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) {
				if err := h.wait(ctx); err != nil {
					for _, c := range cmds {
						c.SetErr(err)
					}
					return err
				}
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestClusterSlowMasterDelaysOnlyItsShards: on a cluster whose one master
// holds every script call (until the test lets them go, and fails them as
// answered too late), single Allows on that master's keys fill their shards' places
// in flight and queue behind them, and meanwhile concurrent single Allows
// of keys on the other masters are all decided by Redis: each virtual
// shard combines its own calls. It checks an order, not a duration: every
// one of those Allows is answered before any call to the slow master ends.
// One that waits for the slow master (one combiner for the whole store: 0
// of 32 decided) waits past its Timeout (5 s, as newStore's), while a busy
// machine only makes the healthy calls slower. Let go, the slow master's
// Allows all get the failure rule's fail-closed answer.
func TestClusterSlowMasterDelaysOnlyItsShards(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	plain := clusterClient(t, addrs)
	owner := slotOwners(t, plain)
	slow := addrs[0] // a master
	var armed atomic.Bool
	var ended atomic.Int64
	release := make(chan struct{})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		NewClient: func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			if opt.Addr == slow {
				c.AddHook(holdHook{armed: &armed, release: release, ended: &ended})
			}
			return c
		}})
	t.Cleanup(func() { _ = cc.Close() })
	p := prefix(t)
	s := newStore(t, redisstore.Config{Client: cc, Prefix: p, Timeout: 5 * time.Second,
		Policy: policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}}, nil)
	var slowKeys, fastKeys []string
	for i := 0; len(slowKeys) < 4 || len(fastKeys) < 32; i++ {
		k := fmt.Sprint("key", i)
		if owner(redisstore.BucketKey(p, k)) == slow {
			slowKeys = append(slowKeys, k)
		} else {
			fastKeys = append(fastKeys, k)
		}
	}
	// Load the FUNCTION on every master before the hold.
	for _, k := range append(slowKeys[:1:1], fastKeys...) {
		d, err := s.Allow(context.Background(), k, 1)
		require.NoError(t, err)
		require.True(t, d.Allowed, "%+v", d)
	}
	armed.Store(true)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var slowAnswers atomic.Int64
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := s.Allow(context.Background(), slowKeys[g%2], 1)
				slowAnswers.Add(1)
				if err != nil || d.Allowed || !d.Degraded {
					t.Errorf("a key of the slow master: %+v, %v; want the fail-closed answer", d, err)
				}
			}
		}()
	}
	// Let the held calls go (they fail), and any later one at once, and
	// wait for the callers: also when the test fails before.
	letGo := sync.OnceFunc(func() {
		close(stop)
		close(release)
		wg.Wait()
	})
	t.Cleanup(letGo)
	require.Eventually(t, func() bool {
		q0, f0 := redisstore.Queued(s, slowKeys[0])
		q1, f1 := redisstore.Queued(s, slowKeys[1])
		return f0 == 2 && f1 == 2 && q0 > 0 && q1 > 0
	}, 5*time.Second, time.Millisecond, "the slow master's places in flight taken, and callers queued behind them")
	for round := range 3 {
		var decided atomic.Int64
		var fwg sync.WaitGroup
		for _, k := range fastKeys {
			fwg.Add(1)
			go func() {
				defer fwg.Done()
				d, err := s.Allow(context.Background(), k, 1)
				if err == nil && d.Allowed && !d.Degraded {
					decided.Add(1)
				}
			}()
		}
		fwg.Wait()
		require.EqualValues(t, len(fastKeys), decided.Load(), "round %d: Allows on healthy masters decided", round)
		require.Zero(t, ended.Load(), "round %d: a call to the slow master ended before the Allows on healthy masters were answered", round)
	}
	letGo()
	armed.Store(false)
	require.NotZero(t, slowAnswers.Load())
	require.Equal(t, slowAnswers.Load(), int64(s.Stats().Failures), "the slow master's Allows, and they alone, got the failure rule")
}

// TestCombinedOnErrorRunsInACaller: with the server gone, the calls of
// single Allows fail, and OnError, called once per failed call, runs on a
// caller's goroutine, where a panic of it can be recovered, also for a
// combined call, sent by a drainer. However the calls end, their places in
// flight are handed on: none is left taken.
func TestCombinedOnErrorRunsInACaller(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	var calls, recovered atomic.Int64
	s := realStores(t, srv.Addr(), 1, redisstore.Config{
		Policy:  policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1},
		Timeout: 5 * time.Second,
		OnError: func(error) {
			calls.Add(1)
			panic("OnError")
		},
	})[0]
	_, err := s.Allow(context.Background(), "k", 1)
	require.NoError(t, err)
	srv.Kill()
	release := make(chan struct{})
	redisstore.SetCombineHook(s, func(point string) {
		if point == redisstore.HookAlone {
			<-release
		}
	})
	var wg sync.WaitGroup
	allow := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if recover() != nil {
					recovered.Add(1)
				}
			}()
			_, _ = s.Allow(context.Background(), "k", 1)
		}()
	}
	waitFor := func(queued, inFlight int) {
		require.Eventually(t, func() bool {
			q, f := redisstore.Queued(s, "k")
			return q == queued && f == inFlight
		}, 5*time.Second, time.Millisecond)
	}
	allow()
	allow()
	waitFor(0, 2)
	allow()
	allow()
	waitFor(2, 2)
	close(release)
	wg.Wait()
	redisstore.SetCombineHook(s, nil)
	require.GreaterOrEqual(t, calls.Load(), int64(3), "the two alone calls and the combined one failed")
	require.Equal(t, calls.Load(), recovered.Load(), "every OnError panicked in a caller's goroutine")
	// A drainer gives its place up after its callers have their answers
	// (it yields to them first): no place in flight is left taken.
	waitFor(0, 0)
}
