package shard

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// eager is the obvious reference for State: it converts every bucket at each
// cutover instead of lazily, and never drops history because it keeps none.
type eager struct {
	pol     policy.Policy
	buckets map[string]policy.Bucket
	last    int64
	max     int
}

func (m *eager) allow(now int64, key string, cost int64) msg.Reply {
	if cost > m.pol.Capacity {
		return msg.Reply{Err: msg.ErrCostExceedsCapacity}
	}
	if now < m.last {
		return msg.Reply{Err: msg.ErrClockRegression}
	}
	b, ok := m.buckets[key]
	if !ok {
		if len(m.buckets) >= m.max {
			return msg.Reply{Err: msg.ErrKeyCapacity}
		}
		b = policy.NewBucket(m.pol.Limit(), now)
	}
	o := b.Decide(m.pol.Limit(), now, cost)
	m.buckets[key] = b
	m.last = now
	return msg.Reply{Decision: decision.Decision{
		Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: durationOf(o.RetryAfter),
		Version: m.pol.Version, Limit: m.pol.Capacity, ResetAfter: durationOf(o.ResetAfter),
	}}
}

func (m *eager) cutover(now int64, next policy.Policy) error {
	if now < m.last {
		return msg.ErrClockRegression
	}
	for k, b := range m.buckets {
		b.Cutover(m.pol.Limit(), next.Limit(), now)
		m.buckets[k] = b
	}
	m.pol, m.last = next, now
	return nil
}

func (m *eager) sweep(now int64) msg.SweepReply {
	if now < m.last {
		return msg.SweepReply{Err: msg.ErrClockRegression}
	}
	n := 0
	for k, b := range m.buckets {
		b.Refill(m.pol.Limit(), now)
		if b.Full(m.pol.Limit()) {
			delete(m.buckets, k)
			n++
		}
	}
	m.last = now
	return msg.SweepReply{Evicted: n}
}

// TestStateMatchesEagerCutover drives State and the eager reference with the
// same random trace: allows over a few keys, sweeps, cutovers that raise and
// lower capacity and rate, clock steps of 0, 1 ns, typical and huge amounts,
// and now and then a step back. Every answer must be identical, and so must
// every balance once both are brought to the same instant. Long runs without
// sweeps push the lazy history past maxGenerations.
func TestStateMatchesEagerCutover(t *testing.T) {
	skipUnderRace(t)
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, seed*7919))
			start := policy.Policy{Version: 1, Capacity: 1 + r.Int64N(20), TokensPerSecond: 1 + r.Int64N(5)}
			maxKeys := 3 + r.IntN(6)
			budget := NewBudget(int64(maxKeys))
			s := newState(NewLimits(start), budget, &testHasher)
			if seed%2 == 1 {
				s.tab.maxGroups = 1 // one group per segment: splits all the time
			}
			defer s.abandon()
			m := &eager{pol: start, buckets: map[string]policy.Bucket{}, max: maxKeys}
			now := int64(0)
			sweepOdds := 20 + r.IntN(400) // some seeds almost never sweep
			for step := range 3000 {
				now = stepClock(r, now)
				if s.converting() && r.IntN(3) == 0 {
					// The loop converts between messages; here, at random
					// points of the trace, a few buckets at a time.
					s.convertSlice(1 + r.IntN(3))
				}
				switch op := r.IntN(sweepOdds); {
				case op == 0:
					got, want := sweepAll(s, now), m.sweep(now)
					require.Equal(t, want, got, "seed %d step %d: sweep at %d", seed, step, now)
				case op < 4:
					next := randomPolicy(r, m.pol.Version+1)
					wantErr := m.cutover(now, next)
					gotErr := s.prepare(now, NewLimits(next))
					require.Equal(t, wantErr, gotErr, "seed %d step %d: prepare", seed, step)
					if gotErr == nil {
						s.publish()
					}
				default:
					key := fmt.Sprintf("k%d", r.IntN(maxKeys+2))
					c := m.pol.Capacity
					cost := 1 + r.Int64N(min(c, 40))
					switch r.IntN(10) {
					case 0:
						cost = c
					case 1:
						if c < math.MaxInt64 {
							cost = c + 1 // above capacity: ErrCostExceedsCapacity
						}
					}
					got, want := s.allow(now, key, cost), m.allow(now, key, cost)
					require.Equal(t, want, got, "seed %d step %d: allow %q cost %d at %d", seed, step, key, cost, now)
				}
				require.Equal(t, int64(len(m.buckets)), budget.Count(), "seed %d step %d: key count", seed, step)
				require.LessOrEqual(t, len(s.gens), maxGenerations+1, "seed %d: history unbounded", seed)
				s.checkInvariants(t, "seed %d step %d", seed, step)
			}
			// Same balances when both are brought to the final instant.
			lim := m.pol.Limit()
			for k, want := range m.buckets {
				got, _ := s.bucket(k)
				s.bringUp(&got, k)
				got.Refill(lim, now)
				want.Refill(lim, now)
				got.Epoch, want.Epoch = 0, 0
				assert.Equal(t, want, got, "seed %d: bucket %q", seed, k)
			}
		})
	}
}

