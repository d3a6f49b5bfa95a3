package shard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// skipUnderRace skips a check that drives a table or a State from the
// test's goroutine alone, against a map or the eager reference: neither
// starts a goroutine, so the race detector finds nothing there, and these
// checks took most of the package's race run. `go test work` without -race
// runs them, and so does CI, after the race step.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a sequential check with no goroutine: `go test work` without -race runs it")
	}
}

// gateClock hands out exactly the readings the test sends it, and blocks the
// shard until it does: the test decides when the shard may go on.
type gateClock chan int64

func (g gateClock) Now() int64 { return <-g }

// loop runs one shard the way the engine does and stops it the way Close
// does: closing, then the mailbox, then stop.
type loop struct {
	mb      *Mailbox
	s       *Shard // for its published counters
	closing chan struct{}
	stop    chan struct{}
	exited  chan struct{}
}

func startLoop(p policy.Policy, clk gateClock, budget *Budget) *loop {
	l := &loop{closing: make(chan struct{}), stop: make(chan struct{}), exited: make(chan struct{})}
	l.mb = NewMailbox(8, l.closing)
	s := New(NewLimits(p), clk, budget, l.mb, &testHasher)
	l.s = s
	go func() {
		defer close(l.exited)
		s.Run(l.stop)
	}()
	return l
}

func (l *loop) close() {
	close(l.closing)
	l.mb.Close()
	close(l.stop)
	<-l.exited
}

// allowAsync sends one request and returns where its answer will arrive.
func allowAsync(t *testing.T, mb *Mailbox, key string, cost int64) <-chan msg.Reply {
	t.Helper()
	a := &msg.Single{Key: key, Hash: testHasher.Sum(key), Cost: cost, Done: make(chan struct{}, 1)}
	got := make(chan msg.Reply, 1)
	go func() {
		if err := mb.SendSingle(context.Background(), a); err != nil {
			got <- msg.Reply{Err: err}
			return
		}
		a.Wait(msg.WaitYields(1))
		got <- a.Reply
	}()
	return got
}

var p1 = policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2}

// TestRunControlBeforeData shows a sweep queued behind data is served first.
// With room for one key, key a (depleted at 0, full by 5 s) holds the slot.
// While the shard is stalled reading the clock for another request, a new key
// b and a sweep queue up. Only if the sweep runs first is there room for b.
func TestRunControlBeforeData(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(1))
		defer l.close()

		ra := allowAsync(t, l.mb, "a", 10)
		clk <- 0
		require.NoError(t, (<-ra).Err)

		rx := allowAsync(t, l.mb, "a", 1)
		synctest.Wait() // the shard holds x and waits for its reading
		rb := allowAsync(t, l.mb, "b", 1)
		sw := make(chan msg.SweepReply, 1)
		go func() { sw <- l.mb.Sweep(context.Background(), &msg.Sweep{Done: make(chan msg.SweepReply, 1)}) }()
		synctest.Wait() // b is queued, the sweep is waiting to be taken

		clk <- 0 // x is decided at 0: a stays depleted
		x := <-rx
		require.NoError(t, x.Err)
		assert.False(t, x.Decision.Allowed)
		clk <- 5 * int64(time.Second) // the sweep's reading: a is full
		clk <- 5 * int64(time.Second) // b's reading
		w, b := <-sw, <-rb
		require.NoError(t, w.Err)
		assert.Equal(t, 1, w.Evicted, "the sweep ran before b and found a full")
		require.NoError(t, b.Err, "b found the slot a left")
		assert.True(t, b.Decision.Allowed)
	})
}

// TestRunPreparedServesNothing shows a prepared shard decides no data until
// publish, and then decides it under the new policy.
func TestRunPreparedServesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(10))
		defer l.close()

		p2 := policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}
		prep := make(chan error, 1)
		go func() {
			prep <- l.mb.Prepare(context.Background(), NewLimits(p2), &msg.Prepare{Done: make(chan error, 1)})
		}()
		clk <- 100
		require.NoError(t, <-prep)

		ra := allowAsync(t, l.mb, "a", 1)
		synctest.Wait()
		select {
		case r := <-ra:
			t.Fatalf("a prepared shard answered %+v before publish", r)
		default:
		}
		require.True(t, l.mb.Publish())
		clk <- 200
		r := <-ra
		require.NoError(t, r.Err)
		assert.Equal(t, int64(2), r.Decision.Version)
		assert.Equal(t, int64(19), r.Decision.Remaining, "a new key starts at the new capacity")
	})
}

