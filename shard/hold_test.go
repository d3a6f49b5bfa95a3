package shard

import (
	"context"
	"runtime"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/msg"
)

// keptAside sends a request of cost for key, held by a part, then a part
// for each of two other keys; once both are answered the shard has taken
// the request and kept it aside. Its reply arrives on the channel.
func keptAside(t *testing.T, l *loop, key string, cost int64) <-chan msg.Reply {
	t.Helper()
	a := &msg.Single{Key: key, Hash: testHasher.Sum(key), Cost: cost, Done: make(chan struct{}, 1)}
	require.NoError(t, l.mb.SendSingle(context.Background(), a))
	waiting := make(chan msg.Reply, 1)
	go func() { a.Wait(msg.WaitYields(1)); waiting <- a.Reply }()
	for _, k := range []string{"c", "d"} {
		p := &msg.Batch{Items: []msg.Item{{Key: k, Hash: testHasher.Sum(k), Cost: 1}}, Out: make([]msg.Reply, 1), Done: make(chan int, 1)}
		require.NoError(t, l.mb.SendBatch(context.Background(), p))
		<-p.Done
		require.True(t, p.Out[0].Decision.Allowed)
	}
	return waiting
}

// TestRunHoldIsPerKey: while a part holds key a, a request for key b is
// served, and one for a waits until the hold ends, then is decided after
// the commit.
func TestRunHoldIsPerKey(t *testing.T) {
	clk := zeroClock(64)
	budget := NewBudget(10)
	l := startLoop(p1, clk, budget)
	defer l.close()

	part := func(key string, cost int64) *msg.Batch {
		return &msg.Batch{Items: []msg.Item{{Key: key, Hash: testHasher.Sum(key), Cost: cost}},
			Out: make([]msg.Reply, 1), Done: make(chan int, 1), Hold: &msg.Hold{Snaps: make([]msg.Snap, 1)}}
	}
	b := part("a", 4)
	require.NoError(t, l.mb.SendBatch(context.Background(), b))
	<-b.Done
	require.NoError(t, b.Out[0].Err)
	require.Equal(t, []int{0}, b.Hold.Fresh, "a is new")

	got := <-allowAsync(t, l.mb, "b", 1)
	require.NoError(t, got.Err)
	assert.True(t, got.Decision.Allowed, "another key is served while a is held")

	// The request for a is queued before two batch parts for other keys:
	// once both are answered, the shard has taken it, and kept it aside.
	waiting := keptAside(t, l, "a", 10)
	select {
	case r := <-waiting:
		t.Fatalf("a request for the held key was answered during the hold: %+v", r)
	default:
	}

	require.True(t, b.Hold.Claim(), "nothing made the shard give the hold up")
	var d decision.Decision
	b.Hold.Snaps[0].Decide(0, 4, b.Hold.Version, &d)
	require.True(t, d.Allowed)
	assert.Equal(t, int64(6), d.Remaining)
	ok, _ := budget.ReserveN(1) // the caller's reservation for the new key a
	require.True(t, ok)
	require.True(t, b.Hold.End(msg.HoldCommit, 0, true))
	l.mb.SignalHold()
	r := <-waiting
	require.NoError(t, r.Err)
	assert.False(t, r.Decision.Allowed, "decided after the commit took 4 of a's 10")
	assert.Equal(t, int64(6), r.Decision.Remaining)
}

// holdPart returns a hold part over keys, cost 1 each, answered on its own
// Answers, expecting its answer.
func holdPart(try bool, keys ...string) *msg.Batch {
	b := &msg.Batch{Out: make([]msg.Reply, len(keys)),
		Hold: &msg.Hold{Try: try, Answers: msg.NewAnswers(), Snaps: make([]msg.Snap, len(keys))}}
	for _, k := range keys {
		b.Items = append(b.Items, msg.Item{Key: k, Hash: testHasher.Sum(k), Cost: 1})
	}
	b.Hold.Answers.Expect(1)
	return b
}

// sendHold sends b and waits for the shard's answer.
func sendHold(t *testing.T, l *loop, b *msg.Batch) {
	t.Helper()
	require.NoError(t, l.mb.SendBatch(context.Background(), b))
	b.Hold.Answers.Wait(1)
}

