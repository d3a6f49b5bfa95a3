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

// allocated is the bytes the process has allocated so far.
func allocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestLimitTableSharedByShards holds what a policy of many distinct limits
// costs an engine of many shards: New and ReplacePolicy build its table of
// limits once, shared by every shard, so neither the memory nor the work
// grows with the shard count, and no prepared shard waits while the others
// build tables of their own.
func TestLimitTableSharedByShards(t *testing.T) {
	const limits = 1 << 14
	ovs := make([]policy.Override, limits)
	for i := range ovs {
		ovs[i] = policy.Override{Match: fmt.Sprintf("tenant:%d", i), Capacity: int64(10 + i), TokensPerSecond: 5}
	}
	set, err := policy.NewOverrideSet(ovs...)
	if err != nil {
		t.Fatal(err)
	}
	pol := func(v int64) policy.Policy {
		return policy.Policy{Version: v, Capacity: 100, TokensPerSecond: 10, Overrides: set}
	}
	// cost returns the heap that New retains and the bytes that
	// ReplacePolicy allocates, for an engine of the given shard count.
	cost := func(shards int) (retained, cutover int64) {
		before := liveHeap()
		e, err := engine.New(engine.Config{Policy: pol(1), Shards: shards, SweepEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		retained = int64(liveHeap()) - int64(before)
		a := allocated()
		if err := e.ReplacePolicy(context.Background(), pol(2), 1); err != nil {
			t.Fatal(err)
		}
		return retained, int64(allocated() - a)
	}
	r1, c1 := cost(1)
	r16, c16 := cost(16)
	t.Logf("New retains %d B at 1 shard, %d B at 16; ReplacePolicy allocates %d B and %d B", r1, r16, c1, c16)
	if r16 > 2*r1 {
		t.Errorf("New of 16 shards retains %d B, more than twice the %d B of one shard: each shard has a limit table of its own", r16, r1)
	}
	if c16 > 2*c1 {
		t.Errorf("ReplacePolicy on 16 shards allocates %d B, more than twice the %d B of one shard: each shard builds a limit table of its own", c16, c1)
	}
}
