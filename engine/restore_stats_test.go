package engine_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
)

// TestRestoreStatsCountKeys: Stats read as soon as Restore returns counts
// the keys it restored, as KeyCount does, DropFullest's drops taken off.
// Before the fix each shard published its key count only once its goroutine
// had started, so a dashboard read at start-up showed a restored engine
// with no keys (every one of these restores, on a test machine).
func TestRestoreStatsCountKeys(t *testing.T) {
	old, _ := newEngine(t, engine.Config{Policy: pol(1, 10, 1), Shards: 4})
	for i := range 100 {
		allow(t, old, fmt.Sprint("k", i), 1+int64(i%10))
	}
	data := takeSnapshot(t, old)
	for _, maxKeys := range []int{0, 60} {
		for range 20 {
			cfg := engine.Config{Policy: pol(1, 10, 1), Shards: 4, MaxKeys: maxKeys, Clock: clock.NewManual(0)}
			e, rep, err := engine.Restore(cfg, bytes.NewReader(data), engine.RestoreOptions{DropFullest: true})
			require.NoError(t, err)
			st := e.Stats()
			var sum int64
			for _, s := range st.Shards {
				sum += s.Keys
			}
			require.Equal(t, int64(rep.Restored), st.Total.Keys, "MaxKeys %d", maxKeys)
			require.Equal(t, st.Total.Keys, sum)
			require.Equal(t, rep.Restored, e.KeyCount())
			require.NoError(t, e.Close())
		}
	}
}
