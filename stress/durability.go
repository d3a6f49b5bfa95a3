package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The durability check (-check durability) measures what a crash or a
// failover of Redis can mint: tokens a bucket holds after the event beyond
// what it would hold had every acknowledged admission survived. It starts
// its own redis-server processes (on -durability-port, and on the six
// ports from -durability-cluster-port, their cluster buses on the six from
// 10 above -durability-port; -durability-lag's proxy on the seventh) and
// is a measurement, not a check of an invariant the store can keep: it
// fails only when the store gives a wrong answer the event cannot explain,
// or when a setting that should lose nothing loses something (see
// durSetting.lossless).
//
// Every store decides at a clock.Manual that never moves, so no bucket
// refills: after the event, key k must hold capacity - A(k) tokens, where
// A(k) counts the admissions the store acknowledged for it, and holds R(k)
// (Peek). Minted is the sum over keys of R(k) - (capacity - A(k)) where
// positive; the sum where negative is admissions whose reply was lost with
// the server, which took tokens nobody was told of (not minted).
//
//  1. Crash: one server; -workers goroutines drain -durability-keys keys of
//     capacity 100 to 0 by single Allows of one token (their rate is the
//     setting's throughput), kill -9 the server at once, restart it on the
//     same data directory, read the buckets. Three settings: RDB snapshots
//     with Redis's default save points and no AOF; appendonly everysec;
//     appendonly always.
//  2. Failover: a cluster of three masters with one replica each
//     (cluster-node-timeout -durability-node-timeout); -workers goroutines
//     admit on -durability-keys keys whose buckets never run dry, a master
//     is killed after durLoadBefore, its replica is promoted, the load goes
//     on durLoadAfter, then the buckets are read. -durability-runs times on
//     fresh clusters, with and without WAIT 1 after each script call.

const (
	durCapacity    = 100                    // crash: a drained bucket's capacity
	durBigCapacity = 1 << 40                // failover: a bucket that never runs dry
	durTimeout     = 2 * time.Second        // the store's Timeout: a slow machine is not an outage
	durWaitTimeout = 500 * time.Millisecond // WAIT's timeout, under the store's (shorter times out on a busy machine)
	durLoadBefore  = 2 * time.Second        // failover: load before the kill (the throughput sample)
	durLoadAfter   = time.Second            // failover: load after the promotion
	durPrefix      = "tsdurab:"
	durPool        = 4096             // the failover client's PoolSize (see durFailover)
	durDuration    = 15 * time.Minute // -duration when -check durability is given without it: a bound, not a length
)

// durSetting is one persistence configuration of the crash measurement.
type durSetting struct {
	name string
	args []string
	// lossless: a kill -9 of the process must mint nothing (Redis fsyncs
	// the AOF before it replies).
	lossless bool
}