// TestRunStopDrains shows Close's order: queued requests that the shard has
// not taken get ErrClosed, a staged cutover is dropped, and the loop exits.
func TestRunStopDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(10))

		prep := make(chan error, 1)
		go func() {
			prep <- l.mb.Prepare(context.Background(), NewLimits(policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}), &msg.Prepare{Done: make(chan error, 1)})
		}()
		clk <- 0
		require.NoError(t, <-prep)

		var replies []<-chan msg.Reply
		for range 5 {
			replies = append(replies, allowAsync(t, l.mb, "a", 1))
		}
		batch := &msg.Batch{Items: []msg.Item{{Key: "b", Hash: testHasher.Sum("b"), Cost: 1}, {Key: "c", Hash: testHasher.Sum("c"), Cost: 1}}, Out: make([]msg.Reply, 2), Done: make(chan int, 1)}
		require.NoError(t, l.mb.SendBatch(context.Background(), batch))
		synctest.Wait()

		l.close()
		for _, r := range replies {
			assert.ErrorIs(t, (<-r).Err, msg.ErrClosed)
		}
		<-batch.Done
		assert.True(t, batch.Closed, "a drained part is marked undecided")
		for _, r := range batch.Out {
			assert.ErrorIs(t, r.Err, msg.ErrClosed)
		}
		assert.ErrorIs(t, l.mb.SendSingle(context.Background(), &msg.Single{Key: "a", Hash: testHasher.Sum("a"), Cost: 1, Done: make(chan struct{}, 1)}), msg.ErrClosed)
		assert.False(t, l.mb.Publish(), "nobody left to publish to")
		l.mb.Close() // idempotent
	})
}

// TestRunStopDrainCountsBeforeAnswers: the drain at Close publishes the
// count of each ErrClosed answer before it gives the answer, so a caller
// that has its answer reads it in Stats. The second part's Done is
// unbuffered and not received: the drain blocks answering it, after the
// five singles and the first part were answered and before it ends.
func TestRunStopDrainCountsBeforeAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(10))
		prep := make(chan error, 1)
		go func() { // a prepared shard takes no data: what is sent stays queued for the drain
			prep <- l.mb.Prepare(context.Background(), NewLimits(policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}), &msg.Prepare{Done: make(chan error, 1)})
		}()
		clk <- 0
		require.NoError(t, <-prep)
		var replies []<-chan msg.Reply
		for range 5 {
			replies = append(replies, allowAsync(t, l.mb, "a", 1))
		}
		part := func(key string) *msg.Batch {
			return &msg.Batch{Items: []msg.Item{{Key: key, Hash: testHasher.Sum(key), Cost: 1}, {Key: key + "x", Hash: testHasher.Sum(key + "x"), Cost: 1}},
				Out: make([]msg.Reply, 2), Done: make(chan int)}
		}
		first, second := part("b"), part("c")
		require.NoError(t, l.mb.SendBatch(context.Background(), first))
		require.NoError(t, l.mb.SendBatch(context.Background(), second))
		synctest.Wait() // everything is queued

		closed := make(chan struct{})
		go func() { l.close(); close(closed) }()
		for _, r := range replies {
			require.ErrorIs(t, (<-r).Err, msg.ErrClosed)
		}
		<-first.Done
		synctest.Wait() // the drain is blocked answering the second part
		c := l.s.Counters()
		assert.Equal(t, uint64(5+2+2), c[msg.ErrorCounter(msg.KindClosed)], "counted before their answers")
		<-second.Done
		<-closed
	})
}

// TestMailboxFullBlocksUntilContext shows a full mailbox blocks the sender
// until its context ends, and Close releases the others with ErrClosed.
func TestMailboxFullBlocksUntilContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(100))
		// Stall the shard in its clock read so nothing leaves the mailbox.
		first := allowAsync(t, l.mb, "a", 1)
		synctest.Wait()
		for range l.mb.size {
			allowAsync(t, l.mb, "a", 1)
		}
		synctest.Wait()
		require.EqualValues(t, l.mb.size, l.mb.Depth())

		ctx, cancel := context.WithCancel(context.Background())
		blocked := make(chan error, 1)
		go func() {
			blocked <- l.mb.SendSingle(ctx, &msg.Single{Key: "a", Hash: testHasher.Sum("a"), Cost: 1, Done: make(chan struct{}, 1)})
		}()
		synctest.Wait()
		select {
		case err := <-blocked:
			t.Fatalf("send into a full mailbox returned %v", err)
		default:
		}
		cancel()
		assert.ErrorIs(t, <-blocked, context.Canceled)

		closed := make(chan error, 1)
		go func() {
			closed <- l.mb.SendSingle(context.Background(), &msg.Single{Key: "a", Hash: testHasher.Sum("a"), Cost: 1, Done: make(chan struct{}, 1)})
		}()
		synctest.Wait()
		close(l.closing)
		assert.ErrorIs(t, <-closed, msg.ErrClosed)
		l.mb.Close()
		close(l.stop)
		// Feed readings until the loop exits: it may still decide queued
		// requests before it sees stop, which is allowed.
		go func() {
			for {
				select {
				case clk <- 0:
				case <-l.exited:
					return
				}
			}
		}()
		require.NoError(t, (<-first).Err, "a taken request is answered")
		<-l.exited
	})
}