// TestRunTryHoldBusy: a Try part that names a held key waits for nothing:
// it is answered Busy at once, holding none of its keys, and the key it
// did not hold stays free for others.
func TestRunTryHoldBusy(t *testing.T) {
	clk := zeroClock(64)
	l := startLoop(p1, clk, NewBudget(10))
	defer l.close()

	held := holdPart(true, "a")
	sendHold(t, l, held)
	require.False(t, held.Hold.Busy, "a was free")
	require.NoError(t, held.Out[0].Err)

	busy := holdPart(true, "b", "a")
	sendHold(t, l, busy)
	assert.True(t, busy.Hold.Busy, "a is held by another part")

	got := <-allowAsync(t, l.mb, "b", 1)
	require.NoError(t, got.Err)
	assert.True(t, got.Decision.Allowed, "b was not held by the busy part")
	assert.Equal(t, int64(9), got.Decision.Remaining)

	require.True(t, held.Hold.End(msg.HoldAbort, 0, false))
	l.mb.SignalHold()
	again := holdPart(true, "b", "a")
	sendHold(t, l, again)
	assert.False(t, again.Hold.Busy, "a is free once the hold ends")
	require.True(t, again.Hold.End(msg.HoldAbort, 0, false))
	l.mb.SignalHold()
}

// TestRunControlEndsHolds: a control message makes the shard give a
// pending hold up at once (the caller's Claim then fails, and the key is
// free), but wait for a claimed one until its caller ends it.
func TestRunControlEndsHolds(t *testing.T) {
	clk := zeroClock(64)
	budget := NewBudget(10)
	l := startLoop(p1, clk, budget)
	defer l.close()
	ctx := context.Background()

	// A prepare is answered once served: every hold has ended by then.
	prepare := func() error {
		next := p1
		next.Version = 2
		return l.mb.Prepare(ctx, NewLimits(next), &msg.Prepare{Done: make(chan error, 1)})
	}
	pending := holdPart(false, "a")
	sendHold(t, l, pending)
	require.NoError(t, prepare())
	require.True(t, l.mb.Abort())
	assert.False(t, pending.Hold.Claim(), "the shard gave the pending hold up")
	assert.False(t, pending.Hold.End(msg.HoldAbort, 0, false), "nothing is left to end")
	got := <-allowAsync(t, l.mb, "a", 1)
	require.NoError(t, got.Err)
	assert.Equal(t, int64(9), got.Decision.Remaining, "a was free, and nothing was taken from it")

	claimed := holdPart(false, "a")
	sendHold(t, l, claimed)
	require.True(t, claimed.Hold.Claim())
	ready := make(chan error, 1)
	go func() { ready <- prepare() }()
	for l.mb.control.Load() != 0 { // until the shard has taken the control message
		runtime.Gosched()
	}
	select {
	case err := <-ready:
		t.Fatalf("the control message was served before the claimed hold ended (%v)", err)
	default:
	}
	require.True(t, claimed.Hold.End(msg.HoldCommit, 0, true))
	l.mb.SignalHold()
	require.NoError(t, <-ready)
	require.True(t, l.mb.Abort())
	got = <-allowAsync(t, l.mb, "a", 1)
	require.NoError(t, got.Err)
	assert.Equal(t, int64(7), got.Decision.Remaining, "the commit took 1 before the control message")
}

// TestRunHoldReleases: the shard releases a hold part (its caller may then
// reuse the part's memory) on every way it ends, and not while it holds
// the part's keys.
func TestRunHoldReleases(t *testing.T) {
	clk := zeroClock(256)
	l := startLoop(p1, clk, NewBudget(100))
	ctx := context.Background()
	settle := func() { // a served single request: the shard has had a turn since
		<-allowAsync(t, l.mb, "zz", 1)
	}

	held := holdPart(true, "a")
	sendHold(t, l, held)
	assert.False(t, held.Hold.Released(), "kept: not released")
	busy := holdPart(true, "a")
	sendHold(t, l, busy)
	assert.True(t, busy.Hold.Busy)
	assert.True(t, busy.Hold.Released(), "busy: released at its answer")
	bad := holdPart(false, "b")
	bad.Items[0].Cost = 1000
	sendHold(t, l, bad)
	assert.Error(t, bad.Out[0].Err)
	assert.True(t, bad.Hold.Released(), "refused: released at its answer")

	require.True(t, held.Hold.End(msg.HoldAbort, 0, false))
	l.mb.SignalHold()
	settle()
	assert.True(t, held.Hold.Released(), "aborted: released")

	c := holdPart(true, "a")
	sendHold(t, l, c)
	require.True(t, c.Hold.Claim())
	require.True(t, c.Hold.End(msg.HoldCommit, 0, true))
	l.mb.SignalHold()
	settle()
	assert.True(t, c.Hold.Released(), "committed: released")

	g := holdPart(false, "a")
	sendHold(t, l, g)
	next := p1
	next.Version = 2
	require.NoError(t, l.mb.Prepare(ctx, NewLimits(next), &msg.Prepare{Done: make(chan error, 1)}))
	assert.True(t, g.Hold.Released(), "given up: released")
	require.True(t, l.mb.Abort())

	// Held at stop: a claimed hold is waited for, a pending one given up.
	p := holdPart(true, "p")
	sendHold(t, l, p)
	cl := holdPart(true, "q")
	sendHold(t, l, cl)
	require.True(t, cl.Hold.Claim())
	closed := make(chan struct{})
	go func() { l.close(); close(closed) }()
	require.True(t, cl.Hold.End(msg.HoldAbort, 0, false))
	l.mb.SignalHold()
	<-closed
	assert.True(t, p.Hold.Released(), "pending at stop: released")
	assert.True(t, cl.Hold.Released(), "claimed at stop: released")
}

