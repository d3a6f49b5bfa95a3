package engine_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// TestSnapshotFileOverlapKeepsNewest: a SnapshotFile that starts while an
// earlier one is still writing (a periodic snapshot and the one at
// shutdown) must leave the newer snapshot at path. Before the fix the two
// renamed in whichever order they got there: here the earlier one renamed
// last, and a restart from its file handed back the 10 tokens spent
// between the two snapshots.
func TestSnapshotFileOverlapKeepsNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.snap")
	e, clk := newEngine(t, engine.Config{Policy: fileTestPolicy})

	var mu sync.Mutex
	renames := 0
	firstAtRename, releaseFirst, secondWaits := make(chan struct{}), make(chan struct{}), make(chan struct{})
	engine.SetSnapshotFileHook(e, func(stage string) {
		switch stage {
		case "wait":
			close(secondWaits)
		case "rename":
			mu.Lock()
			renames++
			n := renames
			mu.Unlock()
			if n == 1 {
				close(firstAtRename)
				<-releaseFirst
			}
		}
	})

	first := make(chan error, 1)
	go func() { first <- e.SnapshotFile(context.Background(), path) }()
	wait(t, firstAtRename, "the first SnapshotFile to reach its rename")
	// Spent after the first snapshot, before the second.
	require.True(t, allow(t, e, "k", 10).Allowed)

	second := make(chan struct{})
	var secondErr error
	go func() { secondErr = e.SnapshotFile(context.Background(), path); close(second) }()
	select {
	case <-second: // it did not wait for the first
	case <-secondWaits:
	}
	close(releaseFirst)
	require.NoError(t, <-first)
	wait(t, second, "the second SnapshotFile")
	require.NoError(t, secondErr)

	r, _, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(clk.Now())}, path, engine.RestoreOptions{})
	require.NoError(t, err)
	defer r.Close()
	d, err := r.Peek(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, int64(0), d.Remaining, "the file holds the older snapshot: the spent tokens came back")
}
