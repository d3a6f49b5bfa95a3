package shard

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// TestTableMatchesMap drives the table and a Go map with the same random
// inserts, lookups and removals, over segment sizes that split at every few
// keys or never, with short, empty-prefix-sharing and long keys. After every
// step the table must hold exactly the map's keys and buckets, and its
// directory must be well formed. Every lookup is warmed first, as a batch's
// are, among other keys present and absent: warming reads the table in
// every state it gets into and must leave it as it was, and the lookups its
// hints lead to must find what find does.
func TestTableMatchesMap(t *testing.T) {
	skipUnderRace(t)
	// long of every 2 keys is too long to inline: with none, every segment
	// keeps short keys in its slots; with both, every segment keeps all its
	// keys in its arena; with one, segments change layout as keys come and go.
	for _, long := range []int{0, 1, 2} {
		for _, groups := range []int{1, 2, 3, 8, maxGroups} {
			for seed := uint64(1); seed <= 4; seed++ {
				t.Run(fmt.Sprintf("long=%d/maxGroups=%d/seed=%d", long, groups, seed), func(t *testing.T) {
					tableMatchesMap(t, long, groups, seed)
				})
			}
		}
	}
}

// tableMatchesMap is one run of TestTableMatchesMap.
func tableMatchesMap(t *testing.T, long, groups int, seed uint64) {
	r := rand.New(rand.NewPCG(seed, uint64(groups)))
	tab := newTable(&testHasher)
	tab.maxGroups = groups
	model := map[string]int64{}
	universe := 50 + r.IntN(3000)
	key := func() string {
		i := r.IntN(universe)
		switch i % 97 {
		case 0:
			return strings.Repeat("L", longKey+1+i) // kept outside the arena
		case 1:
			return strings.Repeat("x", 1+i%300)
		}
		if i%2 < long {
			return fmt.Sprintf("tenant:%d:user-too-long-to-inline", i)
		}
		return fmt.Sprintf("tenant:%d:user", i)
	}
	steps := 4000
	for step := range steps {
		k := key()
		h := testHasher.Sum(k)
		warm := []msg.Item{{Key: k, Hash: h}}
		for range 3 {
			o := key()
			warm = append(warm, msg.Item{Key: o, Hash: testHasher.Sum(o)})
		}
		tab.warm(warm)
		b := tab.findWarmed(0, h, k)
		require.Same(t, tab.find(h, k), b, "step %d: the warmed lookup finds what find does", step)
		for i, it := range warm[1:] {
			require.Same(t, tab.find(it.Hash, it.Key), tab.findWarmed(i+1, it.Hash, it.Key))
		}
		tab.unwarm()
		want, ok := model[k]
		require.Equal(t, ok, b != nil, "step %d: find %q", step, k[:min(len(k), 20)])
		switch {
		case ok && r.IntN(3) == 0:
			removeKey(&tab, k)
			delete(model, k)
		case ok:
			require.Equal(t, want, b.Tokens)
			b.Tokens++
			model[k]++
		default:
			b = tab.insert(h, k, false)
			require.Equal(t, policy.Bucket{}, *b, "a new slot holds a zero bucket")
			b.Tokens = int64(step)
			model[k] = int64(step)
		}
		if step%500 == 0 || step == steps-1 {
			checkTable(t, &tab, model)
		}
	}
	wide, narrow := layouts(&tab)
	switch long {
	case 0:
		// A tiny segment may hold mostly the rare long keys.
		require.Less(t, 4*narrow, wide+narrow, "short keys keep segments inline")
	case 2:
		require.NotZero(t, narrow, "long keys make segments narrow")
	}
}

// layouts counts tab's segments that keep short keys inline and those that
// keep every key in their arena.
func layouts(tab *table) (wide, narrow int) {
	for s := range tab.segments() {
		if s.inline() {
			wide++
		} else {
			narrow++
		}
	}
	return wide, narrow
}

// removeKey deletes key from tab, as a sweep does.
func removeKey(tab *table, key string) {
	hm := tab.hashOf(key)
	_, s := tab.segmentOf(hm)
	tab.remove(s, s.find(hm, key))
	tab.shrink(s)
}