// stepClock moves now by a step drawn from the boundary cases, sometimes
// backwards (which must be rejected) and saturating at math.MaxInt64.
func stepClock(r *rand.Rand, now int64) int64 {
	var d int64
	switch r.IntN(12) {
	case 0, 1:
		d = 0
	case 2:
		d = 1
	case 3:
		d = 333_333_333
	case 4:
		d = -1 - r.Int64N(1_000_000) // a regression
	case 5:
		d = r.Int64N(math.MaxInt64 / 64) // huge
	default:
		d = r.Int64N(2_000_000_000)
	}
	next := now + d
	switch {
	case d > 0 && next < now:
		return math.MaxInt64
	case next < 0:
		return 0
	}
	return next
}

func randomPolicy(r *rand.Rand, version int64) policy.Policy {
	p := policy.Policy{Version: version, Capacity: 1 + r.Int64N(25), TokensPerSecond: 1 + r.Int64N(8)}
	if r.IntN(20) == 0 {
		p.Capacity = math.MaxInt64
	}
	if r.IntN(20) == 0 {
		p.TokensPerSecond = math.MaxInt64
	}
	return p
}

// TestStateHistoryCompacts checks the lazy history is dropped once every
// bucket has been converted, and bounded when no bucket is ever touched.
func TestStateHistoryCompacts(t *testing.T) {
	const sec = int64(time.Second)
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}), NewBudget(10), &testHasher)
	defer s.abandon()
	require.NoError(t, s.allow(0, "a", 10).Err)
	require.NoError(t, s.allow(0, "b", 10).Err)
	for v := int64(2); v <= 5; v++ {
		require.NoError(t, s.prepare(v*sec, NewLimits(policy.Policy{Version: v, Capacity: 10, TokensPerSecond: 1})))
		s.publish()
	}
	assert.Len(t, s.gens, 5, "four cutovers, nothing touched: five generations kept")
	got := s.allow(6*sec, "a", 1)
	require.NoError(t, got.Err)
	assert.Equal(t, int64(5), got.Decision.Remaining, "6 s at 1/s across four cutovers, minus 1")
	assert.Len(t, s.gens, 5, "b still needs the history")
	s.checkInvariants(t, "a converted")
	s.allow(6*sec, "b", 1)
	assert.Len(t, s.gens, 1, "every bucket converted: history dropped")
	s.checkInvariants(t, "b converted")

	// Cutovers with nothing touched in between stay bounded.
	for v := int64(6); v < 6+3*maxGenerations; v++ {
		require.NoError(t, s.prepare(6*sec+v, NewLimits(policy.Policy{Version: v, Capacity: 10, TokensPerSecond: 1})))
		s.publish()
		require.LessOrEqual(t, len(s.gens), maxGenerations)
		s.checkInvariants(t, "version %d", v)
	}
	got = s.allow(7*sec, "a", 1)
	require.NoError(t, got.Err)
	assert.Equal(t, int64(5), got.Decision.Remaining, "one more second across 192 cutovers, minus 1")
}

