package shard

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// TestSweepSlicesInterleaved runs a pass in slices of 3 with requests served
// between the slices, as the loop does: keys full at every slice reading are
// evicted, depleted keys never are, and keys created during the pass survive
// it even once they are full. Every count is exact.
func TestSweepSlicesInterleaved(t *testing.T) {
	const sec, keys = int64(time.Second), 80
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	budget := NewBudget(1000)
	s := newState(NewLimits(p), budget, &testHasher)
	s.tab.maxGroups = 1 // many small segments, so a slice of 3 slots is one of them
	defer s.abandon()
	for i := range keys {
		require.NoError(t, s.allow(0, fmt.Sprintf("full%d", i), 1).Err) // full again by 0.5 s
	}
	for i := range keys {
		require.NoError(t, s.allow(9*sec, fmt.Sprintf("deep%d", i), 10).Err) // empty at 9 s
	}

	s.beginSweep(false)
	require.True(t, s.sweeping())
	now, born, slices := 10*sec, 0, 0
	for {
		done, err := s.sweepSlice(now, 3)
		require.NoError(t, err)
		slices++
		s.checkInvariants(t, "slice %d", slices)
		if done {
			break
		}
		// Between slices: a new key (not full: it spent a token), and time
		// moves on by 100 ms, so each new key is full 5 slices later while
		// the deep keys (2 tokens/s from empty at 9 s) stay below 10.
		r := s.allow(now, fmt.Sprintf("born%d", born), 1)
		require.NoError(t, r.Err)
		born++
		now += sec / 10
		s.checkInvariants(t, "born%d created", born-1)
	}
	got := s.endSweep(nil)
	s.checkInvariants(t, "the pass ended")
	require.False(t, s.sweeping())
	assert.Greater(t, slices, 10, "the pass really was sliced")
	assert.Equal(t, keys, got.Evicted, "every full key, and nothing else")
	assert.Equal(t, int64(keys+born), budget.Count(), "depleted and born keys remain")
	for i := range keys {
		_, ok := s.bucket(fmt.Sprintf("deep%d", i))
		assert.True(t, ok, "deep%d was evicted while not full", i)
	}
	for i := range born {
		_, ok := s.bucket(fmt.Sprintf("born%d", i))
		assert.True(t, ok, "born%d was created after the pass began and must survive it", i)
	}

	// The next pass sees the born keys like any other: ten seconds on, they
	// and the deep keys are all full.
	r := sweepAll(s, now+10*sec)
	require.NoError(t, r.Err)
	s.checkInvariants(t, "the next pass ended")
	assert.Equal(t, born+keys, r.Evicted)
	assert.Zero(t, budget.Count())
}

// TestSweepSliceRegression: a slice whose reading went back ends the pass
// with ErrClockRegression; what earlier slices evicted is counted.
func TestSweepSliceRegression(t *testing.T) {
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1}), NewBudget(100), &testHasher)
	s.tab.maxGroups = 1
	for i := range 30 {
		require.NoError(t, s.allow(0, fmt.Sprintf("k%d", i), 1).Err)
	}
	s.beginSweep(false)
	done, err := s.sweepSlice(int64(2*time.Second), 4)
	require.NoError(t, err)
	require.False(t, done)
	first := 30 - int(s.budget.Count())
	require.Positive(t, first, "the first slice evicted its segment's keys")
	s.checkInvariants(t, "the first slice")
	done, err = s.sweepSlice(int64(time.Second), 4)
	require.True(t, done)
	got := s.endSweep(err)
	s.checkInvariants(t, "the failed pass ended")
	assert.ErrorIs(t, got.Err, msg.ErrClockRegression)
	assert.Equal(t, first, got.Evicted, "the failed slice evicted nothing")
	assert.Equal(t, int64(30-first), s.budget.Count())
	assert.Equal(t, 30-first, s.keyCount())
}

// sweepAll runs a whole sweep pass at one reading, as the loop does when
// nothing arrives between slices: every bucket full at now is removed, and a
// reading older than the last one observed is ErrClockRegression with
// nothing removed.
func sweepAll(s *State, now int64) msg.SweepReply {
	if now < s.last {
		return msg.SweepReply{Err: msg.ErrClockRegression}
	}
	s.beginSweep(false)
	for {
		if done, err := s.sweepSlice(now, SliceSize); done {
			return s.endSweep(err)
		}
	}
}