var durSettings = []durSetting{
	{"no appendonly (RDB save points)", []string{"--appendonly", "no"}, false},
	{"appendonly, appendfsync everysec", []string{"--save", "", "--appendonly", "yes", "--appendfsync", "everysec"}, false},
	{"appendonly, appendfsync always", []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always"}, true},
}

// durResult is one measurement.
type durResult struct {
	minted    int64         // tokens in the buckets beyond what they should hold
	unacked   int64         // tokens taken by admissions whose reply was lost
	admitted  int64         // admissions acknowledged
	perSec    float64       // acknowledged decisions per second before the event
	degraded  int64         // answers of the failure rule
	promotion time.Duration // failover: from the kill to the replica answering as master
}

// durOptions are the durability check's flags.
type durOptions struct {
	keys        int
	runs        int
	port        int
	clusterPort int
	nodeTimeout time.Duration
	lag         time.Duration // failover: also with the killed master's replica this far behind (0 = not)
}

// runDurability runs both measurements and leaves its table for the summary.
func runDurability(ctx context.Context, o options, c *counters) error {
	// go-redis logs every failed dial to the node killed on purpose
	redis.SetLogger(durQuiet{})
	root, err := os.MkdirTemp("", "tsdurab-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	var rows []table.Row
	for i, st := range durSettings {
		r, err := durCrash(ctx, o, st, filepath.Join(root, "crash"+strconv.Itoa(i)), c)
		if err != nil {
			return err
		}
		if st.lossless && r.minted != 0 {
			return &Violation{Check: "durability", Op: "kill -9 and restart with " + st.name,
				Want: "0 tokens minted", Got: fmt.Sprintf("%d minted", r.minted), Seed: o.seed}
		}
		rows = append(rows, table.Row{"crash: " + st.name, fmt.Sprintf("%d of %d", r.minted, int64(o.dur.keys)*durCapacity),
			r.unacked, fmt.Sprintf("%.0f", r.perSec), "-"})
	}
	lags := []time.Duration{0}
	if o.dur.lag > 0 {
		lags = append(lags, o.dur.lag)
	}
	for _, lag := range lags {
		for _, wait := range []bool{false, true} {
			if o.dur.runs == 0 {
				break
			}
			var rs []durResult
			for run := range o.dur.runs {
				r, err := durFailover(ctx, o, wait, lag, filepath.Join(root, fmt.Sprintf("failover%v%v%d", lag, wait, run)), c)
				if err != nil {
					return err
				}
				rs = append(rs, r)
			}
			name := "failover, async replication"
			if wait {
				name = "failover, WAIT 1 " + durWaitTimeout.String() + " after each script call"
			}
			if lag > 0 {
				name += ", replica " + lag.String() + " behind"
			}
			rows = append(rows, table.Row{name, durSpread(rs, func(r durResult) float64 { return float64(r.minted) }, "%.0f"),
				durSpread(rs, func(r durResult) float64 { return float64(r.unacked) }, "%.0f"),
				durSpread(rs, func(r durResult) float64 { return r.perSec }, "%.0f"),
				durSpread(rs, func(r durResult) float64 { return float64(r.degraded) }, "%.0f") + " in " +
					durSpread(rs, func(r durResult) float64 { return r.promotion.Seconds() }, "%.1fs")})
		}
	}
	t := table.NewWriter()
	t.AppendHeader(table.Row{"event and setting", "tokens minted", "taken unacknowledged", "decisions/s", "failure-rule answers (promotion)"})
	t.AppendRows(rows)
	s := fmt.Sprintf("durability: %d keys, %d workers, a frozen clock; failover: %d runs (min/median/max), cluster-node-timeout %v\n%s",
		o.dur.keys, o.workers, o.dur.runs, o.dur.nodeTimeout, t.Render())
	c.report.Store(&s)
	return nil
}

// durSpread formats min/median/max of f over rs.
func durSpread(rs []durResult, f func(durResult) float64, format string) string {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return fmt.Sprintf(format+"/"+format+"/"+format, v[0], v[len(v)/2], v[len(v)-1])
}

// durStore is a store on rdb at a frozen clock, failing closed.
func durStore(ctx context.Context, rdb redis.UniversalClient, capacity int64) (*redisstore.Store, error) {
	return redisstore.New(ctx, redisstore.Config{
		Client:  rdb,
		Prefix:  durPrefix,
		Policy:  policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: 10},
		Timeout: durTimeout,
		Clock:   clock.NewManual(1 << 60),
	})
}

func durKey(i int) string { return "k" + strconv.Itoa(i) }

// durCrash drains the keys on one server of setting st, kills it, restarts
// it on the same directory and reads the buckets.
func durCrash(ctx context.Context, o options, st durSetting, dir string, c *counters) (r durResult, err error) {
	p, err := durStart(ctx, o.dur.port, dir, st.args...)
	if err != nil {
		return r, err
	}
	defer p.kill()
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), ContextTimeoutEnabled: true, PoolSize: 4 * o.workers})
	s, err := durStore(ctx, rdb, durCapacity)
	if err != nil {
		return r, errors.Join(fmt.Errorf("durability: %s: %w", st.name, err), rdb.Close())
	}
	admitted := make([]atomic.Int64, o.dur.keys)
	var next atomic.Int64
	var werr error
	var once sync.Once
	var wg sync.WaitGroup
	t0 := time.Now()
	for range o.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				k := int(next.Add(1)) - 1
				if k >= o.dur.keys {
					return
				}
				for range durCapacity {
					d, err := s.Allow(ctx, durKey(k), 1)
					c.record(d, err)
					if err != nil || d.Degraded || !d.Allowed {
						once.Do(func() { werr = fmt.Errorf("durability: %s: draining %s: %+v, %v", st.name, durKey(k), d, err) })
						return
					}
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	if werr == nil {
		werr = ctx.Err()
	}
	if werr != nil {
		return r, errors.Join(werr, s.Close(), rdb.Close())
	}
	p.kill() // at once: the last reply was just read
	err = errors.Join(s.Close(), rdb.Close())
	if err != nil {
		return r, err
	}
	r.admitted = int64(o.dur.keys) * durCapacity
	r.perSec = float64(r.admitted) / took.Seconds()
	if err := p.restart(ctx); err != nil {
		return r, err
	}
	rdb = redis.NewClient(&redis.Options{Addr: p.addr(), ContextTimeoutEnabled: true})
	defer func() { err = errors.Join(err, rdb.Close()) }()
	r.minted, r.unacked, err = durRead(ctx, rdb, durCapacity, admitted, o.workers)
	return r, err
}

// durRead peeks every key with a fresh store and returns the tokens minted
// and the tokens taken by unacknowledged admissions (see the file's doc).
func durRead(ctx context.Context, rdb redis.UniversalClient, capacity int64, admitted []atomic.Int64, workers int) (minted, unacked int64, err error) {
	s, err := durStore(ctx, rdb, capacity)
	if err != nil {
		return 0, 0, fmt.Errorf("durability: a store after the event: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	var m, u atomic.Int64
	var next atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1)) - 1
				if k >= len(admitted) {
					return
				}
				d, perr := s.Peek(ctx, durKey(k))
				if perr != nil {
					once.Do(func() { err = fmt.Errorf("durability: peeking %s after the event: %w", durKey(k), perr) })
					return
				}
				switch diff := d.Remaining - (capacity - admitted[k].Load()); {
				case diff > 0:
					m.Add(diff)
				case diff < 0:
					u.Add(-diff)
				}
			}
		})
	}
	wg.Wait()
	return m.Load(), u.Load(), err
}