// TestStateDroppedKeyIsNew: a key dropped right after it was decided comes
// back as a new key, with a full bucket counted against the budget, whatever
// the key. The table's memo of the last slot found once answered the empty
// key, which State accepts, from its dropped slot: a bucket tracked by
// nothing.
func TestStateDroppedKeyIsNew(t *testing.T) {
	for _, key := range []string{"", "k"} {
		s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}), NewBudget(10), &testHasher)
		require.NoError(t, s.allow(1, key, 4).Err)
		require.True(t, s.Drop(key, testHasher.Sum(key)))
		s.checkInvariants(t, "key %q dropped", key)
		got := s.allow(2, key, 1)
		require.NoError(t, got.Err)
		assert.Equal(t, int64(9), got.Decision.Remaining, "key %q: a full bucket, minus 1", key)
		assert.Equal(t, 1, s.keyCount(), "key %q is tracked again", key)
		s.abandon()
	}
}

// TestStatePrepareAbort checks a prepare that is aborted changes nothing, and
// that a prepare with a regressed clock is refused with nothing staged.
func TestStatePrepareAbort(t *testing.T) {
	p1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	s := newState(NewLimits(p1), NewBudget(10), &testHasher)
	require.NoError(t, s.allow(100, "a", 10).Err)
	require.ErrorIs(t, s.prepare(99, NewLimits(policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1})), msg.ErrClockRegression)
	require.False(t, s.prepared)
	require.NoError(t, s.prepare(200, NewLimits(policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1})))
	require.True(t, s.prepared)
	s.abort()
	require.False(t, s.prepared)
	s.publish() // nothing staged: no effect
	assert.Equal(t, p1, s.policyInForce())
	// The aborted prepare's reading was not observed: 150 is not a regression.
	got := s.allow(150, "a", 1)
	require.NoError(t, got.Err)
	assert.Equal(t, int64(1), got.Decision.Version)
}

func durationOf(ns int64) time.Duration { return time.Duration(ns) }

// TestStateConversionPass: past convertAfter generations a background pass
// converts untouched buckets; run to the end, it empties the history, and
// every balance is what the eager rule gives.
func TestStateConversionPass(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	s := newState(NewLimits(p), NewBudget(100), &testHasher)
	s.tab.maxGroups = 1 // many small segments, so a slice of 7 slots is one of them
	defer s.abandon()
	m := &eager{pol: p, buckets: map[string]policy.Bucket{}, max: 100}
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		require.Equal(t, m.allow(0, key, int64(1+i)), s.allow(0, key, int64(1+i)))
	}
	for v := int64(2); v <= convertAfter+2; v++ {
		next := policy.Policy{Version: v, Capacity: 100 - 5*v, TokensPerSecond: v}
		require.NoError(t, m.cutover(v*sec, next))
		require.NoError(t, s.prepare(v*sec, NewLimits(next)))
		s.publish()
	}
	require.True(t, s.converting(), "more than convertAfter generations start a pass")
	require.Greater(t, len(s.gens), convertAfter)
	slices := 0
	for !s.convertSlice(7) {
		slices++
		s.checkInvariants(t, "slice %d", slices)
	}
	s.checkInvariants(t, "after the pass")
	assert.Greater(t, slices, 3, "the pass really was sliced")
	assert.False(t, s.converting())
	assert.Len(t, s.gens, 1, "every bucket converted: history dropped")
	now := 20 * sec
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		require.Equal(t, m.allow(now, key, 1), s.allow(now, key, 1), "key %s", key)
	}
}

// testHasher hashes keys for states and messages built by tests, as an
// engine's hasher does for its shards.
var testHasher = NewHasher(0x5eed)

// TestBatchMatchesSingles: a batch decided on a table large enough to warm
// (hints, prefetches, keys created mid-batch that rehash the slots the hints
// point at) answers exactly what the same requests made one by one give,
// and leaves every bucket the same.
func TestBatchMatchesSingles(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 2}
	h := NewHasher(3)
	batched, single := newState(NewLimits(p), NewBudget(1<<20), &h), newState(NewLimits(p), NewBudget(1<<20), &h)
	key := func(i int) string {
		if i%5 == 0 {
			return fmt.Sprintf("a-key-long-enough-for-the-arena:%d", i) // past inlineKey
		}
		return fmt.Sprintf("k%d", i)
	}
	const known = 2 * warmFrom
	for i := range known {
		require.NoError(t, batched.allow(0, key(i), 1).Err)
		require.NoError(t, single.allow(0, key(i), 1).Err)
	}
	require.Equal(t, canPrefetch, batched.worthWarming(2), "large enough to warm where a build can")
	r := rand.New(rand.NewPCG(1, 2))
	next := known
	for round := range 50 {
		now := int64(round+1) * 3e8
		m := msg.Batch{}
		for range 1 + r.IntN(300) {
			i := r.IntN(known)
			if r.IntN(3) == 0 {
				i, next = next, next+1 // a new key: enough of them rehash
			}
			m.Items = append(m.Items, msg.Item{Key: key(i), Hash: h.Sum(key(i)), Cost: 1 + r.Int64N(2)})
		}
		m.Out = make([]msg.Reply, len(m.Items))
		batched.batch(now, &m)
		for i, it := range m.Items {
			require.Equal(t, single.allow(now, it.Key, it.Cost), m.Out[i], "round %d item %d", round, i)
		}
		batched.checkInvariants(t, "round %d", round)
	}
	require.Equal(t, single.keyCount(), batched.keyCount())
	for i := range next {
		want, ok := single.bucket(key(i))
		got, _ := batched.bucket(key(i))
		require.True(t, ok)
		require.Equal(t, want, got, key(i))
	}
}

