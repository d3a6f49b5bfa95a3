package redisstore

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Once the demand count covers two Horizons it is scaled to one, and its
// start moves to a Horizon before now, not to now: the count is then a
// Horizon's worth, and the next sizing scales it by the time it really
// covers. Moved to now, 150 tokens over two and a half Horizons would
// count as 150 over one and a half, a demand of 100 rather than 60.
func TestLeaseWantRescaleKeepsAHorizon(t *testing.T) {
	l := &leaser{horizon: 100}
	k := &lease{max: 1000, remaining: 1 << 20, used: 300}
	require.Equal(t, int64(100), l.want(300, k, 1), "300 over three Horizons")
	require.Equal(t, int64(100), k.used)
	require.Equal(t, int64(200), k.from, "a Horizon before now")
	k.used += 50 // admitted since
	require.Equal(t, int64(60), l.want(450, k, 1), "150 over two and a half Horizons")
}

// shardAt is one lease shard, alone, for driving decide and settle by hand
// under policy p: no goroutine, no Redis; its fetcher's jobs stay queued.
func shardAt(p policy.Policy) (*leaseShard, *state) {
	l := &leaser{divisor: DefaultLeaseDivisor, horizon: 100, maxAge: 1000, idle: 200}
	return &leaseShard{l: l, jobs: make(chan job, 8), keys: map[string]*lease{}}, newState(p)
}

// allowAt is one Allow of key's lease shard q at now.
func allowAt(q *leaseShard, st *state, now int64, key string, cost int64) *lreq {
	r := &lreq{op: opAllow, key: key, cost: cost}
	q.decide(now, st, r)
	return r
}

// A lease is topped up once it holds less than half the next lease's
// size, a demand bounded by the lease's bound: a demand above the bound
// must not make a lease still over half of it ask for more.
func TestLeaseTopUpAtHalfTheBound(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}) // a bound of 62, a reserve of 500
	allowed := func(rem int64) engine.Decision {
		return engine.Decision{Allowed: true, Remaining: rem, Limit: 1000, Version: 1}
	}

	r := allowAt(q, st, 0, "k", 100) // no demand yet: Redis decides, no lease asked for
	require.Equal(t, errRemote, r.err)
	require.Zero(t, r.want)
	q.settle(post{key: "k", ver: 1, at: 0, cost: 100, d: allowed(900)})

	r = allowAt(q, st, 10, "k", 1) // a demand of 100: the bound's worth is asked for
	require.Equal(t, errRemote, r.err)
	require.Equal(t, int64(62), r.want)
	q.settle(post{key: "k", ver: 1, at: 10, cost: 1, asked: 62, d: allowed(899), leaseD: allowed(837)})
	require.Equal(t, int64(62), q.keys["k"].left)

	r = allowAt(q, st, 20, "k", 20) // 42 left: over half the bound
	require.NoError(t, r.err)
	require.True(t, r.d.Allowed)
	require.Empty(t, q.jobs, "no top-up while the lease holds over half the bound")

	r = allowAt(q, st, 30, "k", 12) // 30 left: under half
	require.NoError(t, r.err)
	require.True(t, r.d.Allowed)
	require.Len(t, q.jobs, 1)
	require.Equal(t, job{gift: gift{"k", 32, 1}}, <-q.jobs, "the bound, less what the lease holds")
	require.True(t, q.keys["k"].fetch)
}

// A top-up that finds no lease to ask for (the bucket, as last heard, at
// its reserve) forgets the lease's size: the next lease is asked for with
// the next request Redis decides, not by a request the lease decides, even
// if an answer since says the bucket has refilled.
func TestLeaseNoTopUpAfterAFruitlessOne(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	k := &lease{ver: 1, cap: 1000, max: 62, reserve: 500, remaining: 501, limit: 1000, left: 40, target: 62, used: 1000}
	q.keys["k"] = k

	r := allowAt(q, st, 10, "k", 20) // 20 left, under half: the bucket keeps nothing over its reserve
	require.True(t, r.d.Allowed)
	require.Empty(t, q.jobs)
	require.Zero(t, k.target)

	k.remaining = 900 // as an answer of Redis's since would have it (learn)
	r = allowAt(q, st, 20, "k", 1)
	require.True(t, r.d.Allowed)
	require.Empty(t, q.jobs, "no top-up before a request Redis decides")

	allowAt(q, st, 30, "k", 19)
	r = allowAt(q, st, 40, "k", 1) // the lease spent: Redis decides, and the lease is asked for with it
	require.Equal(t, errRemote, r.err)
	require.Equal(t, int64(62), r.want)
}

