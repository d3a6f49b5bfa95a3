package main

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The lease check (-check leases): leaseStores Redis stores in lease mode
// (redisstore.Config.Leases), each with its own client, share one Redis
// (-redis, or a redis-server the check starts on a free port) and decide at
// the server's TIME, while a coordinator cuts the policy over between
// capacities and rates drawn from leaseCaps and leaseRates (raising and
// lowering both, each through a store in turn, whose ReplacePolicy gives
// its leases back first; the others meet the cutover later and end their
// leases by the store's rule), and halfway the last store is killed: its
// workers stop, its client is closed, so whatever it held as leases is
// lost, as a crashed process's would be (it is closed only after the last
// check, to stop its goroutines; with no client its give-backs fail).
//
// Per store, half the workers ask the leaseHot hot keys in a closed loop,
// far above any rate; the others ask the leaseWarm warm keys in bursts of
// leaseBurst with a pause between, so that their stores lease them and
// still hold leases when a cutover comes.
//
// Before each cutover and at the end the coordinator adds up every key's
// admissions (every store's, the killed one's included), then reads the
// server's TIME t, and checks, exactly (math/big), that each key was
// admitted no more than its bucket can have given out since it was created
// (all keys are created by one request each, at the start, before the first
// cutover and after the reading s that starts the timeline):
//
//	hot:  admitted <= cap(s) + ∫_s^t rate
//	warm: admitted <= cap(s) + ∫_s^t rate + Σ capacity raises
//
// where the rate integral runs the stress conservation check's timeline
// (consTimeline): the rate in force outside cutover windows, the faster of
// the two across a window [before, after] of server TIME readings around a
// ReplacePolicy call. A lease only moves tokens already taken from the
// bucket into a store, and a give-back returns tokens none admitted, so
// leases change neither bound. A warm key's bucket can fill and expire,
// and one recreated after a raise starts full at the new capacity, which
// the store may hand out: hence the raises in its bound. A hot key is
// asked far faster than any rate, so its bucket is never full after its
// first moments, never expires, and a raise can reach it only as a top-up:
// its bound has no raises, and catches one.
//
// What the bounds cannot catch: a hot key holds a lease only in its first
// moments, while its bucket is over the half a lease leaves it (see
// redisstore's Leases), so at a cutover only warm keys hold leases, and
// their bound, raises and all, is far above what they are asked. A store
// that kept spending a lease taken under the old version after a cutover,
// or gave one back across a cutover that clamped it and then a raise,
// passes this check; redisstore's own tests catch them (TestLeaseHeldTokensStayUnderTheirVersion,
// TestLeaseGiveBackAcrossCutovers, TestLeaseGiveBackAfterOthersRaise). A
// grant counted more than once is caught at the first check, as the hot
// keys lease at the start.
const (
	leaseStores     = 4
	leaseHot        = 8
	leaseWarm       = 32
	leaseBurst      = 12
	leasePause      = 50 * time.Millisecond
	leaseCutoverMin = 200 * time.Millisecond // -cutover-every, at least this: a lease needs time to form
	leaseTimeout    = 5 * time.Second        // the stores' Timeout: a slow machine is not an outage
	leasePrefix     = "tslease:"
)

var (
	leaseCaps  = []int64{100, 200, 400, 800, 1600}
	leaseRates = []int64{25, 50, 100, 200} // slow enough that no hot bucket fills while its workers wait on Redis
)

// leaseKey is key i's name: the hot keys first, then the warm.
func leaseKey(i int) string {
	if i < leaseHot {
		return "hot" + strconv.Itoa(i)
	}
	return "warm" + strconv.Itoa(i-leaseHot)
}

// leaseResult is what the check measured, for its table.
type leaseResult struct {
	cutovers, checks       int
	admitted               [leaseHot + leaseWarm]int64
	bound                  [leaseHot + leaseWarm]int64 // at the last check
	stats                  [leaseStores]redisstore.Stats
	hotSlack, warmSlack    int64 // the least bound-admitted over the keys of the class, at any check
	degraded, killedAnswer int64 // failure-rule answers of live stores; answers of the killed store after its kill
}

