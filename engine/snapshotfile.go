package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SnapshotFile writes a snapshot (see Snapshot) to the file at path so that
// a crash at any moment leaves either the previous file or the new one
// there, never a truncated one: it writes a temporary file in the same
// directory, syncs it to disk, renames it over path and syncs the directory.
// On an error before the rename the temporary file is removed and path is
// left as it was (an error syncing the directory after it leaves the new
// file at path, perhaps not yet durable); a process killed while writing
// leaves its temporary file behind, named ".<base of path>.tmp-<random>",
// for you to delete when no SnapshotFile of path is running (each call
// writes its own, and removes no other). The file is created with mode 0600:
// it holds every tracked key. Calls of one engine run one at a time, in
// the order they take their turn, so the file at path is never older than
// one an earlier call left there.
//
// For a restart, stop admitting (http.Server's Shutdown, say), then call
// SnapshotFile, then Close; RestoreFile reads the file on the next start.
//
// Errors: those of Snapshot, and the file system's; an empty path is an
// *fs.PathError wrapping fs.ErrInvalid, before any snapshot is taken.
func (e *Engine) SnapshotFile(ctx context.Context, path string) (err error) {
	if e.uninitialized() {
		return ErrNotInitialized
	}
	if path == "" {
		return errEmptyPath("snapshot")
	}
	// One at a time, from the snapshot to the rename: two calls that
	// overlapped could rename in the other order than they took their
	// snapshots, leaving the older one at path, and a restart from it
	// would hand back every token spent between the two.
	if e.snapshotFileHook != nil && len(e.files) == cap(e.files) {
		e.snapshotFileHook("wait")
	}
	if err := e.take(ctx, e.files); err != nil {
		return err
	}
	defer func() { <-e.files }()
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close() // already closed on the rename's path; the error is moot
			_ = os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriterSize(f, 64<<10)
	if err := e.Snapshot(ctx, w); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if e.snapshotFileHook != nil {
		e.snapshotFileHook("rename")
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	// The rename is durable only once the directory entry is on disk.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// RestoreFile is Restore from the file at path, for a service's start: when
// no file exists there (the first boot), it starts a new, empty engine with
// New(cfg) and says so with RestoreReport.Fresh. A file that exists but
// cannot be read or does not check out is an error, never a fresh start: a
// fresh start would hand every client a full bucket. So is a path whose
// directory does not exist (a volume not mounted, a misspelt path), where
// no SnapshotFile could ever write: the first boot needs the directory.
//
// An empty path is an error too (an *fs.PathError wrapping fs.ErrInvalid),
// not a first boot: it names no file, so no SnapshotFile could write one,
// and an unset setting would start every boot with full buckets.
//
// Errors, with no engine: those of New (first boot) or Restore, and the
// file system's other than the file not existing (its directory's
// included). An ErrInvalidSnapshot names the file; an operator who would
// rather start empty than fix it moves it away.
func RestoreFile(cfg Config, path string, opts RestoreOptions) (*Engine, RestoreReport, error) {
	if path == "" {
		return nil, RestoreReport{}, errEmptyPath("restore")
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		// No directory is a misconfiguration (a volume not mounted, a
		// misspelt path) that SnapshotFile would meet only at shutdown.
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return nil, RestoreReport{}, fmt.Errorf("engine: no snapshot directory for %s, not a first boot: %w", path, err)
		}
		e, err := New(cfg)
		if err != nil {
			return nil, RestoreReport{}, err
		}
		return e, RestoreReport{Fresh: true}, nil
	}
	if err != nil {
		return nil, RestoreReport{}, err
	}
	defer f.Close()
	e, rep, err := Restore(cfg, f, opts)
	if errors.Is(err, ErrInvalidSnapshot) {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return e, rep, err
}

// errEmptyPath is SnapshotFile's and RestoreFile's error for an empty path,
// which os.Open would take as a missing file: a first boot at every start.
func errEmptyPath(op string) error {
	return &fs.PathError{Op: op, Path: `""`, Err: fs.ErrInvalid} // restore "": invalid argument
}
