package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestClusterReplicaPromoted kills a master of a cluster whose masters each
// have a replica, under load on keys of every virtual shard: once its
// replica has taken its place, every virtual shard it held answers real
// decisions again within a few seconds (not after go-redis's periodic
// reload of its slot map, a minute later), and no key admits more than its
// credit across the failover (the capacity, plus the rate times the span
// of its calls), but for the admissions the replica had not received (see
// the heartbeat). The killed node is started again and rejoins as a
// replica, so the cluster is whole for the next run. A master that hangs
// (SIGSTOP: it accepts connections and answers nothing, so calls end at
// their deadlines rather than on a refused connection) is failed over the
// same way, and continued at the end.
func TestClusterReplicaPromoted(t *testing.T) {
	t.Run("killed", func(t *testing.T) { testPromoted(t, false) })
	t.Run("hung", func(t *testing.T) { testPromoted(t, true) })
}

func testPromoted(t *testing.T, hang bool) {
	const (
		capacity = 100
		rate     = 10 // tokens per second per key: a bucket takes 10 s to refill, longer than the failover
		perShard = 2  // keys per virtual shard
		workers  = 6
		resumeBy = 5 * time.Second // after the promotion
	)
	rc := redistest.GetReplicaCluster(t)
	// A slot map reload that asks a hung node first waits for ReadTimeout
	// (5 s by default) before it asks the next (see the package doc).
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), ContextTimeoutEnabled: true, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	p := prefix(t)
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p,
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate},
		Timeout: time.Second}) // the race detector is slow; a dead master refuses at once
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		cleanPrefix(cc, p)
	})

	// Where each key's bucket is, found in the cluster rather than computed,
	// so the test does not depend on how keys map to shards: every key
	// takes its whole capacity (its bucket then lives until it refills, 10
	// s), then each master is scanned for the buckets.
	cand := make([]string, 400)
	first := map[string]time.Time{} // each key's first call
	for i := range cand {
		cand[i] = fmt.Sprint("key", i)
		first[cand[i]] = time.Now()
		d, err := s.Allow(ctx, cand[i], capacity)
		require.NoError(t, err)
		require.True(t, d.Allowed, "a new key's capacity")
	}
	type place struct{ shard, master string } // shard: the bucket's hash tag
	at := map[string]place{}
	var atMu sync.Mutex // ForEachMaster calls each master at once
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, p+"*").Result()
		atMu.Lock()
		defer atMu.Unlock()
		for _, k := range keys {
			tag, name, ok := strings.Cut(strings.TrimPrefix(k, p+"{"), "}k:")
			if ok {
				at[name] = place{tag, m.Options().Addr}
			}
		}
		return err
	}))
	byShard := map[string][]string{}
	for _, k := range cand {
		pl, ok := at[k]
		require.True(t, ok, "no bucket found for %s", k)
		if len(byShard[pl.shard]) < perShard {
			byShard[pl.shard] = append(byShard[pl.shard], k)
		}
	}
	require.Len(t, byShard, redisstore.DefaultVirtualShards, "the candidates cover every virtual shard")
	var keys []string
	for _, ks := range byShard {
		require.Len(t, ks, perShard)
		keys = append(keys, ks...)
	}
	slices.Sort(keys)
	victim := at[keys[0]].master
	victimShards := map[string]bool{}
	for _, k := range keys {
		if at[k].master == victim {
			victimShards[at[k].shard] = true
		}
	}
	var replica string
	nodes := rc.Nodes(t)
	for _, m := range nodes {
		if m.Addr != victim {
			continue
		}
		for _, r := range nodes {
			if r.MasterID == m.ID {
				replica = r.Addr
			}
		}
	}
	require.NotEmpty(t, replica, "a replica of %s in %+v", victim, nodes)

	// The heartbeat: a key on the victim master, set every few milliseconds
	// to a number naming the instant the write was sent, until just before
	// the master fails. Replication is asynchronous: the replica promoted in
	// its place may lack the master's last writes, and give their tokens
	// again. It holds the last heartbeat it received, and with it every
	// admission whose answer the test had before that heartbeat was sent:
	// the master ran that admission first, and replicates its writes in
	// order. So a victim key may go over its credit by its admissions
	// answered after that instant (in calls made before the failure) and no
	// more.
	hbKey := p + "{" + at[keys[0]].shard + "}heartbeat"
	vc := client(t, victim)
	sent := map[int64]time.Time{} // each heartbeat's number, and its instant
	beat := func() error {
		now := time.Now()
		sent[now.UnixNano()] = now
		return vc.Set(ctx, hbKey, now.UnixNano(), 0).Err()
	}
	require.NoError(t, beat())
	n, err := vc.Wait(ctx, 1, 10*time.Second).Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(1), "the replica has the warm-up and the first heartbeat")
	hbStop, hbDone := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-hbStop:
				hbDone <- nil
				return
			case <-tick.C:
			}
			if err := beat(); err != nil {
				hbDone <- err
				return
			}
		}
	}()
	stopHeartbeat := sync.OnceValue(func() error {
		close(hbStop)
		return <-hbDone
	})
	t.Cleanup(func() { _ = stopHeartbeat() })

	// The load: every worker calls every key, in an order of its own, until
	// told to stop, and records each call in a slice of its own. Progress
	// the test waits on goes through atomics and back, under mu.
	type attempt struct {
		key        string
		start, end time.Time
		allowed    bool
		failure    bool // answered by the failure rule
	}
	index := map[string]int{}
	for i, k := range keys {
		index[k] = i
	}
	drained := make([]atomic.Bool, len(keys)) // a key denied for want of tokens
	var promotedAt atomic.Int64               // UnixNano, once promoted
	var mu sync.Mutex
	back := map[string]time.Time{} // a victim shard's first real answer to a call made after the promotion
	calls := make([][]attempt, workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		r := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			order := slices.Clone(keys)
			for {
				r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				for _, k := range order {
					select {
					case <-stop:
						return
					default:
					}
					c := attempt{key: k, start: time.Now()}
					d, err := s.Allow(ctx, k, 1)
					c.end = time.Now()
					if err != nil {
						t.Errorf("Allow(%s): %v", k, err)
						return
					}
					c.allowed = d.Allowed
					c.failure = d.Degraded
					calls[w] = append(calls[w], c)
					if c.failure {
						continue
					}
					if !c.allowed {
						drained[index[k]].Store(true)
					}
					if pro := promotedAt.Load(); pro != 0 && c.start.UnixNano() >= pro && victimShards[at[k].shard] {
						mu.Lock()
						if _, ok := back[at[k].shard]; !ok {
							back[at[k].shard] = c.end
						}
						mu.Unlock()
					}
				}
			}
		})
	}
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(halt) // a failed require below still stops the load

	// Every key denied for want of tokens before the kill (the warm-up took
	// its capacity): what it admits is its refill, so tokens a lost write
	// gave back would show above its bound.
	pollUntil(t, 20*time.Second, "every key drained", func() bool {
		for i := range drained {
			if !drained[i].Load() {
				return false
			}
		}
		return true
	})
	require.Zero(t, s.Stats().Failures, "failures before the kill")

	require.NoError(t, stopHeartbeat(), "the heartbeat, before the failure")
	killed := time.Now()
	if hang {
		rc.Hang(t, victim)
	} else {
		rc.Kill(t, victim)
	}
	failed := time.Now() // a call made after this was not answered by the victim
	promoted := waitPromoted(t, rc, replica)
	promotedAt.Store(promoted.UnixNano())
	hb, err := client(t, replica).Get(ctx, hbKey).Int64()
	require.NoError(t, err, "the heartbeat on the promoted replica")
	received, ok := sent[hb] // the heartbeat goroutine has ended: stopHeartbeat
	require.True(t, ok, "the promoted replica's heartbeat %d was never sent", hb)
	// Keep the load on until every shard of the dead master has answered a
	// call made after the promotion, or resumeBy has passed (the check
	// below says which), and half a second more.
	pollUntil(t, resumeBy+time.Second, "", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(back) == len(victimShards) || time.Since(promoted) > resumeBy
	})
	more := time.NewTimer(500 * time.Millisecond) // more load after the failover, not a wait for it
	<-more.C
	halt()

	mu.Lock()
	var worst time.Duration
	for sh := range victimShards {
		got, ok := back[sh]
		require.True(t, ok, "virtual shard %s of the killed master answered no real decision within %v of its replica's promotion", sh, resumeBy)
		require.LessOrEqual(t, got.Sub(promoted), resumeBy, "virtual shard %s of the killed master", sh)
		worst = max(worst, got.Sub(promoted))
	}
	mu.Unlock()

	// The credit bound, per key: the capacity plus the rate times the time
	// from the start of its first call (the warm-up's) to the end of its
	// last, and a token for the fraction; for a victim key, plus its
	// admissions the replica may not have received (see the heartbeat). The
	// time is the longer of the monotonic clock's span and the wall
	// clock's: the script refills at the server's TIME, on loopback this
	// machine's wall clock, which may step forward (see the package doc); a
	// step back refills nothing, and a bucket keeps what it had.
	type tally struct {
		admitted, failures, unreplicated int64
		last                             time.Time
		lastFailure                      time.Time
	}
	per := map[string]*tally{}
	for _, k := range keys {
		per[k] = &tally{admitted: capacity} // the warm-up call
	}
	for _, cs := range calls {
		for _, c := range cs {
			tl := per[c.key]
			if c.allowed {
				tl.admitted++
				if c.end.After(received) && c.start.Before(failed) && !c.failure {
					tl.unreplicated++
				}
			}
			if c.failure {
				tl.failures++
				tl.lastFailure = later(tl.lastFailure, c.end)
			}
			tl.last = later(tl.last, c.end)
		}
	}
	var over, failures int64
	closest := int64(math.MinInt64) // the most a victim key admitted against its bound
	var lastFailure time.Time
	for _, k := range keys {
		tl := per[k]
		span := max(tl.last.Sub(first[k]), tl.last.Round(0).Sub(first[k].Round(0)))
		bound := capacity + int64(rate*span.Seconds()) + 1
		if at[k].master != victim {
			require.Zero(t, tl.failures, "%s, on a master that stayed, answered by the failure rule", k)
			require.LessOrEqual(t, tl.admitted, bound, "%s admitted over its credit", k)
			continue
		}
		failures += tl.failures
		lastFailure = later(lastFailure, tl.lastFailure)
		require.LessOrEqual(t, tl.admitted, bound+tl.unreplicated,
			"%s admitted over its credit, by more than the writes the replica had not received (%v before the failure)", k, killed.Sub(received))
		over += max(0, tl.admitted-bound)
		closest = max(closest, tl.admitted-bound)
	}
	t.Logf("failed %s (hung: %v): its replica %s, which had its writes up to %v before the failure, promoted %v later; its %d virtual shards decided again at most %v after the promotion; "+
		"%d calls on them answered by the failure rule, the last %v after the promotion; %d tokens over the credit bound across its keys (the closest key admitted %+d against its bound)",
		victim, hang, replica, killed.Sub(received).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond), len(victimShards), worst.Round(time.Millisecond),
		failures, lastFailure.Sub(promoted).Round(time.Millisecond), over, closest)

	// Whole again for the next run: the killed node rejoins, as a replica
	// of the one promoted in its place.
	if hang {
		rc.Resume(t, victim)
	} else {
		rc.Restart(t, victim)
	}
	rc.WaitHealthy(t)
	role, err := rc.Role(victim)
	require.NoError(t, err)
	require.Equal(t, "slave", role, "the failed master, back")
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitPromoted waits up to 20 s for replica to be a master, and returns
// when it saw it so.
func waitPromoted(t *testing.T, rc *redistest.ReplicaCluster, replica string) time.Time {
	t.Helper()
	var promoted time.Time
	pollUntil(t, 20*time.Second, "the replica "+replica+" promoted", func() bool {
		role, err := rc.Role(replica)
		if err == nil && role == "master" {
			promoted = time.Now()
			return true
		}
		return false
	})
	return promoted
}

