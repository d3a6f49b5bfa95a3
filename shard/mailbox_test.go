package shard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// maxYields is one more than the most yields a caller makes before parking.
var maxYields = max(msg.WaitYields(1), msg.WaitYields(2)) + 1

// manualLoop runs one shard on a manual clock with a mailbox of size, and
// returns it with the function that stops it the way the engine's Close
// does.
func manualLoop(p policy.Policy, size int, keys int64) (*Mailbox, func()) {
	closing, stop, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	mb := NewMailbox(size, closing)
	s := New(NewLimits(p), clock.NewManual(0), NewBudget(keys), mb, &testHasher)
	go func() {
		defer close(exited)
		s.Run(stop)
	}()
	var once sync.Once
	return mb, func() {
		once.Do(func() {
			close(closing)
			mb.Close()
			close(stop)
			<-exited
		})
	}
}

// TestMailboxManySendersTinyQueue drives a mailbox with room for two single
// requests from many senders at once, with batch parts interleaved, so
// senders keep finding it full and waiting for room. Every request must be
// answered, and since the clock never moves, each key's balance must fall by
// exactly the requests sent for it: none lost, none decided twice.
func TestMailboxManySendersTinyQueue(t *testing.T) {
	const (
		senders = 16
		each    = 400
		keys    = 5
		parts   = 200
	)
	p := policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}
	mb, stop := manualLoop(p, 2, keys)
	defer stop()
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			a := &msg.Single{Done: make(chan struct{}, 1)}
			for i := range each {
				key := fmt.Sprintf("k%d", (g+i)%keys)
				a.Op, a.Key, a.Hash, a.Cost = msg.OpAllow, key, testHasher.Sum(key), 1
				if !assert.NoError(t, mb.SendSingle(ctx, a)) {
					return
				}
				a.Wait(i % maxYields) // from parking at once to as many yields as a caller makes
				if !assert.NoError(t, a.Reply.Err) || !assert.True(t, a.Reply.Decision.Allowed) {
					return
				}
			}
		})
	}
	wg.Go(func() {
		done := make(chan int, 1)
		for i := range parts {
			key := fmt.Sprintf("k%d", i%keys)
			b := &msg.Batch{Items: []msg.Item{{Key: key, Hash: testHasher.Sum(key), Cost: 1}}, Out: make([]msg.Reply, 1), Done: done}
			if !assert.NoError(t, mb.SendBatch(ctx, b)) {
				return
			}
			<-done
			if !assert.NoError(t, b.Out[0].Err) {
				return
			}
		}
	})
	wg.Wait()
	// Each key got senders*each/keys single requests and parts/keys batch
	// items; one more token now shows the balance.
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		a := &msg.Single{Op: msg.OpAllow, Key: key, Hash: testHasher.Sum(key), Cost: 1, Done: make(chan struct{}, 1)}
		require.NoError(t, mb.SendSingle(ctx, a))
		a.Wait(msg.WaitYields(1))
		require.NoError(t, a.Reply.Err)
		spent := int64(senders*each/keys + parts/keys + 1)
		assert.Equal(t, p.Capacity-spent, a.Reply.Decision.Remaining, "key %s", key)
	}
	// The shard uncounts a group just after it answers it: give it the
	// processor until it has.
	for i := 0; i < 1_000_000 && mb.Depth() != 0; i++ {
		runtime.Gosched()
	}
	assert.Zero(t, mb.Depth(), "nothing left queued")
}

// TestMailboxCloseRacingSenders closes the shard while senders, some of
// them waiting for room in a full mailbox, keep sending. Each request is
// either refused (ErrClosed) or taken and then answered, decided or
// ErrClosed; no sender is left waiting, and the test's goroutine leak check
// finds nothing behind.
func TestMailboxCloseRacingSenders(t *testing.T) {
	for round := range 20 {
		p := policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}
		mb, stop := manualLoop(p, 3, 100)
		ctx := context.Background()
		var wg sync.WaitGroup
		var mu sync.Mutex
		refused, answered := 0, 0
		for g := range 12 {
			wg.Go(func() {
				a := &msg.Single{Done: make(chan struct{}, 1)}
				for i := 0; ; i++ {
					key := fmt.Sprintf("r%d-k%d", round, (g+i)%7)
					a.Op, a.Key, a.Hash, a.Cost = msg.OpAllow, key, testHasher.Sum(key), 1
					if err := mb.SendSingle(ctx, a); err != nil {
						assert.ErrorIs(t, err, msg.ErrClosed)
						mu.Lock()
						refused++
						mu.Unlock()
						return
					}
					a.Wait(i % maxYields)
					if err := a.Reply.Err; err != nil && !errors.Is(err, msg.ErrClosed) {
						t.Errorf("answer %v", err)
						return
					}
					mu.Lock()
					answered++
					mu.Unlock()
				}
			})
		}
		// Let the senders get going before closing, at a point that varies
		// from round to round.
		for {
			mu.Lock()
			n := answered
			mu.Unlock()
			if n >= 50*round {
				break
			}
			runtime.Gosched()
		}
		stop()
		wg.Wait()
		assert.Equal(t, 12, refused, "round %d: every sender ends refused", round)
	}
}

// TestMailboxPingPong sends requests one at a time from two senders, so
// most arrive while the shard is on its way to parking: a wake-up lost
// there leaves a sender waiting forever, and the test times out.
func TestMailboxPingPong(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}
	mb, stop := manualLoop(p, 8, 2)
	defer stop()
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", g)
			a := &msg.Single{Done: make(chan struct{}, 1)}
			for i := range 50_000 {
				a.Op, a.Key, a.Hash, a.Cost = msg.OpAllow, key, testHasher.Sum(key), 1
				if !assert.NoError(t, mb.SendSingle(context.Background(), a)) {
					return
				}
				a.Wait(i % maxYields)
				if !assert.NoError(t, a.Reply.Err) {
					return
				}
			}
		})
	}
	wg.Wait()
}
