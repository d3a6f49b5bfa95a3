package engine_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// scGateClock reads 0, and once armed stalls every reader until gate is
// closed.
type scGateClock struct {
	armed atomic.Bool
	gate  chan struct{}
}

func (c *scGateClock) Now() int64 {
	if c.armed.Load() {
		<-c.gate
	}
	return 0
}

// TestStatsAllowAllPartClosed: an AllowAll whose part still waits in a
// shard's mailbox when the shard stops ends with ErrClosed, and is counted
// once, in AllowAll.Errors: its keys are not also counted as requests the
// shard refused (Stats says an AllowAll that ends with an error counts no
// error there). The shard is stalled in a snapshot's clock reading, so the
// part is queued behind it, and stops on its way out of the snapshot.
func TestStatsAllowAllPartClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &scGateClock{gate: make(chan struct{})}
		e, err := engine.New(engine.Config{Policy: pol(1, 5, 1), Shards: 1, Clock: clk})
		require.NoError(t, err)
		ctx := context.Background()
		clk.armed.Store(true)
		snapErr := make(chan error, 1)
		go func() { snapErr <- e.Snapshot(ctx, io.Discard) }()
		synctest.Wait() // the shard stalls in the snapshot's reading
		allErr := make(chan error, 1)
		go func() {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
			allErr <- err
		}()
		synctest.Wait() // its part waits in the mailbox
		require.Equal(t, int64(1), e.Stats().Total.MailboxDepth)
		closed := make(chan struct{})
		go func() { _ = e.Close(); close(closed) }()
		synctest.Wait() // Close waits for the shard
		close(clk.gate)
		<-closed
		require.ErrorIs(t, <-snapErr, engine.ErrClosed)
		require.ErrorIs(t, <-allErr, engine.ErrClosed)
		st := e.Stats()
		assert.Equal(t, engine.Errors{Closed: 1}, st.AllowAll.Errors)
		assert.Zero(t, st.Total.Errors, "no Allow, Charge, Peek, Refund or AllowBatch was made")
		assert.Zero(t, st.Total.Allowed+st.Total.Denied)
	})
}