// TestRunCutoversOutpaceConversion sends cutovers back to back to a shard
// holding several slices of untouched buckets, so background conversion
// passes cannot keep up and the policy history fills: the loop then refuses
// prepares until a pass finishes. Every cutover still succeeds, the history
// stays bounded, and every balance afterwards is what eager conversion at
// each cutover reading gives.
func TestRunCutoversOutpaceConversion(t *testing.T) {
	const sec = int64(time.Second)
	keys := 3 * SliceSize
	p := policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1}
	clk := clock.NewManual(0)
	closing, stop, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	mb := NewMailbox(8, closing)
	sh := New(NewLimits(p), clk, NewBudget(int64(keys)), mb, &testHasher)
	m := &eager{pol: p, buckets: map[string]policy.Bucket{}, max: keys}
	// Create the keys before the loop starts: the test owns the state until then.
	for i := range keys {
		key := fmt.Sprintf("k%d", i)
		require.Equal(t, m.allow(0, key, int64(1+i%1000)), sh.state.allow(0, key, int64(1+i%1000)))
	}
	go func() {
		defer close(exited)
		sh.Run(stop)
	}()
	ctx := context.Background()
	for v := int64(2); v <= 71; v++ {
		clk.Set(v * sec)
		next := policy.Policy{Version: v, Capacity: 1000 - 7*v, TokensPerSecond: 1 + v%5}
		require.NoError(t, m.cutover(v*sec, next))
		require.NoError(t, mb.Prepare(ctx, NewLimits(next), &msg.Prepare{Done: make(chan error, 1)}), "cutover to version %d", v)
		require.True(t, mb.Publish())
	}
	clk.Set(100 * sec)
	for i := range keys {
		key := fmt.Sprintf("k%d", i)
		a := &msg.Single{Key: key, Hash: testHasher.Sum(key), Cost: 1, Done: make(chan struct{}, 1)}
		require.NoError(t, mb.SendSingle(ctx, a))
		a.Wait(msg.WaitYields(1))
		require.Equal(t, m.allow(100*sec, key, 1), a.Reply, "key %s", key)
	}
	close(closing)
	mb.Close()
	close(stop)
	<-exited
	assert.LessOrEqual(t, len(sh.state.gens), maxGenerations, "history stayed bounded")
}

// TestGroupDecidedNewestFirst: a group of single requests taken together is
// decided newest first, at one reading, exactly as the same calls made one
// by one in that order: Allow on known keys, new keys (enough to rehash the
// slots a warm points at) and keys long enough for the arena, Peek and
// Refund. A table of 2*warmFrom keys takes the warmed path where the build
// can prefetch, a small one the walking path.
func TestGroupDecidedNewestFirst(t *testing.T) {
	for _, known := range []int{100, 2 * warmFrom} {
		t.Run(fmt.Sprintf("keys=%d", known), func(t *testing.T) {
			p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 2}
			key := func(i int) string {
				if i%5 == 0 {
					return fmt.Sprintf("a-key-long-enough-for-the-arena:%d", i)
				}
				return fmt.Sprintf("k%d", i)
			}
			closing, stop, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
			const group = 1000
			mb := NewMailbox(group, closing)
			s := New(NewLimits(p), clock.NewManual(7e8), NewBudget(1<<20), mb, &testHasher)
			model := newState(NewLimits(p), NewBudget(1<<20), &testHasher)
			for i := range known {
				require.NoError(t, s.State().allow(0, key(i), 1).Err)
				require.NoError(t, model.allow(0, key(i), 1).Err)
			}
			// Queued before the shard runs, so it takes them as one group.
			r := rand.New(rand.NewPCG(3, 4))
			reqs := make([]*msg.Single, group)
			next := known
			for j := range reqs {
				i := r.IntN(known)
				if r.IntN(4) == 0 {
					i, next = next, next+1
				}
				op := []msg.Op{msg.OpAllow, msg.OpAllow, msg.OpPeek, msg.OpRefund}[r.IntN(4)]
				reqs[j] = &msg.Single{Op: op, Key: key(i), Hash: testHasher.Sum(key(i)), Cost: 1 + r.Int64N(2), Done: make(chan struct{}, 1)}
				require.NoError(t, mb.SendSingle(context.Background(), reqs[j]))
			}
			go func() {
				defer close(exited)
				s.Run(stop)
			}()
			for _, a := range reqs {
				a.Wait(msg.WaitYields(1))
			}
			close(closing)
			mb.Close()
			close(stop)
			<-exited
			require.Equal(t, canPrefetch && known >= warmFrom, s.State().worthWarming(2))
			for j := len(reqs) - 1; j >= 0; j-- {
				a := reqs[j]
				want := msg.Single{Op: a.Op, Key: a.Key, Hash: a.Hash, Cost: a.Cost}
				switch a.Op {
				case msg.OpAllow:
					want.Reply = model.allow(7e8, a.Key, a.Cost)
				case msg.OpPeek:
					model.peek(7e8, a.Key, a.Hash, &want.Reply)
				default:
					model.refund(7e8, a.Key, a.Hash, a.Cost, &want.Reply)
				}
				require.Equal(t, want.Reply, a.Reply, "request %d of %d (%v %s)", j, group, a.Op, a.Key)
			}
			require.Equal(t, model.keyCount(), s.State().keyCount())
			for i := range next {
				want, wok := model.bucket(key(i))
				got, gok := s.State().bucket(key(i))
				require.Equal(t, wok, gok, key(i))
				require.Equal(t, want, got, key(i))
			}
		})
	}
}