// TestRunTryAfterOwnEnd: a caller that holds the same key call after call
// ends its hold and at once sends its next Try part; a parked shard serves
// the part as it wakes, before its turn looks at the holds, and must carry
// out the end first rather than answer Busy for the caller's own ended
// hold.
func TestRunTryAfterOwnEnd(t *testing.T) {
	clk := zeroClock(64)
	l := startLoop(p1, clk, NewBudget(10))
	defer l.close()
	for range 20 {
		first := holdPart(true, "a")
		sendHold(t, l, first)
		require.False(t, first.Hold.Busy)
		for !l.mb.sleeping.Load() { // until the shard is about to park
			runtime.Gosched()
		}
		require.True(t, first.Hold.Claim())
		require.True(t, first.Hold.End(msg.HoldCommit, 0, true)) // no signal: the next part wakes it
		next := holdPart(true, "a")
		sendHold(t, l, next)
		require.False(t, next.Hold.Busy, "the shard answered Busy for a hold its caller had ended")
		require.True(t, next.Hold.End(msg.HoldAbort, 0, false))
		l.mb.SignalHold()
	}
}

// zeroClock returns a gate clock that reads 0 n times: for tests that need
// no gate.
func zeroClock(n int) gateClock {
	clk := make(gateClock, n)
	for range n {
		clk <- 0
	}
	return clk
}

// TestHoldEndSentBeforeWorkComesFirst: a caller ends its hold, then sends
// more work for other keys of the shard. When the end reaches the shard
// after its turn's holds step, the work must still be served after the
// end: the call's instant counts as observed, so a reading older than it
// is ErrClockRegression, for a single request and for a batch part, as it
// would be had the holds step seen the end.
func TestHoldEndSentBeforeWorkComesFirst(t *testing.T) {
	for _, batch := range []bool{false, true} {
		clk := make(gateClock, 2)
		clk <- 100 // the hold's reading, and the call's instant
		clk <- 50  // the next work's, older
		budget := NewBudget(10)
		mb := NewMailbox(8, make(chan struct{}))
		s := New(NewLimits(p1), clk, budget, mb, &testHasher)
		held := holdPart(false, "a")
		s.serveHold(held) // the loop's steps are called here, so the test places the end between them
		require.NoError(t, held.Out[0].Err)
		require.True(t, held.Hold.Claim())
		ok, _ := budget.ReserveN(1) // the caller's room for the new key a
		require.True(t, ok)
		require.True(t, held.Hold.End(msg.HoldCommit, 100, true))
		var got msg.Reply
		if batch {
			b := &msg.Batch{Items: []msg.Item{{Key: "b", Hash: testHasher.Sum("b"), Cost: 1}}, Out: make([]msg.Reply, 1), Done: make(chan int, 1)}
			require.NoError(t, mb.SendBatch(context.Background(), b))
			require.True(t, s.serveData())
			<-b.Done
			got = b.Out[0]
		} else {
			a := &msg.Single{Key: "b", Hash: testHasher.Sum("b"), Cost: 1, Done: make(chan struct{}, 1)}
			require.NoError(t, mb.SendSingle(context.Background(), a))
			require.True(t, s.serveData())
			a.Wait(1)
			got = a.Reply
		}
		require.ErrorIs(t, got.Err, msg.ErrClockRegression, "batch %v: decided at 50 after a call at 100", batch)
		require.Empty(t, s.holds.parts, "batch %v: the end was carried out", batch)
	}
}