// pollUntil polls cond every 10 ms until it holds, failing the test with
// what if it does not within d (an empty what: it returns instead).
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			if what != "" {
				t.Fatalf("not within %v: %s", d, what)
			}
			return
		}
		<-tick.C
	}
}

// TestStartWhileGlobalMasterDown: a store started while the master that
// holds its prefix's global keys is dead (a process restarted during the
// outage) answers by the failure rule until it can read them, and once
// the master's replica has taken its place it reads them from there and
// decides again within a few seconds, as a running store does, not after
// go-redis's periodic reload of its slot map a minute later: its attempts
// to reach Redis go where the slot map says, and only a reload it asks for
// moves the dead master's slots to the replica.
func TestStartWhileGlobalMasterDown(t *testing.T) {
	const resumeBy = 5 * time.Second // after the promotion
	rc := redistest.GetReplicaCluster(t)
	ctx := context.Background()
	p := prefix(t)
	pol := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	setup := clusterClient(t, rc.Addrs())
	s0, err := redisstore.New(ctx, redisstore.Config{Client: setup, Prefix: p, Policy: pol})
	require.NoError(t, err) // the prefix is set up before the outage
	require.NoError(t, s0.Close())
	t.Cleanup(func() { cleanPrefix(setup, p) })
	m, err := setup.MasterForKey(ctx, redisstore.GlobalKey(p, "policy"))
	require.NoError(t, err)
	victim := m.Options().Addr
	var replica string
	nodes := rc.Nodes(t)
	for _, n := range nodes {
		for _, r := range nodes {
			if n.Addr == victim && r.MasterID == n.ID {
				replica = r.Addr
			}
		}
	}
	require.NotEmpty(t, replica, "a replica of %s in %+v", victim, nodes)

	// The process's client has its slot map from before the kill.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), ContextTimeoutEnabled: true, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }))
	rc.Kill(t, victim)
	t.Cleanup(func() {
		rc.Restart(t, victim) // rejoins as a replica, for the next run
		rc.WaitHealthy(t)
	})
	var log errorLog
	s, err := redisstore.New(ctx, redisstore.Config{Client: cc, Prefix: p, Policy: pol, Timeout: time.Second, OnError: log.add})
	require.NoError(t, err, "New with the global keys' master dead starts the store without it")
	t.Cleanup(func() { _ = s.Close() })
	require.NotEmpty(t, log.all(), "OnError hears why the store started without Redis")
	d, err := s.Allow(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Degraded, "the global keys cannot be read: the failure rule answers")

	promoted := waitPromoted(t, rc, replica)
	pollUntil(t, resumeBy, "", func() bool {
		d, err = s.Allow(ctx, "k", 1)
		require.NoError(t, err)
		return !d.Degraded
	})
	require.False(t, d.Degraded, "%v after the promotion of %s in place of %s, the store started during the outage still cannot read its prefix (slot map never reloaded?); OnError last heard: %v",
		time.Since(promoted).Round(time.Millisecond), replica, victim, log.all()[len(log.all())-1])
	t.Logf("decided by Redis %v after the promotion", time.Since(promoted).Round(time.Millisecond))
	require.True(t, d.Allowed)
	require.Equal(t, int64(1), d.Version)
}
