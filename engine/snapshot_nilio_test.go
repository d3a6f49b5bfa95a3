package engine_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// A nil io.Writer for Snapshot and a nil io.Reader for Restore are a
// caller's mistake like a nil context: each gets an error at once, never a
// panic, and the engine goes on serving and snapshotting.
func TestSnapshotRestoreNilIO(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 2), Shards: 2})
	_, err := e.Allow(ctx, "a", 4)
	require.NoError(t, err)

	require.NotPanics(t, func() { err = e.Snapshot(ctx, nil) })
	require.ErrorIs(t, err, fs.ErrInvalid)
	var nilCtx context.Context
	require.ErrorIs(t, e.Snapshot(nilCtx, nil), fs.ErrInvalid, "the writer is checked first, as a key is")

	var rep engine.RestoreReport
	var r *engine.Engine
	cfg := engine.Config{Policy: pol(1, 10, 2), Clock: clock.NewManual(0)}
	require.NotPanics(t, func() { r, rep, err = engine.Restore(cfg, nil, engine.RestoreOptions{}) })
	require.Nil(t, r)
	require.Equal(t, engine.RestoreReport{}, rep)
	require.ErrorIs(t, err, engine.ErrInvalidSnapshot)
	require.ErrorIs(t, err, fs.ErrInvalid)
	_, _, err = engine.Restore(engine.Config{}, nil, engine.RestoreOptions{})
	require.True(t, errors.Is(err, engine.ErrInvalidPolicy), "cfg is checked first: %v", err)

	// Nothing was left half done: the engine snapshots and restores.
	var b bytes.Buffer
	require.NoError(t, e.Snapshot(ctx, &b))
	r, rep, err = engine.Restore(cfg, &b, engine.RestoreOptions{})
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, 1, rep.Restored)
}