// TestConvertSliceBoundedByLooking: a conversion slice is bounded by the
// slots it looks at, not only by the buckets it converts, so a pass whose
// stale buckets are few and far apart still yields often.
func TestConvertSliceBoundedByLooking(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	s := newState(NewLimits(p), NewBudget(10_000), &testHasher)
	defer s.abandon()
	for i := range 5000 {
		require.NoError(t, s.allow(0, fmt.Sprintf("k%d", i), 1).Err)
	}
	for v := int64(2); v <= convertAfter+2; v++ {
		require.NoError(t, s.prepare(v*sec, NewLimits(policy.Policy{Version: v, Capacity: 100, TokensPerSecond: v})))
		s.publish()
	}
	require.True(t, s.converting())
	// Traffic converts all but one bucket.
	for i := 1; i < 5000; i++ {
		require.NoError(t, s.allow(20*sec, fmt.Sprintf("k%d", i), 1).Err)
	}
	require.Equal(t, 1, s.stale)
	s.checkInvariants(t, "before the pass")
	slices := 1
	for !s.convertSlice(100) {
		slices++
		s.checkInvariants(t, "slice %d", slices)
	}
	s.checkInvariants(t, "after the pass")
	assert.Greater(t, slices, 1, "a slice looks at about 100 slots, not the whole table")
	assert.Len(t, s.gens, 1)
}

// TestFailedSweepRestartsConversion: a sweep replaces a conversion pass;
// if it fails part-way, a conversion pass starts again, so a long history
// does not stay long.
func TestFailedSweepRestartsConversion(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}
	s := newState(NewLimits(p), NewBudget(1000), &testHasher)
	s.tab.maxGroups = 1
	defer s.abandon()
	for i := range 100 {
		require.NoError(t, s.allow(0, fmt.Sprintf("k%d", i), 1).Err)
	}
	for v := int64(2); v <= convertAfter+2; v++ {
		require.NoError(t, s.prepare(v*sec, NewLimits(policy.Policy{Version: v, Capacity: 100, TokensPerSecond: 1})))
		s.publish()
	}
	require.True(t, s.converting())
	s.beginSweep(false)
	done, err := s.sweepSlice(20*sec, 3)
	require.NoError(t, err)
	require.False(t, done)
	s.checkInvariants(t, "a slice of the sweep")
	done, err = s.sweepSlice(19*sec, 3) // the clock stepped back
	require.True(t, done)
	s.endSweep(err)
	s.checkInvariants(t, "the failed sweep ended")
	assert.True(t, s.converting(), "conversion resumes after the failed sweep")
	for !s.convertSlice(SliceSize) {
	}
	s.checkInvariants(t, "the conversion ended")
	assert.Len(t, s.gens, 1)
}

// TestKeyCreatedAfterSweepWalkIsNotBorn: between the slice that ends a
// sweep's walk and endSweep, a new key is not marked born: the next sweep
// judges it like any other.
func TestKeyCreatedAfterSweepWalkIsNotBorn(t *testing.T) {
	const sec = int64(time.Second)
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}), NewBudget(100), &testHasher)
	require.NoError(t, s.allow(0, "old", 1).Err)
	s.beginSweep(false)
	for {
		done, err := s.sweepSlice(sec, SliceSize)
		require.NoError(t, err)
		if done {
			break
		}
	}
	_, ok := s.bucket("old")
	require.False(t, ok, "full at one second: the first sweep evicted it")
	require.NoError(t, s.allow(sec, "new", 1).Err)
	s.checkInvariants(t, "new created after the walk")
	s.endSweep(nil)
	s.checkInvariants(t, "the sweep ended")
	assert.Equal(t, 1, sweepAll(s, 10*sec).Evicted, "full ten seconds on, and not spared as born")
	_, ok = s.bucket("new")
	assert.False(t, ok)
}

// TestSweepSoonest: a sweep asked to estimate reports the reading at which
// the first bucket it kept is full again, computed exactly; one not asked
// reports none, and so does one that kept nothing.
func TestSweepSoonest(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 3}
	s := newState(NewLimits(p), NewBudget(100), &testHasher)
	defer s.abandon()
	require.NoError(t, s.allow(0, "a", 10).Err)   // full at ceil(10e9/3) ns
	require.NoError(t, s.allow(0, "b", 1).Err)    // full at ceil(1e9/3) ns
	require.NoError(t, s.allow(sec, "c", 10).Err) // full at 1 s + ceil(10e9/3) ns

	sweep := func(estimate bool, now int64) msg.SweepReply {
		s.beginSweep(estimate)
		for {
			done, err := s.sweepSlice(now, SliceSize)
			require.NoError(t, err)
			s.checkInvariants(t, "a slice at %d", now)
			if done {
				return s.endSweep(nil)
			}
		}
	}
	r := sweep(true, sec) // b is full by now and goes; a is the soonest kept
	assert.Equal(t, 1, r.Evicted)
	assert.Equal(t, (10*sec+2)/3, r.Soonest, "ceil(10e9/3) ns: a refills from empty at 0")

	r = sweep(false, sec)
	assert.Zero(t, r.Evicted)
	assert.Zero(t, r.Soonest, "not asked")

	r = sweep(true, 100*sec)
	assert.Equal(t, 2, r.Evicted)
	assert.Equal(t, int64(math.MaxInt64), r.Soonest, "nothing kept")
}