// checkTable asserts that tab holds exactly model, that every segment's
// directory entries form one aligned run of the right length, and that each
// key sits in the segment its hash prefix names.
func checkTable(t *testing.T, tab *table, model map[string]int64) {
	t.Helper()
	require.Equal(t, len(model), tab.count)
	seen := map[string]bool{}
	tab.each(func(k string, b *policy.Bucket) {
		require.False(t, seen[k], "key visited twice")
		seen[k] = true
		want, ok := model[k]
		require.True(t, ok, "key %q is not in the model", k[:min(len(k), 20)])
		require.Equal(t, want, b.Tokens)
	})
	require.Len(t, seen, len(model))
	require.Len(t, tab.dir, 1<<tab.depth)
	live := 0
	for i := 0; i < len(tab.dir); {
		s := tab.dir[i]
		span := 1 << (tab.depth - s.depth)
		require.Zero(t, i%span, "segment entries aligned")
		for j := range span {
			require.Same(t, s, tab.dir[i+j], "segment entries contiguous")
		}
		s.eachFull(func(j int) {
			idx := int(tab.hashOf(s.key(s.at(j))) >> (64 - uint(tab.depth)))
			require.True(t, idx >= i && idx < i+span, "key in its segment's hash range")
		})
		used, tomb := 0, 0
		for _, w := range s.ctrl {
			for j := range groupSize {
				switch c := uint8(w >> (8 * j)); {
				case c == ctrlDeleted:
					tomb++
				case c < ctrlEmpty:
					used++
				}
			}
		}
		require.Equal(t, s.count, used)
		require.Equal(t, s.dead, tomb)
		arenaBytes := 0
		s.eachFull(func(j int) {
			if sl := s.at(j); sl.meta&arenaBit != 0 {
				_, n := sl.place()
				arenaBytes += int(n)
			}
		})
		require.Equal(t, s.live, arenaBytes, "live counts the arena keys' bytes")
		require.Less(t, s.count+s.dead, s.nslot, "an empty slot ends every probe")
		live += s.count
		i += span
	}
	require.Equal(t, tab.count, live)
}

// TestTableShrinksAfterSweep: once a sweep has evicted most keys, the table
// gives the memory back rather than keeping its high-water size.
func TestTableShrinksAfterSweep(t *testing.T) {
	skipUnderRace(t)
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}), NewBudget(1<<20), &testHasher)
	for i := range 100_000 {
		require.NoError(t, s.allow(0, fmt.Sprintf("k%d", i), 1).Err)
	}
	slots := func() (n int) {
		for seg := range s.tab.segments() {
			n += seg.nslot
		}
		return n
	}
	before := slots()
	require.GreaterOrEqual(t, before, 100_000)
	assert.Equal(t, 100_000, sweepAll(s, int64(10e9)).Evicted)
	assert.Zero(t, s.keyCount())
	assert.Less(t, slots(), before/50, "emptied segments shrank")
}

// TestKeyIsCopied: the table keeps its own copy of a key, so a key that
// aliases a request buffer may change once the call returns.
func TestKeyIsCopied(t *testing.T) {
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}), NewBudget(10), &testHasher)
	buf := []byte("tenant-a")
	key := unsafe.String(&buf[0], len(buf)) // what a zero-copy parser hands over
	require.NoError(t, s.allow(0, key, 5).Err)
	buf[0] = 'X'
	_, ok := s.bucket("tenant-a")
	assert.True(t, ok, "the key as it was when created")
	_, ok = s.bucket("Xenant-a")
	assert.False(t, ok)
}

// TestSlotSize holds the memory budget: 32 bytes per slot, the bucket's 24
// and a key's place in the arena, or 48 with a short key's bytes, with no
// pointer for the GC to scan.
func TestSlotSize(t *testing.T) {
	assert.Equal(t, uintptr(narrowBytes), unsafe.Sizeof(slot{}))
	assert.Equal(t, uintptr(24), unsafe.Offsetof(slot{}.meta))
	assert.Equal(t, uintptr(slotBytes), unsafe.Offsetof(slot{}.kb)+inlineKey, "keys of up to 23 bytes fill a wide slot")
	for _, stride := range []int{slotBytes, narrowBytes} {
		assert.Zero(t, maxGroups*groupSize*stride%pageBytes, "a full segment's slots fill whole pages")
	}
	var noPointers func(reflect.Type)
	noPointers = func(ty reflect.Type) {
		switch ty.Kind() {
		case reflect.Struct:
			for i := range ty.NumField() {
				noPointers(ty.Field(i).Type)
			}
		case reflect.Array:
			noPointers(ty.Elem())
		default:
			assert.LessOrEqual(t, ty.Kind(), reflect.Complex128, "%v holds a pointer", ty)
		}
	}
	noPointers(reflect.TypeFor[slot]())
}