// TestHoldKeepsEachKeysOrder: work that names a key only because other work
// for it waits behind a hold waits too, so each key's requests keep their
// order. A batch part for a (held) and b waits; a single request for b sent
// after it must be decided after it, once the hold ends, not before it
// because b itself is not held.
func TestHoldKeepsEachKeysOrder(t *testing.T) {
	budget := NewBudget(10)
	mb := NewMailbox(8, make(chan struct{}))
	s := New(NewLimits(p1), zeroClock(64), budget, mb, &testHasher) // the loop's steps are called here, in a known order
	held := holdPart(false, "a")
	s.serveHold(held)
	require.NoError(t, held.Out[0].Err)

	part := &msg.Batch{Items: []msg.Item{{Key: "a", Hash: testHasher.Sum("a"), Cost: 1}, {Key: "b", Hash: testHasher.Sum("b"), Cost: 1}},
		Out: make([]msg.Reply, 2), Done: make(chan int, 1)}
	require.NoError(t, mb.SendBatch(context.Background(), part))
	require.True(t, s.serveData())
	single := &msg.Single{Key: "b", Hash: testHasher.Sum("b"), Cost: 10, Done: make(chan struct{}, 1)}
	require.NoError(t, mb.SendSingle(context.Background(), single))
	require.True(t, s.serveData())
	require.Len(t, s.holds.waiting, 2, "the part waits on a, and the request for b behind it")

	require.True(t, held.Hold.Claim())
	ok, _ := budget.ReserveN(1) // the caller's room for the new key a
	require.True(t, ok)
	require.True(t, held.Hold.End(msg.HoldCommit, 0, true))
	s.tendHolds()
	<-part.Done
	single.Wait(1)
	require.NoError(t, part.Out[1].Err)
	assert.True(t, part.Out[1].Decision.Allowed, "the part came first: b had all 10")
	assert.Equal(t, int64(9), part.Out[1].Decision.Remaining)
	require.NoError(t, single.Reply.Err)
	assert.False(t, single.Reply.Decision.Allowed, "the request for all of b came after the part took 1")
	assert.Equal(t, int64(9), single.Reply.Decision.Remaining)
}

// TestRunStopAnswersWorkTakenBehindAHold: a request the shard has taken
// and kept aside behind a hold on its key is a request already taken, so
// when stop is what makes the shard carry out the hold's end, it must then
// decide that request after the hold, not answer it ErrClosed: Close
// answers ErrClosed only to what no shard has taken. (A loop that answered
// the work kept aside ErrClosed at stop passed every other test and the
// stress checks.)
func TestRunStopAnswersWorkTakenBehindAHold(t *testing.T) {
	clk := zeroClock(64)
	budget := NewBudget(10)
	l := startLoop(p1, clk, budget)

	b := &msg.Batch{Items: []msg.Item{{Key: "a", Hash: testHasher.Sum("a"), Cost: 4}},
		Out: make([]msg.Reply, 1), Done: make(chan int, 1), Hold: &msg.Hold{Snaps: make([]msg.Snap, 1)}}
	require.NoError(t, l.mb.SendBatch(context.Background(), b))
	<-b.Done
	require.NoError(t, b.Out[0].Err)

	// Queued before two parts for other keys: once both are answered, the
	// shard has taken it, and kept it aside behind the hold on a.
	waiting := keptAside(t, l, "a", 10)
	require.True(t, b.Hold.Claim(), "nothing made the shard give the hold up")

	// End the hold while the shard is parked, without waking it: stop is
	// then what wakes it, so it meets the end only as it stops.
	for !l.mb.sleeping.Load() {
		runtime.Gosched()
	}
	ok, _ := budget.ReserveN(1) // the caller's reservation for the new key a
	require.True(t, ok)
	require.True(t, b.Hold.End(msg.HoldCommit, 0, true))
	select {
	case r := <-waiting:
		t.Fatalf("the request kept aside was answered before the stop: %+v", r)
	default:
	}
	l.close()
	r := <-waiting
	require.NoError(t, r.Err, "taken before Close: it gets the shard's answer")
	assert.False(t, r.Decision.Allowed, "decided after the commit took 4 of a's 10")
	assert.Equal(t, int64(6), r.Decision.Remaining)
}

// TestPreparedPublishesAtBarrier: a prepare that gives a hold up counts it
// in HoldsAborted, and the prepared shard publishes that count before it
// waits at the cutover's barrier, where it may wait long (another shard's
// prepare is slow), serving nothing that would publish it. Here nothing
// publishes or aborts the cutover: the shard stays at the barrier.
func TestPreparedPublishesAtBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := startLoop(p1, zeroClock(64), NewBudget(10))
		defer l.close()

		pending := holdPart(false, "a")
		sendHold(t, l, pending)
		synctest.Wait() // the shard parked, and published
		require.Equal(t, uint64(1), l.s.Counters()[msg.Holds])
		require.Zero(t, l.s.Counters()[msg.HoldsAborted])

		next := p1
		next.Version = 2
		require.NoError(t, l.mb.Prepare(context.Background(), NewLimits(next), &msg.Prepare{Done: make(chan error, 1)}))
		assert.False(t, pending.Hold.Claim(), "the prepare gave the hold up")
		synctest.Wait() // the shard waits at the barrier
		assert.Equal(t, uint64(1), l.s.Counters()[msg.HoldsAborted], "published before the barrier")
		require.True(t, l.mb.Abort())
	})
}
