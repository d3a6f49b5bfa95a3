package shard

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
)

// TestRunSnapshotServesBatches: while a snapshot waits for a free chunk (a
// slow writer holds them all), a steady stream of single requests, each
// arriving while the shard decides the previous one, must not keep a queued
// batch part waiting for as long as the writer is slow: every turn serves
// the singles queued and the batch parts queued.
func TestRunSnapshotServesBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(100))

		// A snapshot whose writer holds every chunk: Free never has one.
		cancel := make(chan struct{})
		snap := &msg.Snapshot{
			Begin:  make(chan int64, 1),
			Free:   make(chan *msg.SnapChunk),
			Out:    make(chan *msg.SnapChunk, 1),
			Cancel: cancel,
		}
		began := make(chan error, 1)
		go func() {
			_, err := l.mb.Snapshot(context.Background(), snap)
			began <- err
		}()
		clk <- 0 // beginSnapshot's reading
		require.NoError(t, <-began)
		synctest.Wait() // the shard parks, its snapshot task waiting for a chunk

		// A single wakes it; the shard stalls reading the clock for it.
		answers := []<-chan msg.Reply{allowAsync(t, l.mb, "s", 1)}
		synctest.Wait()
		// A batch part queues behind it.
		done := make(chan int, 1)
		b := &msg.Batch{Items: []msg.Item{{Key: "b", Hash: testHasher.Sum("b"), Cost: 1}}, Out: make([]msg.Reply, 1), Done: done}
		require.NoError(t, l.mb.SendBatch(context.Background(), b))

		served := false
		const turns = 20
		for i := range turns {
			// The next single arrives while the shard is busy with the last.
			answers = append(answers, allowAsync(t, l.mb, "s", 1))
			synctest.Wait()
			select {
			case <-done:
				served = true
			default:
			}
			if served {
				break
			}
			clk <- int64(i + 1) // let the shard finish what it is deciding
			synctest.Wait()
		}

		// Clean up: keep the clock answering until the shard exits.
		go func() {
			for r := int64(1000); ; r++ {
				select {
				case clk <- r:
				case <-l.exited:
					return
				}
			}
		}()
		close(cancel)
		l.close()
		for _, a := range answers {
			<-a
		}
		if !served {
			<-done // drained with ErrClosed
		}
		require.True(t, served, "a batch part waited through %d groups of single requests while a snapshot was paused", turns)
	})
}
