package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestSentinelFailover runs the store behind Redis Sentinel, through
// redis.NewFailoverClient, across a failover (SENTINEL FAILOVER) under
// load: every call is answered with a nil error (those on the connections
// the switch closes by the failure rule, marked Degraded); a key drained
// before, and replicated, stays drained on the new primary; and decisions
// come from the new primary within a few seconds of the switch.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // waits on a failover; on servers of its own
	const capacity = 5
	rs := redistest.StartSentinel(t)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster,
		SentinelAddrs: []string{rs.Addr()}, ContextTimeoutEnabled: true, DialerRetries: 1,
		ReadTimeout: time.Second, DialTimeout: time.Second}) // a hung sentinel costs a call no more (see the package doc)
	t.Cleanup(func() { _ = fc.Close() })
	ctx := context.Background()
	cfg := redisstore.Config{Client: fc, Prefix: prefix(t), Timeout: slowMachine,
		Policy: policy.Policy{Version: 1, Capacity: capacity, Refill: policy.PerHour(1)}}
	if leaseMode {
		cfg.Leases = &redisstore.Leases{}
	}
	s, err := redisstore.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	d, err := s.Allow(ctx, "drained", capacity)
	require.NoError(t, err)
	require.True(t, d.Allowed && !d.Degraded, "%+v", d)
	require.Equal(t, int64(1), fc.Do(ctx, "WAIT", 1, 10_000).Val(), "the replica holds the drained bucket")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // before the store's Close, after a failure's stop
	halt := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(halt)
	for w := range 2 { // calls in flight at the switch
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.Allow(ctx, fmt.Sprint("busy", w, i%4), 1)
				if !assert.NoError(t, err, "a failover is answered by the failure rule, never an error") {
					return
				}
			}
		})
	}
	from, to := rs.Failover(t)
	switched := time.Now()
	onNew := client(t, to)
	for i := 0; ; i++ { // a fresh key each time: a decision the old primary took is lost
		key := fmt.Sprint("probe", i)
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err)
		n, err := onNew.Exists(ctx, redisstore.BucketKey(cfg.Prefix, key)).Result()
		require.NoError(t, err)
		if !d.Degraded && n == 1 {
			require.True(t, d.Allowed, "a new key's first token")
			break
		}
		require.Less(t, time.Since(switched), 10*time.Second, "no decision from the new primary %s", to)
	}
	t.Logf("failed over from %s to %s; decided on the new primary %v after the switch", from, to, time.Since(switched))
	halt()
	wg.Wait()
	d, err = s.Allow(ctx, "drained", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed || d.Degraded, "the key drained before the failover, %+v", d)
}

// TestSentinelFailoverCosts measures, when TOKENSHARD_SOAK is set, what a
// failover behind Sentinel (a primary, two replicas, three sentinels, a
// primary down after 1 s) costs the store under load (four callers on 40
// keys of capacity 20 and 10 tokens a second): how long the failure rule
// answers, and how many tokens a busy key admits over its credit (the
// capacity plus the rate times the span of its calls). It logs the
// figures the package doc and the README give, and checks what holds
// whatever the timing: no error, and no token over the credit where every
// replica acknowledges each decision (WaitForReplicas).
func TestSentinelFailoverCosts(t *testing.T) {
	if os.Getenv("TOKENSHARD_SOAK") == "" {
		t.Skip("a measurement of about a minute: set TOKENSHARD_SOAK (a Go duration, as TestSharedLoadCreditBound reads it: 10s) to run it")
	}
	run := func(name string, short, waitAll bool, fail func(t *testing.T, rs *redistest.Sentinel) (to string)) {
		t.Run(name, func(t *testing.T) {
			rs := redistest.StartSentinels(t, 2, 3)
			opt := &redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: rs.Addrs(),
				ContextTimeoutEnabled: true, DialerRetries: 1}
			if short {
				opt.ReadTimeout, opt.WriteTimeout, opt.DialTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
			}
			fc := redis.NewFailoverClient(opt)
			t.Cleanup(func() { _ = fc.Close() })
			if waitAll {
				require.NoError(t, redisstore.WaitForReplicas(fc, 2, 200*time.Millisecond))
			}
			l := startLoad(t, fc)
			time.Sleep(time.Second) // a load in its stride before the failover
			failed := time.Now()
			to := fail(t, rs)
			switched := time.Since(failed)
			back := l.backOn(t, to, 30*time.Second)
			over, worst := l.stop(t)
			t.Logf("switch after %v; decisions on %s after %v; %d answers by the failure rule; keys over their credit %d of 40, by up to %d tokens",
				switched.Round(10*time.Millisecond), to, back.Round(10*time.Millisecond), l.degraded, over, worst)
			if waitAll {
				require.Zero(t, over, "every replica held each decision")
			}
		})
	}
	graceful := func(t *testing.T, rs *redistest.Sentinel) string { _, to := rs.Failover(t); return to }
	killed := func(hang bool) func(t *testing.T, rs *redistest.Sentinel) string {
		return func(t *testing.T, rs *redistest.Sentinel) string {
			from := rs.Primary()
			if hang { // the sentinel the client listens to, found by its subscription
				for _, sn := range rs.Sentinels() {
					if out, _ := client(t, sn.Addr()).ClientList(context.Background()).Result(); strings.Contains(out, "sub=2") {
						sn.Hang(t)
					}
				}
			}
			rs.Node(from).Kill()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if to := rs.Primary(); to != from && to != "" {
					return to
				}
				require.True(t, time.Now().Before(deadline), "no failover of %s", from)
			}
		}
	}
	run("SENTINEL FAILOVER", false, false, graceful)
	run("SENTINEL FAILOVER, WaitForReplicas(2)", false, true, graceful)
	run("kill -9", false, false, killed(false))
	run("kill -9, the client's sentinel hung", false, false, killed(true))
	run("kill -9, the client's sentinel hung, 100 ms timeouts", true, false, killed(true))
}