// A lease's answer estimates the bucket as its last answer plus what the
// lease holds, at most the limit: a bucket that answered full behind a
// lease is not reported over its capacity. Its ResetAfter counts from that
// answer, and is never negative.
func TestLeaseAnswerWithinLimit(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	q.keys["k"] = &lease{ver: 1, cap: 1000, max: 62, reserve: 500, remaining: 990, resetAt: 50, limit: 1000, left: 30}
	r := allowAt(q, st, 20, "k", 1)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 1000, Limit: 1000, Version: 1, ResetAfter: 30}, r.d)
	r = allowAt(q, st, 80, "k", 1)
	require.Equal(t, engine.Decision{Allowed: true, Remaining: 1000, Limit: 1000, Version: 1}, r.d)
}

// A lease is asked for only while the bucket, at its last answer, keeps
// half its capacity besides: for an odd capacity, that half rounded up.
func TestLeaseReserveIsHalfRoundedUp(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1001, TokensPerSecond: 1}) // a bound of 62
	allowed := func(rem int64) engine.Decision {
		return engine.Decision{Allowed: true, Remaining: rem, Limit: 1001, Version: 1}
	}
	allowAt(q, st, 0, "k", 100)
	q.settle(post{key: "k", ver: 1, at: 0, cost: 100, d: allowed(503)})
	r := allowAt(q, st, 10, "k", 1) // 503 less 1 less 2 would keep 500, under 500.5
	require.Equal(t, errRemote, r.err)
	require.Zero(t, r.want)
	q.settle(post{key: "k", ver: 1, at: 10, cost: 1, d: allowed(504)})
	r = allowAt(q, st, 20, "k", 1) // 504 less 1 less 2 keeps 501
	require.Equal(t, errRemote, r.err)
	require.Equal(t, int64(2), r.want)
}

// A denial Redis gave is kept for its cost, and the lease's answer says to
// retry when Redis said to: RetryAfter counts from Redis's answer.
func TestLeaseKeptDenialRetryAfter(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	allowAt(q, st, 0, "k", 600)
	q.settle(post{key: "k", ver: 1, at: 0, cost: 600, d: engine.Decision{Remaining: 400, Limit: 1000, Version: 1, RetryAfter: 200, ResetAfter: 600}})
	r := allowAt(q, st, 50, "k", 600)
	require.NoError(t, r.err)
	require.Equal(t, engine.Decision{Remaining: 400, Limit: 1000, Version: 1, RetryAfter: 150, ResetAfter: 550}, r.d)
	r = allowAt(q, st, 200, "k", 600) // the denial has passed
	require.Equal(t, errRemote, r.err)
}

// Redis's answers reach the shard in any order: an admission decided
// before a denial but learned after it does not make the kept denial
// report the admission's balance (a denial of 1 token with 4 left, as
// twenty concurrent callers of a key once saw). The denial's own balance,
// reset time, band and that band's limit stand, the band being the one
// the Decision's Remaining, Limit and ResetAfter describe, also when the
// last answer named another.
func TestLeaseKeptDenialAnswersAsTheDenial(t *testing.T) {
	for _, denial := range []engine.Decision{
		{Remaining: 0, Limit: 10, Version: 1, RetryAfter: 500, ResetAfter: 5000, Band: "b"},
		{Remaining: 0, Limit: 20, Version: 1, RetryAfter: 500, ResetAfter: 9000, Band: "daily"},
	} {
		q, st := shardAt(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2})
		for range 2 {
			require.Equal(t, errRemote, allowAt(q, st, 0, "k", 1).err)
		}
		q.settle(post{key: "k", ver: 1, at: 0, cost: 1, d: denial})
		q.settle(post{key: "k", ver: 1, at: 0, cost: 1, d: engine.Decision{Allowed: true, Remaining: 4, Limit: 10, Version: 1, ResetAfter: 3000}})
		r := allowAt(q, st, 100, "k", 1)
		require.NoError(t, r.err)
		want := denial
		want.RetryAfter, want.ResetAfter = denial.RetryAfter-100, denial.ResetAfter-100
		require.Equal(t, want, r.d, "band %q", denial.Band)
	}
}