// TestSweepSoonestSaturates: a kept bucket whose refill takes longer than
// the clock can count is full no sooner than the end of time. The reading
// plus its saturated wait overflows int64; wrapped, it would name an instant
// long past, and a reclaimer would sweep again at once for a bucket that
// never fills.
func TestSweepSoonestSaturates(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: math.MaxInt64, TokensPerSecond: 1}
	s := newState(NewLimits(p), NewBudget(10), &testHasher)
	defer s.abandon()
	require.NoError(t, s.allow(0, "deep", math.MaxInt64).Err) // empty: full in MaxInt64 s, saturated as ns
	s.beginSweep(true)
	for {
		done, err := s.sweepSlice(sec, SliceSize)
		require.NoError(t, err)
		if done {
			break
		}
	}
	r := s.endSweep(nil)
	assert.Zero(t, r.Evicted)
	assert.Equal(t, int64(math.MaxInt64), r.Soonest, "1 s + a saturated wait is the end of time, not a wrapped past")
}

// TestBudgetFullSignals: a failed reservation signals Full once, however
// many fail before it is read, and a successful one does not.
func TestBudgetFullSignals(t *testing.T) {
	b := NewBudget(1)
	require.True(t, b.reserve())
	select {
	case <-b.Full():
		t.Fatal("a reservation that succeeded signalled Full")
	default:
	}
	for range 3 {
		require.False(t, b.reserve())
	}
	select {
	case <-b.Full():
	default:
		t.Fatal("failed reservations did not signal Full")
	}
	select {
	case <-b.Full():
		t.Fatal("three failures signalled more than once")
	default:
	}
}

// TestSweepSparesKeysChargedIntoBeing: a key that Charge creates while a
// sweep is in progress survives that sweep even once it is full again,
// exactly as a key Allow creates does.
func TestSweepSparesKeysChargedIntoBeing(t *testing.T) {
	const sec = int64(time.Second)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}
	budget := NewBudget(1000)
	s := newState(NewLimits(p), budget, &testHasher)
	s.tab.maxGroups = 1
	defer s.abandon()
	for i := range 80 {
		require.NoError(t, s.allow(9*sec, fmt.Sprintf("deep%d", i), 10).Err)
	}
	s.beginSweep(false)
	now, born := 10*sec, 0
	for {
		done, err := s.sweepSlice(now, 3)
		require.NoError(t, err)
		if done {
			break
		}
		require.NoError(t, s.chargeKey(now, fmt.Sprintf("cborn%d", born), 1).Err)
		born++
		now += sec / 10 // each charged key is full again 5 slices later
	}
	got := s.endSweep(nil)
	assert.Zero(t, got.Evicted)
	for i := range born {
		_, ok := s.bucket(fmt.Sprintf("cborn%d", i))
		assert.True(t, ok, "cborn%d was created after the pass began and must survive it", i)
	}
}

// TestStoppedSweepUnmarksInSlices: a sweep its caller stops judges nothing
// more, and clears the marks of the keys born during it a slice at a time,
// with requests served between slices: no one slice walks the table. Keys
// born ahead of the cursor are then judged by the next sweep like any other.
func TestStoppedSweepUnmarksInSlices(t *testing.T) {
	const sec, keys = int64(time.Second), 200
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}), NewBudget(1000), &testHasher)
	s.tab.maxGroups = 1 // many small segments, so a slice of 3 slots is one of them
	defer s.abandon()
	for i := range keys {
		require.NoError(t, s.allow(0, fmt.Sprintf("full%d", i), 1).Err) // full again by 0.5 s
	}
	s.beginSweep(false)
	done, err := s.sweepSlice(sec, 3)
	require.NoError(t, err)
	require.False(t, done)
	evicted := keys - int(s.budget.Count())
	born, slices := 0, 0
	for {
		done := s.unmarkSlice(3)
		slices++
		s.checkInvariants(t, "unmark slice %d", slices)
		if done {
			break
		}
		require.NoError(t, s.allow(sec, fmt.Sprintf("born%d", born), 1).Err)
		born++
	}
	assert.Greater(t, slices, 10, "the walk that judges nothing is sliced too")
	assert.Equal(t, int64(keys-evicted+born), s.budget.Count(), "a stopped sweep evicts nothing more")
	got := s.endSweep(msg.ErrSweepStopped)
	assert.ErrorIs(t, got.Err, msg.ErrSweepStopped)
	assert.Equal(t, evicted, got.Evicted)
	s.checkInvariants(t, "the stopped pass ended")
	assert.Equal(t, keys-evicted+born, sweepAll(s, 10*sec).Evicted, "every key, the born ones too, full ten seconds on")
	assert.Zero(t, s.budget.Count())
}
