package engine_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// TestSnapshotSlowWriterAndInterruptedAllowAll: an AllowAll whose hold a
// Snapshot's start made a shard give up starts over at once, and is
// admitted while the snapshot's writer is stalled, as Snapshot's doc says:
// a slow writer pauses the copying, never admission. Shard 1, stalled on
// the clock, keeps the call's part for b from being answered while shard
// 0 holds a, so the snapshot reaches shard 0 first; shard 1 serves the
// snapshot's start before the call's part, as control comes first.
func TestSnapshotSlowWriterAndInterruptedAllowAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, clk, a, b := haPair(t)
		defer e.Close()
		ctx := context.Background()

		allowed := stallOn(ctx, e, clk, b) // shard 1 stalls on the clock
		allDone := make(chan error, 1)
		go func() {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: a, Cost: 1}, {Key: b, Cost: 1}})
			allDone <- err
		}()
		synctest.Wait() // shard 0 holds a; b's part waits behind the stall
		w := newBlockingWriter(nil)
		snapped := make(chan error, 1)
		go func() { snapped <- e.Snapshot(ctx, w) }()
		synctest.Wait() // shard 0 gave its hold up and began its copy
		close(clk.gate)
		require.NoError(t, <-allowed)
		synctest.Wait() // the snapshot waits on the writer
		select {
		case <-w.blocked:
		default:
			t.Fatal("the snapshot did not reach the writer")
		}
		require.Len(t, allDone, 1, "the AllowAll waited for the writer")
		require.NoError(t, <-allDone)
		assert.Equal(t, uint64(1), e.Stats().Shards[0].HoldsAborted, "shard 0 gave its hold up for the snapshot")
		assert.Equal(t, uint64(1), e.Stats().AllowAll.Admitted)
		d, err := e.Peek(ctx, a)
		require.NoError(t, err)
		assert.Equal(t, int64(4), d.Remaining, "admitted once, with the writer stalled")
		close(w.release)
		require.NoError(t, <-snapped)
	})
}