// A kept denial no longer answers once what the lease holds and the bucket
// had cover its cost: a grant Redis decided before the denial, learned
// after it, sends the request to Redis rather than deny it in the process
// (and report more tokens than it costs).
func TestLeaseKeptDenialYieldsToAGrant(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	require.Equal(t, errRemote, allowAt(q, st, 0, "k", 3).err)
	q.settle(post{key: "k", ver: 1, at: 0, cost: 3, d: engine.Decision{Remaining: 2, Limit: 1000, Version: 1, RetryAfter: 1000, ResetAfter: 998000}})
	r := allowAt(q, st, 10, "k", 3)
	require.NoError(t, r.err, "the denial is kept")
	require.Equal(t, engine.Decision{Remaining: 2, Limit: 1000, Version: 1, RetryAfter: 990, ResetAfter: 997990}, r.d)
	q.settle(post{key: "k", ver: 1, at: 0, asked: 2, leaseD: engine.Decision{Allowed: true, Remaining: 4, Limit: 1000, Version: 1, ResetAfter: 996000}})
	r = allowAt(q, st, 20, "k", 3)
	require.Equal(t, errRemote, r.err, "denied in the process with 2 tokens held and 2 in the bucket: %+v", r.d)
	require.Equal(t, int64(2), r.held)
}

// raises pairs a band of next with prev's band of the same name (not with
// the band before it): a band whose capacity grows is a raise, one that
// keeps or lowers it is not.
func TestLeaseRaisesPairsBandsByName(t *testing.T) {
	shape := func(a, b int64) policy.Shape {
		t.Helper()
		bands, err := policy.NewBands(
			policy.Band{Name: "a", Capacity: a, Refill: policy.Rate{Tokens: 1, Per: time.Second}},
			policy.Band{Name: "b", Capacity: b, Refill: policy.Rate{Tokens: 1, Per: time.Second}})
		require.NoError(t, err)
		p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1, Bands: bands}
		require.NoError(t, p.Validate())
		return p.Shape()
	}
	prev := shape(100, 500)
	require.False(t, raises(prev, prev))
	require.False(t, raises(prev, shape(100, 400)))
	require.True(t, raises(prev, shape(200, 500)), "band a grows")
	require.True(t, raises(prev, shape(100, 600)), "band b grows")
}

// A lease granted under a version other than the one its key's lease is
// under (a cutover met by the call that asked for it) is not the lease's:
// it goes back under the version Redis granted it at, owed a post, and the
// lease keeps nothing of it.
func TestLeaseGrantUnderANewerVersionGoesBack(t *testing.T) {
	q, _ := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	k := &lease{ver: 1, cap: 1000, max: 62, reserve: 500, remaining: 1000, limit: 1000, fetch: true}
	q.keys["k"], q.pending = k, 1 // the fetcher owes the grant's post
	q.settle(post{key: "k", ver: 1, at: 10, asked: 20, leaseD: engine.Decision{Allowed: true, Remaining: 980, Limit: 1000, Version: 2}})
	require.Equal(t, uint64(20), q.l.granted.load())
	require.Len(t, q.jobs, 1)
	require.Equal(t, job{gift{"k", 20, 2}, true, true}, <-q.jobs)
	require.Zero(t, k.left)
	require.Equal(t, int64(20), k.back, "on its way back")
	require.Equal(t, 1, q.pending, "its give-back's post")
	require.False(t, k.fetch)
}

// A lease goes back once MaxAge has passed since its last grant (the
// grant's reading, not the key's first), though its key is busy.
func TestLeaseSweepCountsMaxAgeFromTheGrant(t *testing.T) {
	q, _ := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}) // MaxAge 1000, idle 200
	k := &lease{ver: 1, cap: 1000, max: 62, reserve: 500, remaining: 1000, limit: 1000, fetch: true}
	q.keys["k"], q.pending = k, 1
	q.settle(post{key: "k", ver: 1, at: 5000, asked: 20, leaseD: engine.Decision{Allowed: true, Remaining: 980, Limit: 1000, Version: 1}})
	require.Equal(t, int64(20), k.left)
	k.seen = 5950
	q.sweep(5990) // granted 990 ago, asked 40 ago: kept
	require.Empty(t, q.jobs)
	require.Equal(t, int64(20), k.left)
	k.seen = 5990
	q.sweep(6000) // granted MaxAge ago
	require.Len(t, q.jobs, 1)
	require.Equal(t, job{gift{"k", 20, 1}, true, true}, <-q.jobs)
	require.Zero(t, k.left)
}

