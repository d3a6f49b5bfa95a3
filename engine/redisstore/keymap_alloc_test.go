//go:build !race

package redisstore

import "testing"

// TestShardOfAllocs: mapping a key to its shard allocates nothing, with a
// tag or without, ignoring tags or not.
func TestShardOfAllocs(t *testing.T) {
	for _, m := range []keyMap{{k0: 1, k1: 2}, {k0: 1, k1: 2, ignoreTags: true}} {
		for _, k := range []string{"user:12345", "{tenant:42}:api-token:0123456789abcdef"} {
			if n := testing.AllocsPerRun(100, func() { _ = m.shardOf(k, DefaultVirtualShards) }); n != 0 {
				t.Errorf("shardOf(%q), ignoreTags %v: %v allocations", k, m.ignoreTags, n)
			}
		}
	}
}
