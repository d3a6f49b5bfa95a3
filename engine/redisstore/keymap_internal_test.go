package redisstore

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
)

// TestSipHashVectors: sipHash is SipHash-2-4, by the reference key
// 00 01 .. 0f and messages 00 01 .. (n-1) bytes long (the empty message's
// and the 15-byte one's are the reference's own; the others were computed
// with github.com/dchest/siphash, which sipHash now calls), over every
// tail length; and it copies no key, however long.
func TestSipHashVectors(t *testing.T) {
	long := strings.Repeat("k", 1000)
	if n := testing.AllocsPerRun(100, func() { sipHash(1, 2, long) }); n != 0 {
		t.Errorf("sipHash of a %d-byte key allocates %v times", len(long), n)
	}
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for _, v := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{1, 0x74f839c593dc67fd},
		{7, 0xab0200f58b01d137},
		{8, 0x93f5f5799a932462},
		{9, 0x9e0082df0ba9e4b0},
		{15, 0xa129ca6149be45e5},
		{16, 0x3f2acc7f57c29bdb},
		{17, 0x699ae9f52cbe4794},
		{63, 0x958a324ceb064572},
	} {
		if got := sipHash(k0, k1, string(msg[:v.n])); got != v.want {
			t.Errorf("sipHash of %d bytes = %#016x, want %#016x", v.n, got, v.want)
		}
	}
}

// fnvShard is the unseeded mapping this package used before key maps:
// FNV-1a of the key's hash tag modulo n, which anyone can compute.
func fnvShard(key string, n int) int {
	t := hashTag(key)
	h := uint32(2166136261)
	for i := 0; i < len(t); i++ {
		h ^= uint32(t[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// randomMap is a key map of a fresh seed, as New draws one.
func randomMap(t *testing.T, ignoreTags bool) keyMap {
	t.Helper()
	m, err := parseKeyMap(newSeed(), tagsArg(ignoreTags))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// spread counts keys per shard among n under m, and fails unless every
// shard gets some and none more than twice its share.
func spread(t *testing.T, m keyMap, keys []string, n int) {
	t.Helper()
	per := make([]int, n)
	for _, k := range keys {
		per[m.shardOf(k, n)]++
	}
	for i, c := range per {
		if c == 0 || c > 2*len(keys)/n {
			t.Fatalf("shard %d holds %d of %d keys (per shard: %v)", i, c, len(keys), per)
		}
	}
}

// TestSeededMapSpreadsChosenKeys: keys chosen by brute force to share one
// shard under the unseeded hash, plain or by their tags, spread over every
// shard under a seeded map, about evenly (each shard's count is binomial
// with mean 100 and deviation 10 here; the bound is ten deviations off).
func TestSeededMapSpreadsChosenKeys(t *testing.T) {
	const n, want = DefaultVirtualShards, 1600
	var plain, tagged []string
	for i := 0; len(plain) < want || len(tagged) < want; i++ {
		if k := "attacker:" + strconv.Itoa(i); len(plain) < want && fnvShard(k, n) == 0 {
			plain = append(plain, k)
		}
		if k := "{" + strconv.Itoa(i) + "}x"; len(tagged) < want && fnvShard(k, n) == 0 {
			tagged = append(tagged, k)
		}
	}
	m := randomMap(t, false)
	spread(t, m, plain, n)
	spread(t, m, tagged, n)
	// One tag still picks one shard: tagged keys that share a tag share it.
	for _, k := range tagged[:100] {
		if m.shardOf(k, n) != m.shardOf(k+"-other", n) {
			t.Fatalf("%q and %q share a tag and not a shard", k, k+"-other")
		}
	}
}

// TestSeedsMapDifferently: two seeds place a set of keys differently
// (each key agrees by chance, 1 in 16; all 1000 agreeing would be
// 16^-1000).
func TestSeedsMapDifferently(t *testing.T) {
	a, b := randomMap(t, false), randomMap(t, false)
	same := 0
	for i := range 1000 {
		k := "k" + strconv.Itoa(i)
		if a.shardOf(k, DefaultVirtualShards) == b.shardOf(k, DefaultVirtualShards) {
			same++
		}
	}
	if same > 200 {
		t.Fatalf("two seeds agree on %d of 1000 keys", same)
	}
}

// TestIgnoreTagsMap: a map that ignores tags hashes the whole key, so the
// keys of one tag spread over the shards, and a key's shard is the hash of
// all its bytes.
func TestIgnoreTagsMap(t *testing.T) {
	m := randomMap(t, true)
	keys := make([]string, 1600)
	for i := range keys {
		keys[i] = "{victim}" + strconv.Itoa(i)
	}
	spread(t, m, keys, DefaultVirtualShards)
	for _, k := range keys[:50] {
		if got, want := m.shardOf(k, DefaultVirtualShards), int(sipHash(m.k0, m.k1, k)%DefaultVirtualShards); got != want {
			t.Fatalf("shard of %q = %d, want the whole key's %d", k, got, want)
		}
	}
}

// TestParseKeyMap: a stored key map reads back as drawn; anything else is
// ErrUnavailable, never a map of some other seed.
func TestParseKeyMap(t *testing.T) {
	var b [seedBytes]byte
	_, _ = rand.Read(b[:])
	seed := ""
	for _, c := range b {
		seed += strconv.FormatUint(uint64(c>>4), 16) + strconv.FormatUint(uint64(c&15), 16)
	}
	m, err := parseKeyMap(seed, "1")
	if err != nil {
		t.Fatal(err)
	}
	if m.k0 != binary.LittleEndian.Uint64(b[:8]) || m.k1 != binary.LittleEndian.Uint64(b[8:]) || m.ignoreTags {
		t.Fatalf("parseKeyMap(%q, 1) = %+v", seed, m)
	}
	if m, err := parseKeyMap(seed, "0"); err != nil || !m.ignoreTags {
		t.Fatalf("parseKeyMap(%q, 0) = %+v, %v", seed, m, err)
	}
	if x, y := newSeed(), newSeed(); len(x) != 2*seedBytes || x == y {
		t.Fatal("newSeed is not a fresh 16-byte seed in hex")
	}
	for _, bad := range [][2]string{{"", "1"}, {seed[:30], "1"}, {seed + "00", "1"}, {"zz" + seed[2:], "1"}, {seed, ""}, {seed, "2"}} {
		if _, err := parseKeyMap(bad[0], bad[1]); err == nil {
			t.Errorf("parseKeyMap(%q, %q) took a malformed map", bad[0], bad[1])
		}
	}
}

func BenchmarkShardOf(b *testing.B) {
	m := keyMap{k0: 1, k1: 2}
	for _, k := range []string{"user:12345", "{tenant:42}:api-token:0123456789abcdef", "a-key-of-sixty-four-bytes-a-key-of-sixty-four-bytes-0123456789ab"} {
		b.Run(strconv.Itoa(len(k)), func(b *testing.B) {
			for b.Loop() {
				_ = m.shardOf(k, DefaultVirtualShards)
			}
		})
	}
}
