package redisstore

import (
	"strconv"
	"testing"
)

func TestHashTag(t *testing.T) {
	for _, tc := range []struct{ key, tag string }{
		{"plain", "plain"},
		{"{user:1}:a", "user:1"},
		{"a{b}c{d}", "b"},
		{"{}x", "{}x"},  // empty: the whole key
		{"a{b", "a{b"},  // no closing brace
		{"a}b{c}", "c"}, // a brace before the first "{" does not count
		{"{{x}}", "{x"}, // up to the first "}"
	} {
		if got := hashTag(tc.key); got != tc.tag {
			t.Errorf("hashTag(%q) = %q, want %q", tc.key, got, tc.tag)
		}
	}
	m := keyMap{k0: 1, k1: 2}
	if m.shardOf("{t}a", 16) != m.shardOf("{t}b", 16) {
		t.Error("keys of one tag in different shards")
	}
	if crc16("123456789") != 0x31c3 { // CRC-16/XMODEM's check value, as Redis Cluster's
		t.Errorf("crc16 = %#x", crc16("123456789"))
	}
}

// TestShardTagsSpread: the tags of up to evenTags shards put shard i's slot
// in the i-th of n equal ranges, so equal runs of slots (a cluster's
// masters) hold equal numbers of shards; every tag is distinct and holds
// no brace.
func TestShardTagsSpread(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16, 64, 65, MaxVirtualShards} {
		tags := shardTags("", n)
		seen := map[string]bool{}
		for i, tg := range tags {
			if seen[tg] {
				t.Fatalf("n=%d: tag %q twice", n, tg)
			}
			seen[tg] = true
			for j := range len(tg) {
				if tg[j] == '{' || tg[j] == '}' {
					t.Fatalf("n=%d: tag %q holds a brace", n, tg)
				}
			}
			if sl := int(crc16(tg) % slots); n <= evenTags && (sl < i*slots/n || sl >= (i+1)*slots/n) {
				t.Fatalf("n=%d: shard %d's slot %d is outside [%d, %d)", n, i, sl, i*slots/n, (i+1)*slots/n)
			}
		}
	}
	// three equal runs of slots, as redis-cli --cluster create makes
	per := [3]int{}
	for _, tg := range shardTags("", DefaultVirtualShards) {
		per[int(crc16(tg)%slots)*3/slots]++
	}
	for m, c := range per {
		if c < DefaultVirtualShards/3 {
			t.Errorf("master %d holds %d of %d shards", m, c, DefaultVirtualShards)
		}
	}
}

// TestBucketKeyRoundTrip: a bucket's Redis key parses back to the user's
// key, whatever its bytes, and a key in the wrong shard is not taken.
func TestBucketKeyRoundTrip(t *testing.T) {
	s := &Store{prefix: "p{x:"}
	s.kmap.Store(&keyMap{})
	s.globals()
	s.layout(DefaultVirtualShards)
	for i := range 200 {
		k := "k}{" + strconv.Itoa(i)
		rk := s.shards[s.shard(k)].bucket + k
		got, ok := s.bucketKeyOf(rk)
		if !ok || got != k {
			t.Fatalf("bucketKeyOf(%q) = %q, %v; want %q", rk, got, ok, k)
		}
		wrong := s.shards[(s.shard(k)+1)%len(s.shards)].bucket + k
		if _, ok := s.bucketKeyOf(wrong); ok {
			t.Fatalf("bucketKeyOf(%q) took a key of another shard", wrong)
		}
	}
	for _, k := range []string{s.kPolicy, s.shards[0].policy, s.shards[3].pending, "p{x:" + "{nope}k:a"} {
		if _, ok := s.bucketKeyOf(k); ok {
			t.Errorf("bucketKeyOf(%q) took a key that is not a bucket", k)
		}
	}
}

// TestLayoutSpreadAnyPrefix: whatever braces the prefix holds, the slot
// Redis Cluster gives a shard's keys is in the shard's range (as
// TestShardTagsSpread for a plain prefix), and all of one shard's keys
// share it. A "{" the prefix leaves open makes Redis hash the text after
// it with each tag; the tags must be chosen for that text. A tag closed in
// the prefix puts every key in that tag's slot.
func TestLayoutSpreadAnyPrefix(t *testing.T) {
	slotOf := func(k string) int { return int(crc16(hashTag(k)) % slots) }
	for _, p := range []string{DefaultPrefix, "a{b:", "{", "}{:", "x{y{z", "a}b{", "{\xff\x00*"} {
		for _, n := range []int{1, 3, 16, evenTags} {
			s := &Store{prefix: p}
			s.kmap.Store(&keyMap{})
			s.globals()
			s.layout(n)
			for i, k := range s.shards {
				sl := slotOf(k.policy)
				if sl < i*slots/n || sl >= (i+1)*slots/n {
					t.Fatalf("prefix %q, n=%d: shard %d's slot %d is outside [%d, %d)", p, n, i, sl, i*slots/n, (i+1)*slots/n)
				}
				for _, o := range []string{k.history, k.pending, k.bucket + "key", k.bucket + "{key}"} {
					if slotOf(o) != sl {
						t.Fatalf("prefix %q, n=%d: shard %d's key %q is in slot %d, its policy in %d", p, n, i, o, slotOf(o), sl)
					}
				}
			}
		}
	}
	s := &Store{prefix: "app{t}:"}
	s.globals()
	s.layout(DefaultVirtualShards)
	want := int(crc16("t") % slots)
	for _, k := range append([]string{s.kPolicy, s.kLock}, s.shards[0].policy, s.shards[9].bucket+"key") {
		if slotOf(k) != want {
			t.Errorf("prefix app{t}: key %q is in slot %d, not the prefix tag's %d", k, slotOf(k), want)
		}
	}
}
