package redisstore

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// The cutover carries the primary to the primary whatever its name
// (policy.CutoverLevels): a key that moves from the policy's limit to an
// override of a higher capacity is a raise.
func TestLeaseRaisesPairsPrimaries(t *testing.T) {
	lim := func(c int64) policy.Limit {
		p := policy.Policy{Version: 1, Capacity: c, TokensPerSecond: 1}
		_, idx := p.Resolve("k")
		return p.ShapeAt(idx).Primary
	}
	prev := policy.Shape{Name: "", Primary: lim(100)}
	next := policy.Shape{Name: "gold", Primary: lim(10_000)}
	require.True(t, raises(prev, next))
}

// A sweep that cannot queue a lease's give-back (the fetcher's queue full,
// Redis slow) keeps the lease for the next sweep: it is neither given up
// nor counted as such, once per sweep, while the process still holds it.
func TestLeaseSweepKeepsWhatItCannotQueue(t *testing.T) {
	l := &leaser{idle: 10, maxAge: 10}
	q := &leaseShard{l: l, jobs: make(chan job, 1), keys: map[string]*lease{"k": {ver: 1, left: 5}}}
	q.jobs <- job{} // the queue is full
	for now := int64(100); now < 200; now += 10 {
		q.sweep(now)
	}
	require.Zero(t, l.forfeited.load())
	require.Equal(t, int64(5), q.keys["k"].left, "still held")
	<-q.jobs
	q.sweep(300)
	require.Zero(t, q.keys["k"].left)
	require.Equal(t, job{gift{"k", 5, 1}, true, true}, <-q.jobs)
	// On their way back, the tokens still count against the bound, and keep
	// the key, until the fetcher's post says they are back.
	require.Equal(t, int64(5), q.keys["k"].back)
	require.Equal(t, 1, q.pending)
	q.sweep(400)
	require.Contains(t, q.keys, "k")
	q.settle(post{back: []gift{{"k", 5, 1}}})
	require.Zero(t, q.keys["k"].back)
	require.Zero(t, q.pending)
	q.sweep(500)
	require.NotContains(t, q.keys, "k")
}

// The tokens of a lease on their way back to Redis count against the
// bound as those it holds do: the next lease asked for is what is left.
func TestLeaseWantCountsTokensGoingBack(t *testing.T) {
	l := &leaser{horizon: 100}
	k := &lease{max: 62, reserve: 500, remaining: 1000, used: 1000, back: 50}
	require.Equal(t, int64(12), l.want(50, k, 1))
	k.back = 61
	require.Zero(t, l.want(50, k, 1), "one token is no lease")
}

// A bucket in debt near the int64 edge keeps nothing over its reserve: no
// lease is asked for (remaining - cost - reserve must not wrap).
func TestLeaseWantInDeepDebt(t *testing.T) {
	l := &leaser{horizon: 100}
	k := &lease{max: math.MaxInt64 / 16, reserve: math.MaxInt64 - math.MaxInt64/2, remaining: -math.MaxInt64, used: 1 << 40}
	require.Zero(t, l.want(50, k, 4))
	k.remaining = math.MaxInt64 // and a full one leases what the demand asks
	require.Equal(t, int64(1<<40), l.want(50, k, 4))
}

// A denial whose waits saturate (over 292 years: a rate far too slow for
// the cost, or a server clock centuries behind its bucket) is kept as any
// other, MaxAge at most, and answers with waits that stay saturated
// (never): its reading plus its waits saturate rather than wrap, which dropped
// the denial at once and let the reset of an admission learned after it
// (a second) win over its own.
func TestLeaseDenialAtTheClocksEnd(t *testing.T) {
	const at, now, maxAge = int64(5e9), int64(5e9 + 1), int64(1e9)
	k := &lease{}
	d := engine.Decision{Remaining: 0, Limit: 10, RetryAfter: math.MaxInt64, ResetAfter: math.MaxInt64}
	k.learn(at, d)
	k.deniedCost, k.deniedAt, k.denial = 1, at, d
	k.learn(at, engine.Decision{Allowed: true, Remaining: 3, Limit: 10, ResetAfter: time.Second}) // decided before the denial, learned after
	require.True(t, k.denialHolds(now, maxAge))
	got := k.answer(now, false)
	require.Equal(t, time.Duration(math.MaxInt64), got.RetryAfter)
	require.Equal(t, time.Duration(math.MaxInt64), got.ResetAfter)
}

// The lease counters stop at math.MaxUint64 rather than wrap: a lease may
// be most of a capacity near math.MaxInt64, and a few such leases given up
// would otherwise read as a handful of tokens.
func TestLeaseCountersSaturate(t *testing.T) {
	l := &leaser{s: &Store{}}
	l.forfeited.add(math.MaxInt64)
	l.forfeited.add(math.MaxInt64)
	l.lost(math.MaxInt64, errors.New("no answer"))
	require.Equal(t, uint64(math.MaxUint64), l.forfeited.load())
	l.lost(1, errors.New("no answer"))
	require.Equal(t, uint64(math.MaxUint64), l.forfeited.load())
}
