package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// A service that keeps its limits across restarts: RestoreFile on start
// (the first boot finds no file and starts fresh), SnapshotFile on the way
// down. The file is replaced atomically, so a crash mid-write leaves the
// previous snapshot, and the next start still succeeds.
func ExampleRestoreFile() {
	dir, err := os.MkdirTemp("", "limits")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.snap")
	cfg := engine.Config{Policy: policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(10)}}
	ctx := context.Background()

	for boot := 1; boot <= 2; boot++ {
		e, report, err := engine.RestoreFile(cfg, path, engine.RestoreOptions{})
		if err != nil {
			panic(err) // a snapshot that does not check out: never start fresh over it
		}
		fmt.Printf("boot %d: fresh %v, %d keys restored\n", boot, report.Fresh, report.Restored)

		d, _ := e.Allow(ctx, "user:42", 4)
		fmt.Println("  user:42 allowed:", d.Allowed, "remaining:", d.Remaining)

		// On shutdown: stop admitting first (http.Server.Shutdown), then save.
		if err := e.SnapshotFile(ctx, path); err != nil {
			panic(err)
		}
		_ = e.Close()
	}
	// Output:
	// boot 1: fresh true, 0 keys restored
	//   user:42 allowed: true remaining: 6
	// boot 2: fresh false, 1 keys restored
	//   user:42 allowed: true remaining: 2
}