// durFailover runs one failover on a fresh cluster.
func durFailover(ctx context.Context, o options, wait bool, lag time.Duration, dir string, c *counters) (r durResult, err error) {
	cl, err := durStartCluster(ctx, o.dur.clusterPort, o.dur.port+10, dir, o.dur.nodeTimeout, lag)
	if err != nil {
		return r, err
	}
	defer cl.kill()
	// the victim: nodes[0], a master, and its replica
	nodes, err := cl.nodesInfo(ctx)
	if err != nil {
		return r, err
	}
	var victim, heir durNode
	for _, n := range nodes {
		if n.addr == cl.first && n.isMaster && n.slots {
			victim = n
		}
	}
	for _, n := range nodes {
		if victim.id != "" && n.master == victim.id {
			heir = n
		}
	}
	if victim.id == "" || heir.id == "" {
		return r, fmt.Errorf("durability: %s is not a master with a replica in %+v", cl.first, nodes)
	}
	var addrs []string
	for _, p := range cl.nodes {
		addrs = append(addrs, p.addr())
	}
	// PoolSize far above the failed dials of the outage (each takes go-redis
	// about 400 ms): after PoolSize of them a pool starts a redial loop that
	// outlives Close by up to a second.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, PoolSize: durPool})
	defer func() { err = errors.Join(err, rdb.Close()) }()
	if wait {
		if err := redisstore.WaitForReplicas(rdb, 1, durWaitTimeout); err != nil {
			return r, err
		}
	}
	// The policy is installed by a client without WAIT: the measurement
	// is of decisions.
	rin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	s, err := durStore(ctx, rin, durBigCapacity)
	if err == nil {
		err = s.Close()
	}
	err = errors.Join(err, rin.Close())
	for try := 1; err == nil; try++ {
		// New writes too: on a busy machine WAIT may time out
		if s, err = durStore(ctx, rdb, durBigCapacity); err == nil || try == 3 || ctx.Err() != nil {
			break
		}
		err = nil
	}
	if err != nil {
		return r, fmt.Errorf("durability: failover store: %w", err)
	}
	admitted := make([]atomic.Int64, o.dur.keys)
	var acked, degraded atomic.Int64
	var werr error
	var once sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range o.workers {
		wg.Go(func() {
			for k := w; ; k = (k + o.workers) % o.dur.keys {
				select {
				case <-stop:
					return
				default:
				}
				d, err := s.Allow(ctx, durKey(k), 1)
				c.record(d, err)
				switch {
				case err != nil:
					once.Do(func() { werr = fmt.Errorf("durability: failover: Allow %s: %w", durKey(k), err) })
					return
				case d.Degraded:
					degraded.Add(1)
				case d.Allowed:
					admitted[k].Add(1)
					acked.Add(1)
				default:
					once.Do(func() { werr = fmt.Errorf("durability: failover: %s denied with tokens to spare: %+v", durKey(k), d) })
					return
				}
			}
		})
	}
	stopLoad := func() error {
		close(stop)
		wg.Wait()
		return werr
	}
	if err := durPause(ctx, durLoadBefore); err != nil {
		return r, errors.Join(err, stopLoad(), s.Close())
	}
	r.perSec = float64(acked.Load()) / durLoadBefore.Seconds()
	victimProc := cl.nodes[0]
	t0 := time.Now()
	victimProc.kill()
	for {
		role, err := durDo(ctx, heir.addr, "role")
		if err == nil && strings.HasPrefix(role, "master") {
			break
		}
		if time.Since(t0) > 30*time.Second || ctx.Err() != nil {
			return r, errors.Join(fmt.Errorf("durability: %s not promoted after %v", heir.addr, time.Since(t0)), ctx.Err(), stopLoad(), s.Close())
		}
		time.Sleep(10 * time.Millisecond) // a cluster failing over
	}
	r.promotion = time.Since(t0)
	err = durPause(ctx, durLoadAfter)
	err = errors.Join(err, stopLoad(), s.Close())
	if err != nil {
		return r, err
	}
	r.admitted, r.degraded = acked.Load(), degraded.Load()
	// The killed node comes back, as the heir's replica: the clients'
	// background dials to it succeed and end, and the cluster is whole
	// when they close.
	if err := victimProc.restart(ctx); err != nil {
		return r, err
	}
	// read by a client with no WAIT, whatever the replica's state
	rdr := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer func() { err = errors.Join(err, rdr.Close()) }()
	r.minted, r.unacked, err = durRead(ctx, rdr, durBigCapacity, admitted, o.workers)
	if err != nil {
		return r, err
	}
	return r, cl.waitHealthy(ctx)
}

// durPause waits d, or until ctx ends.
func durPause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// durQuiet is a go-redis logger that drops everything.
type durQuiet struct{}

func (durQuiet) Printf(context.Context, string, ...any) {}