// runLeases runs the lease check until ctx ends, then checks a last time
// and leaves its table for the summary.
func runLeases(ctx context.Context, o options, c *counters) error {
	addr := o.redis
	if addr == "" {
		p, dir, err := leaseServer(ctx)
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		defer p.kill()
		addr = p.addr()
	}
	r, err := leaseRun(ctx, o, addr, c)
	if err != nil {
		return err
	}
	rep := leaseTable(r)
	c.report.Store(&rep)
	return nil
}

// leaseServer starts a redis-server without persistence on a free port.
func leaseServer(ctx context.Context) (*durProc, string, error) {
	dir, err := os.MkdirTemp("", "tslease-")
	if err != nil {
		return nil, "", err
	}
	var errs []error
	for range 3 { // a port found free can be taken before the server binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", errors.Join(err, os.RemoveAll(dir))
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		p, err := durStart(ctx, port, filepath.Join(dir, strconv.Itoa(port)), "--save", "", "--appendonly", "no")
		if err == nil {
			return p, dir, nil
		}
		errs = append(errs, err)
	}
	return nil, "", errors.Join(append(errs, os.RemoveAll(dir))...)
}

// leaseRun is the check on the Redis at addr.
func leaseRun(ctx context.Context, o options, addr string, c *counters) (r leaseResult, err error) {
	rng := rand.New(rand.NewPCG(o.seed, 0x1ea5e))
	pfx := fmt.Sprintf("%s%016x:", leasePrefix, rng.Uint64())
	admin := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer admin.Close()
	defer leaseClean(admin, pfx)
	now := func() (int64, error) {
		tctx, cancel := context.WithTimeout(context.Background(), leaseTimeout)
		defer cancel()
		t, err := admin.Time(tctx).Result()
		return t.UnixNano(), err
	}

	pol := policy.Policy{Version: 1, Capacity: leaseCaps[2], TokensPerSecond: leaseRates[1]}
	var stores [leaseStores]*redisstore.Store
	var clients [leaseStores]*redis.Client
	defer func() {
		for i, s := range stores {
			if s != nil {
				_ = s.Close()
				_ = clients[i].Close()
			}
		}
	}()
	for i := range stores {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		stores[i], err = redisstore.New(ctx, redisstore.Config{Client: clients[i], Prefix: pfx, Policy: pol,
			Timeout: leaseTimeout, Leases: &redisstore.Leases{}})
		if err != nil {
			return r, fmt.Errorf("leases: %w", err)
		}
	}

	// The timeline starts at s; then every key's bucket is created, by one
	// request through the first store, counted like any other.
	var admitted [leaseStores][leaseHot + leaseWarm]atomic.Int64
	s, err := now()
	if err != nil {
		return r, fmt.Errorf("leases: TIME: %w", err)
	}
	tl := consTimeline{at: s, lim: pol.Limit()}
	cap0 := pol.Capacity
	for k := range leaseHot + leaseWarm {
		d, err := stores[0].Allow(context.Background(), leaseKey(k), 1)
		c.record(d, err)
		if err != nil || d.Degraded {
			return r, fmt.Errorf("leases: creating %s: %v, %+v", leaseKey(k), err, d)
		}
		if d.Allowed {
			admitted[0][k].Add(1)
		}
	}

	// Workers, per store until its context ends.
	var degraded, killedAnswers atomic.Int64
	var killed atomic.Bool
	killedStore := leaseStores - 1
	var stop [leaseStores]context.CancelFunc
	var wgs [leaseStores]sync.WaitGroup
	per := max(2, o.workers/leaseStores)
	failed := make(chan *Violation, leaseStores*per)
	for i, st := range stores {
		sctx, cancel := context.WithCancel(ctx)
		stop[i] = cancel
		ask := func(k int) bool {
			d, err := st.Allow(context.Background(), leaseKey(k), 1)
			if i == killedStore && killed.Load() {
				killedAnswers.Add(1) // its client is closed: nothing it answers now is checked
				return sctx.Err() == nil
			}
			c.record(d, err)
			switch {
			case err != nil:
				failed <- &Violation{Check: "leases", Key: leaseKey(k), Op: fmt.Sprintf("Allow on store %d", i), Want: "a decision", Got: err.Error(), Seed: o.seed}
				return false
			case d.Degraded:
				degraded.Add(1)
			case d.Allowed:
				admitted[i][k].Add(1)
			}
			return sctx.Err() == nil
		}
		for w := range per {
			wgs[i].Go(func() {
				if w%2 == 0 { // hot, closed loop
					for j := w / 2; ask(j % leaseHot); j++ {
					}
					return
				}
				pause := time.NewTimer(leasePause)
				defer pause.Stop()
				for j := w / 2; ; j++ {
					for range leaseBurst {
						if !ask(leaseHot + j%leaseWarm) {
							return
						}
					}
					pause.Reset(leasePause)
					select {
					case <-sctx.Done():
						return
					case <-pause.C:
					}
				}
			})
		}
	}
	stopAll := func() {
		for i := range stores {
			stop[i]()
			wgs[i].Wait()
		}
	}
	defer stopAll()

	// check adds up the admissions, reads TIME and checks every key.
	check := func(op string) (*Violation, error) {
		var sum [leaseHot + leaseWarm]int64
		for i := range stores {
			for k := range sum {
				sum[k] += admitted[i][k].Load()
			}
		}
		t, err := now()
		if err != nil {
			return nil, fmt.Errorf("leases: TIME: %w", err)
		}
		if t < tl.at {
			return nil, fmt.Errorf("leases: the server's TIME went back from %d to %d", tl.at, t)
		}
		tl.advance(t, tl.lim.Rate())
		r.checks++
		rate := new(big.Int).Quo(tl.rate.Num(), tl.rate.Denom()) // floor: both positive
		raise := new(big.Int).Quo(tl.raise.Num(), tl.raise.Denom())
		for k := range sum {
			b := new(big.Int).Add(big.NewInt(cap0), rate)
			if k >= leaseHot {
				b.Add(b, raise)
			}
			if !b.IsInt64() || b.Int64() < sum[k] {
				return &Violation{Check: "leases", Key: leaseKey(k), Op: op + fmt.Sprintf(" (server TIME %d, after %d cutovers)", t, r.cutovers),
					Want: fmt.Sprintf("at most %s admitted: capacity %d at the start + refill %s + raises %s (counted for warm keys only)", b, cap0, rate, raise),
					Got:  fmt.Sprintf("%d admitted", sum[k]), Seed: o.seed}, nil
			}
			slack := b.Int64() - sum[k]
			if k < leaseHot {
				r.hotSlack = min(r.hotSlack, slack)
			} else {
				r.warmSlack = min(r.warmSlack, slack)
			}
			r.admitted[k], r.bound[k] = sum[k], b.Int64()
		}
		return nil, nil
	}
	r.hotSlack, r.warmSlack = 1<<62, 1<<62

	every := max(o.cutoverEvery, leaseCutoverMin)
	tick := time.NewTicker(every)
	defer tick.Stop()
	start := time.Now()
	next := 0 // the store that makes the next cutover
	for ctx.Err() == nil {
		select {
		case v := <-failed:
			return r, v
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		if !killed.Load() && time.Since(start) >= o.duration/2 {
			stop[killedStore]()
			killed.Store(true)
			_ = clients[killedStore].Close() // its leases are lost with it
			wgs[killedStore].Wait()
		}
		if v, err := check(fmt.Sprintf("admissions before cutover %d", r.cutovers+1)); v != nil || err != nil {
			return r, cmpErr(v, err)
		}
		before := tl.at
		np := pol
		for np.Capacity == pol.Capacity && np.TokensPerSecond == pol.TokensPerSecond {
			np = policy.Policy{Version: pol.Version + 1, Capacity: leaseCaps[rng.IntN(len(leaseCaps))], TokensPerSecond: leaseRates[rng.IntN(len(leaseRates))]}
		}
		if next == killedStore && killed.Load() {
			next = 0
		}
		cctx, cancel := context.WithTimeout(context.Background(), 4*leaseTimeout)
		err := stores[next].ReplacePolicy(cctx, np, pol.Version)
		cancel()
		if err != nil {
			return r, fmt.Errorf("leases: ReplacePolicy to version %d through store %d: %w", np.Version, next, err)
		}
		after, err := now()
		if err != nil {
			return r, fmt.Errorf("leases: TIME: %w", err)
		}
		if after < before {
			return r, fmt.Errorf("leases: the server's TIME went back from %d to %d", before, after)
		}
		tl.cutover(before, after, np.Limit())
		pol = np
		r.cutovers++
		c.cutovers.Add(1)
		next = (next + 1) % leaseStores
	}
	ran := time.Since(start) // before the stop and the last check, which take their time
	stopAll()
	select {
	case v := <-failed:
		return r, v
	default:
	}
	if v, err := check("every admission, at the end"); v != nil || err != nil {
		return r, cmpErr(v, err)
	}
	for i, st := range stores {
		if i != killedStore {
			_ = st.Close() // gives its leases back, counted in its Stats
		}
		r.stats[i] = st.Stats()
	}
	r.degraded, r.killedAnswer = degraded.Load(), killedAnswers.Load()
	if !killed.Load() {
		if ran < o.duration/2 { // stopped early: another check's violation, or an interrupt (reported as one, see runChecks)
			return r, fmt.Errorf("leases: the run was stopped after %v, before the store was to be killed at half the -duration", ran.Round(time.Millisecond))
		}
		return r, fmt.Errorf("leases: the run ended before the store was killed: give it a -duration of a second or more")
	}
	if r.cutovers == 0 {
		return r, fmt.Errorf("leases: the run ended before the first cutover: give it a -duration of more than %v", every)
	}
	return r, nil
}

// cmpErr is v as an error if it is not nil, else err.
func cmpErr(v *Violation, err error) error {
	if v != nil {
		return v
	}
	return err
}

// leaseClean deletes what the check wrote under pfx.
func leaseClean(c *redis.Client, pfx string) {
	ctx, cancel := context.WithTimeout(context.Background(), leaseTimeout)
	defer cancel()
	iter := c.Scan(ctx, 0, pfx+"*", 1000).Iterator()
	for key := range iter.Vals(ctx) {
		c.Del(ctx, key)
	}
}

// leaseTable is the check's report.
func leaseTable(r leaseResult) string {
	t := table.NewWriter()
	t.AppendHeader(table.Row{"store", "allowed", "denied", "decided locally", "tokens leased", "returned", "forfeited"})
	var tot redisstore.Stats
	for i, s := range r.stats {
		name := strconv.Itoa(i)
		if i == leaseStores-1 {
			name += " (killed)"
		}
		t.AppendRow(table.Row{name, s.Allowed, s.Denied, s.Local, s.LeasedTokens, s.ReturnedTokens, s.ForfeitedTokens})
		tot.Allowed, tot.Denied, tot.Local = tot.Allowed+s.Allowed, tot.Denied+s.Denied, tot.Local+s.Local
		tot.LeasedTokens, tot.ReturnedTokens, tot.ForfeitedTokens = tot.LeasedTokens+s.LeasedTokens, tot.ReturnedTokens+s.ReturnedTokens, tot.ForfeitedTokens+s.ForfeitedTokens
	}
	t.AppendFooter(table.Row{"all", tot.Allowed, tot.Denied, tot.Local, tot.LeasedTokens, tot.ReturnedTokens, tot.ForfeitedTokens})
	var hot, hotBound int64
	for k := range leaseHot {
		hot, hotBound = hot+r.admitted[k], hotBound+r.bound[k]
	}
	return fmt.Sprintf("leases: %d stores (one killed halfway), %d hot and %d warm keys, %d cutovers, %d checks; "+
		"least bound-admitted over the checks: hot %d, warm %d (0 is exact, never below); hot keys admitted %d of a bound of %d (%.1f%%); "+
		"failure-rule answers %d; answers of the killed store after the kill %d (not counted)\n%s",
		leaseStores, leaseHot, leaseWarm, r.cutovers, r.checks, r.hotSlack, r.warmSlack, hot, hotBound, 100*float64(hot)/float64(max(hotBound, 1)),
		r.degraded, r.killedAnswer, t.Render())
}