// A key idle for two Horizons gives its lease back, or for MaxAge if
// shorter: a long Horizon does not keep a lease (nor the sweeps that give
// it back) past MaxAge.
func TestLeaseIdleAtMostMaxAge(t *testing.T) {
	for _, c := range []struct {
		cfg  Leases
		idle time.Duration
	}{
		{Leases{}, 2 * DefaultLeaseHorizon},
		{Leases{Horizon: 700 * time.Millisecond}, DefaultLeaseMaxAge},
		{Leases{Horizon: time.Hour, MaxAge: time.Second}, time.Second},
	} {
		l := newLeaser(&Store{timeout: time.Second}, &c.cfg, clock.NewManual(0))
		l.close()
		require.Equal(t, int64(c.idle), l.idle, "%+v", c.cfg)
	}
}

// satAdd saturates at math.MaxInt64 exactly, and adds a debt's tokens as
// they are.
func TestLeaseSatAdd(t *testing.T) {
	require.Equal(t, int64(math.MaxInt64), satAdd(math.MaxInt64, 1))
	require.Equal(t, int64(math.MaxInt64), satAdd(math.MaxInt64-1, 1))
	require.Equal(t, int64(math.MaxInt64), satAdd(1, math.MaxInt64))
	require.Equal(t, int64(math.MaxInt64-1), satAdd(math.MaxInt64-3, 2))
	require.Equal(t, int64(-math.MaxInt64+5), satAdd(-math.MaxInt64, 5))
}

// A lease the failure rule admitted (fail-open, Redis unreachable) was
// taken from no bucket: nothing is granted, and the lease holds nothing.
func TestLeaseFailOpenAnswerGrantsNoLease(t *testing.T) {
	q, _ := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1})
	k := &lease{ver: 1, cap: 1000, max: 62, reserve: 500, remaining: 1000, limit: 1000, fetch: true}
	q.keys["k"], q.pending = k, 1
	q.settle(post{key: "k", ver: 1, at: 10, asked: 20, leaseD: engine.Decision{Allowed: true, Degraded: true, Limit: 1000, Version: 1}})
	require.Zero(t, q.l.granted.load())
	require.Zero(t, k.left)
	require.Empty(t, q.jobs)
	require.True(t, k.doubt, "Redis may have granted it to nobody")
}

// A sweep forgets an idle key only once its denial no longer holds: at its
// RetryAfter, or MaxAge after Redis gave it if sooner; a denial with a
// RetryAfter of hours (a day's band) does not keep its key that long.
func TestLeaseSweepKeepsAKeyWhileItsDenialHolds(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}) // MaxAge 1000
	allowAt(q, st, 0, "k", 600)
	q.settle(post{key: "k", ver: 1, at: 600, cost: 600, d: engine.Decision{Remaining: 0, Limit: 1000, Version: 1, RetryAfter: 5000, ResetAfter: 1000}})
	q.sweep(1000) // idle MaxAge, the denial given at 600 holding
	require.Contains(t, q.keys, "k")
	q.sweep(1599)
	require.Contains(t, q.keys, "k")
	q.sweep(1600) // MaxAge since the denial, 4000 before its RetryAfter ends
	require.NotContains(t, q.keys, "k")

	allowAt(q, st, 2000, "j", 600)
	q.settle(post{key: "j", ver: 1, at: 2400, cost: 600, d: engine.Decision{Remaining: 0, Limit: 1000, Version: 1, RetryAfter: 800, ResetAfter: 1000}})
	q.sweep(3000) // idle MaxAge, the denial holding 200 more
	require.Contains(t, q.keys, "j")
	q.sweep(3200) // its RetryAfter has passed, before MaxAge since it
	require.NotContains(t, q.keys, "j")
}

// A denial is kept MaxAge at most, however long its RetryAfter: then Redis
// decides again, so a process meets a cutover made elsewhere, or others'
// refunds, within MaxAge (a day's band gives RetryAfters of hours).
func TestLeaseKeptDenialAtMostMaxAge(t *testing.T) {
	q, st := shardAt(policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}) // MaxAge 1000
	allowAt(q, st, 0, "k", 600)
	q.settle(post{key: "k", ver: 1, at: 100, cost: 600, d: engine.Decision{Remaining: 0, Limit: 1000, Version: 1, RetryAfter: 5000, ResetAfter: 1000}})
	r := allowAt(q, st, 1099, "k", 600)
	require.NoError(t, r.err)
	require.Equal(t, time.Duration(4001), r.d.RetryAfter, "the RetryAfter is Redis's, counted down")
	r = allowAt(q, st, 1100, "k", 600) // MaxAge since Redis denied it
	require.Equal(t, errRemote, r.err)
}
