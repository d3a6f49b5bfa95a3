//go:build !race

package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// liveHeap is the heap still reachable after two collections (the second
// frees what the first one's finalizers released).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// retainedPerKey is the heap an engine under p retains per tracked key,
// key bytes included, after n keys of 17 bytes have each been decided once.
func retainedPerKey(t *testing.T, p policy.Policy, n int) float64 {
	t.Helper()
	before := liveHeap()
	e, err := engine.New(engine.Config{Policy: p, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	reqs := make([]engine.Request, 64)
	out := make([]engine.Result, len(reqs))
	for i := 0; i < n; i += len(reqs) {
		for j := range reqs {
			reqs[j] = engine.Request{Key: fmt.Sprintf("user:%012d", i+j), Cost: 1}
		}
		if err := e.AllowBatch(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	clear(reqs) // the engine holds its own copies of the keys
	after := liveHeap()
	if e.KeyCount() != n {
		t.Fatalf("%d keys tracked, want %d", e.KeyCount(), n)
	}
	return float64(int64(after)-int64(before)) / float64(n)
}

// TestRetainedBytesPerKey holds the memory a tracked key costs at a million
// keys of 17 bytes, the keys included: at most 64 bytes for a limit of one
// band per second (every TokensPerSecond policy), and at most 24 bytes more
// for each extra band.
func TestRetainedBytesPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a million keys")
	}
	const n = 1 << 20
	plain := retainedPerKey(t, pol(1, 1000, 1), n)
	three := retainedPerKey(t, policy.Policy{Version: 1, Capacity: 1000, TokensPerSecond: 1, Bands: bands(t,
		policy.Band{Name: "hourly", Capacity: 2000, Refill: policy.PerHour(2000)},
		policy.Band{Name: "daily", Capacity: 5000, Refill: policy.PerDay(5000)},
		policy.Band{Name: "odd", Capacity: 900, Refill: policy.Rate{Tokens: 7, Per: 3e9}})}, n)
	t.Logf("%d keys: %.1f B/key with one band, %.1f with 1 + 3 bands", n, plain, three)
	if plain > 64 {
		t.Errorf("one band per second: %.1f bytes retained per key, want at most 64", plain)
	}
	if extra := (three - plain) / 3; extra > 24 {
		t.Errorf("%.1f bytes per extra band, want at most 24", extra)
	}
}