// TestDropStaleKeepsCount: dropping a bucket that is behind the policy in
// force leaves the count of such buckets right, so the history is dropped
// once the others convert (a wrong count would keep it, and with it every
// later cutover's generation, forever).
func TestDropStaleKeepsCount(t *testing.T) {
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	s := newState(NewLimits(v1), NewBudget(10), &testHasher)
	require.NoError(t, s.allow(1, "a", 1).Err)
	require.NoError(t, s.allow(1, "b", 1).Err)
	require.NoError(t, s.prepare(2, NewLimits(policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4})))
	s.publish()
	require.True(t, s.Drop("a", testHasher.Sum("a")))
	require.NoError(t, s.allow(3, "b", 1).Err) // converts the last stale bucket
	s.checkInvariants(t, "after dropping a stale bucket")
	assert.Len(t, s.gens, 1, "the history is dropped once no bucket needs it")
}

// TestPeekAndRefundClockRegression: Peek and Refund take the shard's reading
// like any request: one older than the latest reading a request observed is
// ErrClockRegression, for a tracked key of either form (a Bucket alone, or
// bands in the level store) and for a key not tracked, and changes nothing.
// A refund that succeeds records its reading, so a request read before it
// is ErrClockRegression in turn.
func TestPeekAndRefundClockRegression(t *testing.T) {
	daily, err := policy.NewBands(policy.Band{Name: "daily", Capacity: 100, Refill: policy.PerDay(100)})
	require.NoError(t, err)
	ov, err := policy.NewOverrideSet(policy.Override{Match: "plain", Capacity: 10, TokensPerSecond: 1})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Bands: daily, Overrides: ov}
	s := newState(NewLimits(p), NewBudget(10), &testHasher)
	for _, k := range []string{"plain", "banded"} {
		require.NoError(t, s.allow(5e9, k, 4).Err)
	}
	snapshot := func() map[string]msg.Reply {
		out := map[string]msg.Reply{}
		for _, k := range []string{"plain", "banded", "unknown"} {
			var r msg.Reply
			s.peek(5e9, k, s.hasher.Sum(k), &r)
			require.NoError(t, r.Err)
			out[k] = r
		}
		return out
	}
	before := snapshot()
	for _, k := range []string{"plain", "banded", "unknown"} {
		var r msg.Reply
		s.peek(4e9, k, s.hasher.Sum(k), &r)
		assert.Equal(t, msg.Reply{Err: msg.ErrClockRegression}, r, "peek %s at an older reading", k)
		r = msg.Reply{}
		s.refund(4e9, k, s.hasher.Sum(k), 3, &r)
		assert.Equal(t, msg.Reply{Err: msg.ErrClockRegression}, r, "refund %s at an older reading", k)
	}
	assert.Equal(t, before, snapshot(), "the errors changed nothing")
	assert.Equal(t, int64(2), s.budget.Count())
	s.checkInvariants(t, "after the regressions")

	for _, k := range []string{"plain", "banded"} {
		var r msg.Reply
		s.refund(7e9, k, s.hasher.Sum(k), 1, &r)
		require.NoError(t, r.Err, "refund %s", k)
		assert.Equal(t, msg.ErrClockRegression, s.allow(6e9, k, 1).Err,
			"6e9 is older than 7e9, which the refund of %s observed", k)
	}
}