// TestLongKeyIsCopied: a key too long for the arena is copied too, and the
// slots of removed long keys are reused rather than piling up.
func TestLongKeyIsCopied(t *testing.T) {
	s := newState(NewLimits(policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}), NewBudget(10), &testHasher)
	buf := []byte(strings.Repeat("k", longKey+1))
	key := unsafe.String(&buf[0], len(buf))
	require.NoError(t, s.allow(0, key, 5).Err)
	want := strings.Repeat("k", longKey+1)
	buf[0] = 'X'
	_, ok := s.bucket(want)
	assert.True(t, ok, "the key as it was when created")

	// Create and evict a long key many times: the long-key store stays small.
	for i := range 1000 {
		require.NoError(t, s.allow(int64(i)*10e9, want, 1).Err)
		require.Equal(t, 1, sweepAll(s, int64(i)*10e9+5e9).Evicted)
	}
	for seg := range s.tab.segments() {
		assert.LessOrEqual(t, len(seg.long), 2)
	}
}

// TestShortKeysStayInSlots: keys of up to inlineKey bytes live in their
// slots, so a table of them keeps no arena at all, and a lookup reads one
// slot; one byte more and the key moves to the arena.
func TestShortKeysStayInSlots(t *testing.T) {
	tab := newTable(&testHasher)
	tab.maxGroups = 4 // many segments, split many times
	for i := range 5000 {
		k := fmt.Sprintf("%0*d", inlineKey, i)
		*tab.insert(testHasher.Sum(k), k, false) = policy.Bucket{Tokens: int64(i)}
	}
	arena := func() (n int) {
		for seg := range tab.segments() {
			n += cap(seg.arena)
		}
		return n
	}
	require.Zero(t, arena())
	for i := range 5000 {
		k := fmt.Sprintf("%0*d", inlineKey, i)
		b := tab.find(testHasher.Sum(k), k)
		require.NotNil(t, b)
		require.Equal(t, int64(i), b.Tokens)
	}
	k := strings.Repeat("k", inlineKey+1)
	tab.insert(testHasher.Sum(k), k, false)
	assert.NotZero(t, arena())
	assert.NotNil(t, tab.find(testHasher.Sum(k), k))
	assert.Nil(t, tab.find(testHasher.Sum(k[1:]), k[1:]))
}

// TestBornSurvivesRehash: a key created ahead of a sweep's cursor keeps its
// mark through every split and compaction, wherever its bytes live, and
// lookups tell apart keys that differ only past the inline length.
func TestBornSurvivesRehash(t *testing.T) {
	skipUnderRace(t)
	tab := newTable(&testHasher)
	tab.maxGroups = 2
	key := func(i int) string {
		switch i % 3 {
		case 0:
			return fmt.Sprintf("%0*d", inlineKey, i) // fills the slot
		case 1:
			return fmt.Sprintf("%0*d", inlineKey+1, i) // one byte too many: the arena
		}
		return fmt.Sprintf("%0*d", longKey+1, i) // kept as its own string
	}
	const n = 600
	for i := range n {
		tab.insert(testHasher.Sum(key(i)), key(i), i%2 == 0)
	}
	require.Greater(t, tab.depth, uint8(3), "the table split")
	for i := range n {
		hm := tab.hashOf(key(i))
		_, seg := tab.segmentOf(hm)
		j := seg.find(hm, key(i))
		require.GreaterOrEqual(t, j, 0)
		assert.Equal(t, i%2 == 0, seg.at(j).meta&bornBit != 0, "key %d", i)
		// The same bytes one shorter or longer are other keys.
		for _, other := range []string{key(i)[1:], "0" + key(i)} {
			assert.Nil(t, tab.find(testHasher.Sum(other), other))
		}
	}
}

