package engine_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

var fileTestPolicy = policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}

// onlyFile asserts that dir holds exactly the one file name: no temporary
// file is left behind.
func onlyFile(t *testing.T, dir, name string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{name}, names)
}

func TestRestoreFileFirstBoot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.snap")
	e, rep, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)}, path, engine.RestoreOptions{})
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, engine.RestoreReport{Fresh: true}, rep)
	d, err := e.Allow(context.Background(), "k", 10)
	require.NoError(t, err)
	require.True(t, d.Allowed)

	// A bad config is New's error, with no engine.
	e2, _, err := engine.RestoreFile(engine.Config{}, path, engine.RestoreOptions{})
	require.ErrorIs(t, err, engine.ErrInvalidPolicy)
	require.Nil(t, e2)

	// No directory is no first boot: a volume not mounted would otherwise
	// hand every key a full bucket at each start, unseen until the
	// snapshot at shutdown fails.
	unmounted := filepath.Join(t.TempDir(), "volume", "limits.snap")
	e3, _, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy}, unmounted, engine.RestoreOptions{})
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, unmounted)
	require.Nil(t, e3)
}

func TestSnapshotFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.snap")
	ctx := context.Background()
	e, err := engine.New(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	_, err = e.Allow(ctx, "spent", 10)
	require.NoError(t, err)
	require.NoError(t, e.SnapshotFile(ctx, path))
	require.NoError(t, e.Close())
	onlyFile(t, dir, "limits.snap")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// Two seconds later by the wall clock a Manual clock reports.
	e, rep, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(int64(2 * time.Second))}, path, engine.RestoreOptions{})
	require.NoError(t, err)
	defer e.Close()
	require.False(t, rep.Fresh)
	require.Equal(t, 1, rep.Restored)
	d, err := e.Peek(ctx, "spent")
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Remaining, "the spent key keeps its debt less two seconds of refill")
}

// A snapshot that fails part-way, for any reason, leaves the previous file
// whole and no temporary file; a temporary file a crash left behind does
// not disturb the next start.
func TestSnapshotFileFailureKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.snap")
	ctx := context.Background()
	e, err := engine.New(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	_, err = e.Allow(ctx, "a", 4)
	require.NoError(t, err)
	require.NoError(t, e.SnapshotFile(ctx, path))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	_, err = e.Allow(ctx, "b", 1)
	require.NoError(t, err)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, e.SnapshotFile(canceled, path), context.Canceled)
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.SnapshotFile(ctx, path), engine.ErrClosed)
	onlyFile(t, dir, "limits.snap")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, before, after)

	// The whole snapshot is written, but the rename fails: still cleaned up.
	blocked := filepath.Join(dir, "blocked")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "x"), 0o700))
	e, err = engine.New(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	_, err = e.Allow(ctx, "a", 1)
	require.NoError(t, err)
	require.Error(t, e.SnapshotFile(ctx, blocked))
	require.NoError(t, e.Close())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 2, "limits.snap and blocked only")

	// A crash mid-write leaves a truncated temporary file: ignored.
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".limits.snap.tmp-123"), before[:len(before)/2], 0o600))
	e, rep, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)}, path, engine.RestoreOptions{})
	require.NoError(t, err)
	defer e.Close()
	require.Equal(t, 1, rep.Restored)
	d, err := e.Peek(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int64(6), d.Remaining)
}

// A file that is there but does not check out is an error, never a fresh
// start, which would hand every key a full bucket.
func TestRestoreFileCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.snap")
	require.NoError(t, os.WriteFile(path, []byte("not a snapshot"), 0o600))
	e, _, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy}, path, engine.RestoreOptions{})
	require.ErrorIs(t, err, engine.ErrInvalidSnapshot)
	require.ErrorContains(t, err, path, "the error names the file")
	require.Nil(t, e)

	var zero *engine.Engine
	require.ErrorIs(t, zero.SnapshotFile(context.Background(), path), engine.ErrNotInitialized)
}

// An empty path names no file: RestoreFile must not take it for a first
// boot (os.Open("") is "no such file", and "." exists), which would start
// a service whose path setting is unset with full buckets at every boot;
// SnapshotFile refuses it before taking a snapshot.
func TestSnapshotFileEmptyPath(t *testing.T) {
	e, rep, err := engine.RestoreFile(engine.Config{Policy: fileTestPolicy}, "", engine.RestoreOptions{})
	require.ErrorIs(t, err, fs.ErrInvalid)
	require.Nil(t, e)
	require.Equal(t, engine.RestoreReport{}, rep)

	e, err = engine.New(engine.Config{Policy: fileTestPolicy, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	defer e.Close()
	require.ErrorIs(t, e.SnapshotFile(context.Background(), ""), fs.ErrInvalid)
}
