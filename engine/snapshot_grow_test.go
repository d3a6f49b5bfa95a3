package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// gatedWriter lets the first write through, then blocks until released.
type gatedWriter struct {
	buf     bytes.Buffer
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.started); <-w.release })
	return w.buf.Write(p)
}

// TestSnapshotWhileTableGrows: a snapshot whose writer stalls at its
// first write (once 64 KiB of records are buffered, a few thousand), while
// new keys split the shards' tables under the walk, holds every key that
// was there before it began, once (Restore refuses a key written twice),
// with its balance: a key missed would restore full. Before the stall each
// shard walks at most what the buffer and its chunks in flight hold, a
// small part of 15,000 keys a shard, so new keys land ahead of the walk.
func TestSnapshotWhileTableGrows(t *testing.T) {
	for _, sh := range []int{1, 2} {
		clk := clock.NewManual(1)
		cfg := engine.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}, Clock: clk, Shards: sh, SweepEvery: -1}
		e, _ := newEngine(t, cfg)
		ctx := context.Background()
		const old, grow = 30000, 10000
		reqs := make([]engine.Request, 0, 256)
		out := make([]engine.Result, 256)
		flush := func() {
			require.NoError(t, e.AllowBatch(ctx, reqs, out))
			for _, r := range out[:len(reqs)] {
				require.NoError(t, r.Err)
			}
			reqs = reqs[:0]
		}
		for i := range old {
			reqs = append(reqs, engine.Request{Key: fmt.Sprintf("old%d", i), Cost: 2})
			if len(reqs) == cap(reqs) {
				flush()
			}
		}
		flush()
		w := &gatedWriter{started: make(chan struct{}), release: make(chan struct{})}
		done := make(chan error, 1)
		go func() { done <- e.Snapshot(ctx, w) }()
		<-w.started
		released := sync.OnceFunc(func() { close(w.release) })
		t.Cleanup(released) // a failure below must not leave Snapshot blocked in Write
		for i := range grow {
			reqs = append(reqs, engine.Request{Key: fmt.Sprintf("new%d", i), Cost: 1})
			if len(reqs) == cap(reqs) {
				flush()
			}
		}
		flush()
		released()
		require.NoError(t, <-done)
		e2, rep, err := engine.Restore(cfg, &w.buf, engine.RestoreOptions{})
		require.NoError(t, err)
		require.Greater(t, rep.Restored, old, "shards %d: no new key reached the snapshot, so none grew the table under its walk", sh)
		for i := range old {
			d, err := e2.Peek(ctx, fmt.Sprintf("old%d", i))
			require.NoError(t, err)
			require.Equal(t, int64(1), d.Remaining, "old%d", i)
		}
		require.NoError(t, e2.Close())
	}
}