// TestLongKeysPackNarrow: once most of a segment's keys are too long for its
// slots, a rehash packs its slots 32 bytes apart, with every key, short ones
// too, in the arena; and short keys taking over make it wide again at its
// next rehash.
func TestLongKeysPackNarrow(t *testing.T) {
	tab := newTable(&testHasher)
	tab.maxGroups = 4
	keys := func(width, n int) (ks []string) {
		for i := range n {
			ks = append(ks, fmt.Sprintf("%0*d", width, i))
		}
		return ks
	}
	long, short := keys(inlineKey+1, 3000), keys(5, 300)
	// A short key after every ten long ones, so that rehashes see mostly
	// long keys. Not every one does: a small segment split off with, by
	// chance, half its keys short stays wide until its next rehash, and
	// the hash is seeded at random per process (one segment of about 160
	// in 3% of runs). A rule that did not pack would leave most wide.
	for i, k := range long {
		tab.insert(testHasher.Sum(k), k, false)
		if i%10 == 9 {
			tab.insert(testHasher.Sum(short[i/10]), short[i/10], false)
		}
	}
	wide, narrow := layouts(&tab)
	assert.LessOrEqual(t, 20*wide, narrow, "a tenth of the keys short: segments narrow")
	for _, k := range append(short, long...) {
		require.NotNil(t, tab.find(testHasher.Sum(k), k), k)
	}
	for _, k := range long {
		removeKey(&tab, k)
	}
	for _, k := range keys(6, 3000) {
		tab.insert(testHasher.Sum(k), k, false)
	}
	wide, narrow = layouts(&tab)
	assert.Greater(t, wide, 2*narrow, "short keys only: segments turn wide as they rehash")
	for _, k := range short {
		require.NotNil(t, tab.find(testHasher.Sum(k), k), k)
	}
}

// TestFindChecksTheLastKey: find tries the slot it last returned first, for
// a hot key's runs of requests. That slot must answer only for its own key:
// not for another key of the same hash, not once the key is removed, and not
// once a rehash has moved the key elsewhere.
func TestFindChecksTheLastKey(t *testing.T) {
	tab := newTable(&testHasher)
	h := uint64(12345) // one hash for two keys: find must compare keys
	*tab.insert(h, "a", false) = policy.Bucket{Tokens: 1}
	require.Equal(t, int64(1), tab.find(h, "a").Tokens)
	require.Nil(t, tab.find(h, "b"), "another key of the same hash")
	*tab.insert(h, "b", false) = policy.Bucket{Tokens: 2}
	require.Equal(t, int64(2), tab.find(h, "b").Tokens)
	require.Equal(t, int64(1), tab.find(h, "a").Tokens)
	require.Equal(t, int64(2), tab.find(h, "b").Tokens)

	_, s := tab.segmentOf(h * mix)
	tab.remove(s, s.find(h*mix, "b"))
	require.Nil(t, tab.find(h, "b"), "removed after it was found")
	require.Equal(t, int64(1), tab.find(h, "a").Tokens)

	// A removed slot is zeroed, which reads as holding the empty key: the
	// engine never stores it, but State takes any key it is given.
	empty := testHasher.Sum("")
	tab.insert(empty, "", false)
	require.NotNil(t, tab.find(empty, ""))
	_, s = tab.segmentOf(empty * mix)
	tab.remove(s, s.find(empty*mix, ""))
	require.Nil(t, tab.find(empty, ""), "the empty key, removed after it was found")

	// Most keys are removed, then "k7" is found, then a sweep finds the
	// segment sparse and shrinks it, moving "k7": removals forget the last
	// slot, the rehash must too.
	tab = newTable(&testHasher)
	for i := range 1000 {
		k := fmt.Sprintf("k%d", i)
		*tab.insert(testHasher.Sum(k), k, false) = policy.Bucket{Tokens: int64(i)}
	}
	for i := range 1000 {
		if k := fmt.Sprintf("k%d", i); i != 7 {
			hm := tab.hashOf(k)
			_, s := tab.segmentOf(hm)
			tab.remove(s, s.find(hm, k))
		}
	}
	before := tab.find(testHasher.Sum("k7"), "k7")
	_, s = tab.segmentOf(tab.hashOf("k7"))
	tab.shrink(s)
	_, shrunk := tab.segmentOf(tab.hashOf("k7"))
	require.NotSame(t, s, shrunk, "the sweep shrank the segment")
	b := tab.find(testHasher.Sum("k7"), "k7")
	require.NotSame(t, before, b, "the key moved")
	require.Equal(t, int64(7), b.Tokens)
	b.Tokens = 8
	var seen int64
	tab.each(func(k string, b *policy.Bucket) {
		if k == "k7" {
			seen = b.Tokens
		}
	})
	require.Equal(t, int64(8), seen, "find returned the bucket in the table")
}
