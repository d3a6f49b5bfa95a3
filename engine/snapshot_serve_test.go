package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// TestSnapshotRefused: a done context or a closed engine, before anything
// is written.
func TestSnapshotRefused(t *testing.T) {
	for _, dc := range doneContexts {
		t.Run(dc.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 4})
			allow(t, e, "a", 1)
			ctx, cancel := dc.ctx()
			defer cancel()
			var buf bytes.Buffer
			require.ErrorIs(t, e.Snapshot(ctx, &buf), dc.want)
			assert.Zero(t, buf.Len())
		})
	}
	t.Run("closed", func(t *testing.T) {
		e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 4})
		require.NoError(t, e.Close())
		var buf bytes.Buffer
		require.ErrorIs(t, e.Snapshot(t.Context(), &buf), engine.ErrClosed)
		assert.Zero(t, buf.Len())
	})
}

// TestSnapshotSlowWriterEnds: while a writer blocks a Snapshot, Close and
// a canceled context end it: Close returns at once, without waiting for the
// writer, and once the writer returns, Snapshot reports ErrClosed (the
// shards stopped with keys left to copy), or the context's error (or
// success, if it finished first).
func TestSnapshotSlowWriterEnds(t *testing.T) {
	keys := longKeys(manyKeys)
	for _, how := range []string{"close", "cancel"} {
		t.Run(how, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 1})
			fill(t, e, keys, 1)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w := newBlockingWriter(nil)
			errc := make(chan error, 1)
			go func() { errc <- e.Snapshot(ctx, w) }()
			wait(t, w.blocked, "the snapshot to reach the writer")
			want := context.Canceled
			if how == "close" {
				want = engine.ErrClosed
				closed := make(chan struct{})
				go func() {
					_ = e.Close()
					close(closed)
				}()
				wait(t, closed, "Close, behind a blocked writer")
			} else {
				cancel()
			}
			close(w.release)
			err := <-errc
			if how == "cancel" && err == nil {
				// The writer's outcome: it may finish before it notices.
				requireRestores(t, w.buf.Bytes(), len(keys))
			} else {
				require.ErrorIs(t, err, want)
			}
			if how == "cancel" { // the engine goes on, coordinator and all
				allow(t, e, "after", 1)
				require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 10, 2), 1))
				requireRestores(t, takeSnapshot(t, e), len(keys)+1)
			}
		})
	}
}

// requireRestores restores data and requires n keys in it.
func requireRestores(t *testing.T, data []byte, n int) {
	t.Helper()
	e, rep := restored(t, engine.Config{Policy: pol(9, 10, 2), Shards: 3, Clock: clock.NewManual(0)}, data, engine.RestoreOptions{})
	require.Equal(t, n, rep.Restored)
	require.Equal(t, n, e.KeyCount())
}

// failingWriter fails its nth Write with err.
type failingWriter struct {
	n, calls int
	err      error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.calls++; w.calls == w.n {
		return 0, w.err
	}
	return len(p), nil
}

// TestSnapshotWriterFails: a writer's error is Snapshot's error, whether it
// comes mid-stream, at the final flush or at the checksum; the engine goes
// on serving, and the next Snapshot succeeds.
func TestSnapshotWriterFails(t *testing.T) {
	errFull := errors.New("device full")
	for _, c := range []struct {
		name string
		keys []string
		n    int
	}{
		{"mid-stream", longKeys(2000), 1},
		{"final flush", []string{"a", "b", "c"}, 1},
		{"checksum", []string{"a", "b", "c"}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 4})
			fill(t, e, c.keys, 1)
			w := &failingWriter{n: c.n, err: errFull}
			require.ErrorIs(t, e.Snapshot(t.Context(), w), errFull)
			require.Equal(t, c.n, w.calls, "nothing is written after the error")
			assert.Equal(t, int64(8), allow(t, e, c.keys[0], 1).Remaining)
			require.NoError(t, e.ReplacePolicy(t.Context(), pol(2, 10, 2), 1), "the coordinator is free again")
			requireRestores(t, takeSnapshot(t, e), len(c.keys))
		})
	}
}

// TestSnapshotKeepsServing: while a writer blocks a Snapshot, with keys
// still to copy, requests on other goroutines keep being decided, for keys
// old and new; the snapshot then completes and restores.
func TestSnapshotKeepsServing(t *testing.T) {
	keys := longKeys(manyKeys)
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 1})
	fill(t, e, keys, 1)
	w := newBlockingWriter(nil)
	errc := make(chan error, 1)
	go func() { errc <- e.Snapshot(context.Background(), w) }()
	wait(t, w.blocked, "the snapshot to reach the writer")

	served := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				if _, err := e.Allow(context.Background(), keys[len(keys)-1-(g*100+i)], 1); err != nil {
					errs <- err
					return
				}
				if _, err := e.Allow(context.Background(), fmt.Sprintf("new-%d-%d", g, i), 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(served)
	}()
	wait(t, served, "requests while the writer blocks")
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	close(w.release)
	require.NoError(t, <-errc)
	s, err := decodeSnap(w.buf.Bytes())
	require.NoError(t, err)
	// The keys created meanwhile may or may not be in it.
	require.GreaterOrEqual(t, len(s.Buckets), len(keys))
	require.LessOrEqual(t, len(s.Buckets), len(keys)+800)
	requireRestores(t, w.buf.Bytes(), len(s.Buckets))
}

// TestSnapshotUnderLoad: snapshots taken while 8 goroutines keep deciding
// requests (run under -race) restore, each with only keys that were used
// and balances no higher than capacity.
func TestSnapshotUnderLoad(t *testing.T) {
	const maxKeys = 500
	e, clk := newEngine(t, engine.Config{Policy: pol(1, 5, 1000), Shards: 4, MaxKeys: maxKeys})
	var decided atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				_, err := e.Allow(context.Background(), fmt.Sprintf("g%d-%d", g, i%100), 1+int64(i%3))
				if err != nil && !errors.Is(err, engine.ErrKeyCapacity) {
					errs <- err
					return
				}
				decided.Add(1)
				if i%50 == 0 {
					clk.Advance(time.Millisecond)
				}
			}
		})
	}
	var snaps [][]byte
	deadline := time.Now().Add(patience)
	for i := range 5 {
		// Each snapshot starts once more requests have been decided.
		for decided.Load() < int64(500*(i+1)) {
			require.True(t, time.Now().Before(deadline), "requests stopped being decided")
			runtime.Gosched()
		}
		snaps = append(snaps, takeSnapshot(t, e))
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, data := range snaps {
		s, err := decodeSnap(data)
		require.NoError(t, err)
		require.LessOrEqual(t, len(s.Buckets), maxKeys)
		for _, b := range s.Buckets {
			require.Regexp(t, `^g[0-7]-\d{1,2}$`, b.Key)
			for _, v := range s.levels(b) {
				require.LessOrEqual(t, v.Tokens, uint64(5))
			}
		}
		r, rep := restored(t, engine.Config{Policy: pol(1, 5, 1000), Shards: 2, MaxKeys: maxKeys, Clock: clock.NewManual(clk.Now())}, data, engine.RestoreOptions{})
		require.Equal(t, len(s.Buckets), rep.Restored)
		require.Equal(t, len(s.Buckets), r.KeyCount())
	}
}
