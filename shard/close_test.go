package shard

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMailboxConcurrentClose calls Mailbox.Close from several goroutines at
// once, as its doc allows, and lets the shard stop as soon as the first
// returns, as the engine does after its own Close. Every request queued
// before Close must be answered by the final drain: no Close may return
// before the one that took the queue has handed it over.
func TestMailboxConcurrentClose(t *testing.T) {
	const (
		closers = 4
		queued  = 4
	)
	p := policy.Policy{Version: 1, Capacity: 1 << 40, TokensPerSecond: 1}
	for round := range 2000 {
		closing, stop := make(chan struct{}), make(chan struct{})
		mb := NewMailbox(queued, closing)
		s := New(NewLimits(p), clock.NewManual(0), NewBudget(queued), mb, &testHasher)
		// Queue requests while no shard runs, so Close is what takes them.
		reqs := make([]*msg.Single, queued)
		for i := range reqs {
			reqs[i] = &msg.Single{Op: msg.OpAllow, Key: "k", Hash: testHasher.Sum("k"), Cost: 1, Done: make(chan struct{}, 1)}
			if err := mb.SendSingle(context.Background(), reqs[i]); err != nil {
				t.Fatal(err)
			}
		}
		close(closing)
		var (
			start    atomic.Bool
			stopOnce sync.Once
			ran      = make(chan struct{})
			wg       sync.WaitGroup
		)
		for range closers {
			wg.Go(func() {
				for !start.Load() {
					runtime.Gosched()
				}
				mb.Close()
				// The engine closes stop once its Close has closed the mailbox.
				stopOnce.Do(func() {
					close(stop)
					s.Run(stop) // returns at once and runs the final drain
					close(ran)
				})
			})
		}
		start.Store(true)
		wg.Wait()
		<-ran
		answered := 0
		for _, a := range reqs {
			// Finish, once called, leaves the stage done; a request the
			// drain missed is still pending.
			select {
			case <-a.Done:
			default:
			}
			if a.Reply.Err != nil {
				answered++
			}
		}
		if answered != queued {
			t.Fatalf("round %d: %d of %d requests queued before Close were answered; m.left still holds %p", round, answered, queued, mb.left)
		}
	}
}