// load is four callers' Allows on 40 keys of one store, with what each key
// admitted and when it was first and last called.
type load struct {
	s        *redisstore.Store
	prefix   string
	halt     func()
	wg       sync.WaitGroup
	mu       sync.Mutex
	keys     map[string]*tally
	degraded int // answers by the failure rule
}

type tally struct {
	admitted    int64
	first, last time.Time
}

const (
	loadCapacity = 20
	loadRate     = 10 // tokens a second
)

func startLoad(t *testing.T, c redis.UniversalClient) *load {
	p := prefix(t)
	s, err := redisstore.New(context.Background(), redisstore.Config{Client: c, Prefix: p,
		Policy: policy.Policy{Version: 1, Capacity: loadCapacity, TokensPerSecond: loadRate}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, redisstore.Up(s))
	stop := make(chan struct{})
	l := &load{s: s, prefix: p, halt: sync.OnceFunc(func() { close(stop) }), keys: map[string]*tally{}}
	t.Cleanup(l.wg.Wait)
	t.Cleanup(l.halt)
	for w := range 4 {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key, t0 := fmt.Sprint("k", (i*7+w*13)%40), time.Now()
				d, err := s.Allow(context.Background(), key, 1)
				if !assert.NoError(t, err, "a failover is answered by the failure rule, never an error") {
					return
				}
				l.mu.Lock()
				k := l.keys[key]
				if k == nil {
					k = &tally{first: t0}
					l.keys[key] = k
				}
				k.last = time.Now()
				if d.Degraded {
					l.degraded++
				} else if d.Allowed {
					k.admitted++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// backOn waits until a decision on a fresh key is not degraded and its
// bucket is on the primary at addr, and returns how long that took.
func (l *load) backOn(t *testing.T, addr string, within time.Duration) time.Duration {
	start, on := time.Now(), client(t, addr)
	for i := 0; ; i++ {
		key := fmt.Sprint("probe", i)
		d, err := l.s.Allow(context.Background(), key, 1)
		require.NoError(t, err)
		if n, _ := on.Exists(context.Background(), redisstore.BucketKey(l.prefix, key)).Result(); !d.Degraded && n == 1 {
			return time.Since(start)
		}
		require.Less(t, time.Since(start), within, "no decision on the new primary %s", addr)
	}
}

// stop ends the load a second after backOn and returns how many keys
// admitted over their credit, and the most one did.
func (l *load) stop(t *testing.T) (over int, worst int64) {
	time.Sleep(time.Second)
	l.halt()
	l.wg.Wait()
	for _, k := range l.keys {
		credit := loadCapacity + int64(k.last.Sub(k.first).Seconds()*loadRate) + 1
		if k.admitted > credit {
			over, worst = over+1, max(worst, k.admitted-credit)
		}
	}
	return over, worst
}
