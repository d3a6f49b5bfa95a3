package shard

import (
	"encoding/binary"
	"iter"
	"math"
	"math/bits"
	"strings"
	"unsafe"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// The bucket table of one shard. A Go map[string]policy.Bucket costs about
// 84 bytes per key at a million keys (a 16-byte string header and the key's
// own allocation, at the load a doubling map keeps) and scans a pointer per
// key at every GC. This table keeps a 48-byte slot per key, the 24-byte
// bucket and the key's own bytes when they fit (up to inlineKey), and one
// control byte per slot, at a load between 0.7 and 0.875, so about 62 bytes
// per key all told for keys of 16 to 23 bytes, with no pointers. A longer
// key lives in a per-segment arena and its slot says where. A lookup of a
// short key then reads one slot, in one page, instead of a slot and then
// its key somewhere else in memory: over a million keys that second miss,
// and its page walk, was a quarter of a batched decision's time. A segment
// whose keys are mostly longer packs its slots 32 bytes apart instead, all
// its keys in the arena (about 40 bytes per key, and the key itself), so
// long keys do not pay for room they cannot use.
//
// It is an extendible hash table: a directory indexed by the top bits of the
// mixed hash points at segments, each an open-addressing table of groups of
// eight slots probed linearly, with a control word per group matched eight
// bytes at a time (the layout of Abseil's Swiss tables, without SIMD). A
// segment grows by a quarter at a time, so the load stays high at every size,
// and past maxGroups it splits in two on the next hash bit, so no single
// operation rehashes more than one segment: a few tens of microseconds, at any
// key count. The directory keeps keys in hash order across segments, which is
// what lets a sweep walk it in slices while keys come and go.
const (
	groupSize = 8
	maxGroups = 512 // a segment's size before it splits: 4096 slots
	maxDepth  = 40  // directory bits; past this a segment grows instead of splitting

	// loadNum/loadDen is the load a rehash leaves behind; a segment grows when
	// 7 of every 8 slots are used (live or tombstone), so its load stays
	// between 0.75 and 0.875.
	loadNum, loadDen = 3, 4

	// Large allocations are rounded up to 8 KiB pages: sizes that would be
	// rounded are grown to the page instead, so the rounding holds keys.
	pageBytes     = 8 << 10
	maxSmallAlloc = 32 << 10 // larger allocations are whole pages

	// Slots are slotBytes apart in a segment that holds short keys inline,
	// narrowBytes apart in one that keeps every key in its arena.
	slotBytes   = 48
	narrowBytes = 32

	// A slot holds keys of up to inlineKey bytes itself. Keys longer than
	// longKey are kept as their own strings rather than in the arena, which
	// keeps a segment's arena well inside its 32-bit offsets.
	inlineKey = 23
	longKey   = 1<<16 - 1 // so an arena key's length fits place's 16 bits

	// slot.meta: the length of an inline key, or one of arenaBit and longBit
	// for a key kept elsewhere; and bornBit.
	lenMask  = 0x1f
	arenaBit = 0x20 // the key is in the arena, where place says
	longBit  = 0x40 // the key is in segment.long, where place says
	bornBit  = 0x80 // created during the sweep in progress, ahead of its cursor

	ctrlEmpty   = 0x80
	ctrlDeleted = 0xfe
	lsbs        = 0x0101010101010101
	msbs        = 0x8080808080808080

	// mix spreads the routing hash again, so the bits the table uses do not
	// repeat the bits that chose the shard (a multiply-shift of the hash).
	mix = 0x9e3779b97f4a7c15
)

// slot is what every slot has: a narrow slot is exactly this, and a wide
// one is this and then 16 more bytes, so that from kb on it has room for
// inlineKey bytes of a key (see inlineBytes).
type slot struct {
	b    policy.Bucket
	meta uint8
	kb   [narrowBytes - 25]byte // an arena or long key's place, or an inline key's start
}

// inlineBytes returns the n bytes of a wide slot's key, from kb on.
func (sl *slot) inlineBytes(n int) []byte {
	return unsafe.Slice(&sl.kb[0], n)
}

// place returns where the key of a slot with arenaBit or longBit lives: its
// offset in the arena and length, or its index in long.
func (sl *slot) place() (off, n uint32) {
	return binary.LittleEndian.Uint32(sl.kb[0:]), uint32(binary.LittleEndian.Uint16(sl.kb[4:]))
}

func (sl *slot) setPlace(meta uint8, off, n uint32) {
	sl.meta = meta
	binary.LittleEndian.PutUint32(sl.kb[0:], off)
	binary.LittleEndian.PutUint16(sl.kb[4:], uint16(n))
}

type segment struct {
	depth    uint8    // prefix bits its keys share
	ctrl     []uint64 // a control byte per slot, eight per group
	words    []uint64 // the slots, stride bytes apart (see at), with no pointers
	nslot    int      // groups * groupSize
	stride   uintptr  // slotBytes, or narrowBytes when every key is in the arena
	count    int      // live slots
	dead     int      // tombstones
	arena    []byte   // the keys up to longKey that the slots do not hold
	live     int      // arena bytes held by live keys
	long     []string // long keys; "" where one was deleted
	longFree []uint32 // indices of long that are ""
}

type table struct {
	hasher    *Hasher
	dir       []*segment
	depth     uint8
	count     int
	maxGroups int      // maxGroups, or less in tests that want many segments
	hashes    []uint64 // scratch for rehash

	moves  uint64 // rehashes so far: slots stay where they are in between
	hints  []hint // where the last warm found each of its items
	hinted uint64 // moves when the hints were taken
	// warmArena: some key of the warm in progress may be in an arena.
	warmArena bool

	// The slot find or insert last returned, and its key's hash: a hot
	// key's requests come in runs, and checking that slot first skips the
	// probe; holds tells whether it holds the key asked for. It is always
	// full, as holds requires: a removal forgets it, as does a rehash,
	// which moves slots (and so no replaced segment is kept alive).
	lastH    uint64
	lastSeg  *segment
	lastSlot *slot // nil: none
}

// hint is where warm looked for an item's key: its segment, the group its
// probe starts at, and the slot of the first tag match there, which is
// almost always the key's slot when the key is present.
type hint struct {
	seg  *segment
	g    int32
	slot int32 // -1: no tag match in the first group
	tag  uint8
}

func newTable(h *Hasher) table {
	return table{hasher: h, dir: []*segment{newSegment(0, 1, 0, slotBytes)}, maxGroups: maxGroups}
}

// newSegment returns an empty segment of groups groups whose slots are
// stride bytes apart, with an arena for keyBytes of keys.
func newSegment(depth uint8, groups, keyBytes int, stride uintptr) *segment {
	n := groups * groupSize
	s := &segment{
		depth:  depth,
		ctrl:   make([]uint64, groups),
		nslot:  n,
		stride: stride,
		words:  make([]uint64, uintptr(n)*stride/8),
	}
	for i := range s.ctrl {
		s.ctrl[i] = lsbs * ctrlEmpty
	}
	if keyBytes > 0 {
		s.arena = make([]byte, 0, arenaFor(keyBytes))
	}
	return s
}

// arenaFor is the arena size for n bytes of keys: an eighth to spare, so
// keys cost little more than their bytes, and a compaction (which copies
// the live keys) comes once every eighth of growth.
func arenaFor(n int) int {
	n += n/8 + 64
	if n > pageBytes {
		n = (n + pageBytes - 1) / pageBytes * pageBytes // the allocator's rounding, used
	}
	return n
}

// groupsFor is the group count a rehash gives a segment of n keys with
// slots stride bytes apart. Past the allocator's size classes it takes as
// many groups as fill the whole pages it would round the slots up to anyway.
func groupsFor(n int, stride uintptr) int {
	g := max(1, (n*loadDen+groupSize*loadNum-1)/(groupSize*loadNum))
	if gb := groupSize * int(stride); g*gb > maxSmallAlloc {
		g = (g*gb + pageBytes - 1) / pageBytes * pageBytes / gb
	}
	return g
}

// at returns slot i.
func (s *segment) at(i int) *slot {
	if uint(i) >= uint(s.nslot) {
		panic("shard: slot index out of range")
	}
	return (*slot)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(s.words)), uintptr(i)*s.stride))
}

// inline reports whether the segment keeps short keys in their slots.
func (s *segment) inline() bool { return s.stride == slotBytes }

// limit is how many slots may be used, live or tombstone, before a rehash.
// It always leaves an empty slot, so every probe ends.
func (s *segment) limit() int { return len(s.ctrl) * (groupSize - 1) }

func matchByte(w uint64, b uint8) uint64 {
	x := w ^ (lsbs * uint64(b))
	return (x - lsbs) &^ x & msbs // may report a false match next to a true one
}

func matchEmpty(w uint64) uint64          { return w &^ (w << 6) & msbs }
func matchEmptyOrDeleted(w uint64) uint64 { return w & msbs }
func matchFull(w uint64) uint64           { return ^w & msbs }

func setCtrl(w *uint64, j int, c uint8) {
	shift := uint(j) * 8
	*w = *w&^(0xff<<shift) | uint64(c)<<shift
}

// start returns the first group probed for hm, and its control tag.
func (s *segment) start(hm uint64) (int, uint8) {
	g, _ := bits.Mul32(uint32(hm>>7), uint32(len(s.ctrl)))
	return int(g), uint8(hm & 0x7f)
}

// key returns the key of sl. A key in the slot or the arena is a view of
// the segment, good only until the segment next stores or removes a key:
// copy it to keep it.
func (s *segment) key(sl *slot) string {
	if sl.meta&(arenaBit|longBit) == 0 {
		return unsafe.String(&sl.kb[0], sl.meta&lenMask) // see inlineBytes
	}
	off, n := sl.place()
	if sl.meta&longBit != 0 {
		return s.long[off]
	}
	b := s.arena[off : off+n]
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// find returns the index of key's slot, or -1.
func (s *segment) find(hm uint64, key string) int {
	g, tag := s.start(hm)
	for {
		w := s.ctrl[g]
		for m := matchByte(w, tag); m != 0; m &= m - 1 {
			i := g*groupSize + bits.TrailingZeros64(m)>>3
			if s.holds(s.at(i), key) {
				return i
			}
		}
		if matchEmpty(w) != 0 {
			return -1
		}
		if g++; g == len(s.ctrl) {
			g = 0
		}
	}
}

// put claims a slot for a key known to be absent, with room already made.
func (s *segment) put(hm uint64) int {
	g, tag := s.start(hm)
	for {
		w := &s.ctrl[g]
		if m := matchEmptyOrDeleted(*w); m != 0 {
			j := bits.TrailingZeros64(m) >> 3
			if uint8(*w>>(uint(j)*8)) == ctrlDeleted {
				s.dead--
			}
			setCtrl(w, j, tag)
			s.count++
			return g*groupSize + j
		}
		if g++; g == len(s.ctrl) {
			g = 0
		}
	}
}

// holds reports whether sl, a full slot whose tag matched key's, holds key.
func (s *segment) holds(sl *slot, key string) bool {
	if len(key) <= inlineKey && sl.meta&^bornBit == uint8(len(key)) {
		return string(sl.inlineBytes(len(key))) == key
	}
	return sl.meta&(arenaBit|longBit) != 0 && s.key(sl) == key
}

// storeKey copies key into the segment and records where in sl, with flags
// (bornBit or 0).
func (s *segment) storeKey(sl *slot, key string, flags uint8) {
	switch {
	case len(key) <= inlineKey && s.inline():
		sl.meta = uint8(len(key)) | flags
		copy(sl.inlineBytes(len(key)), key)
	case len(key) > longKey || s.live+len(key) > math.MaxUint32/2:
		// A copy, as for arena keys: the caller's string may alias a
		// request buffer. A slot freed by a removal is reused.
		var i uint32
		if n := len(s.longFree); n > 0 {
			i = s.longFree[n-1]
			s.longFree = s.longFree[:n-1]
			s.long[i] = strings.Clone(key)
		} else {
			i = uint32(len(s.long))
			s.long = append(s.long, strings.Clone(key))
		}
		sl.setPlace(longBit|flags, i, 0)
	default:
		if len(s.arena)+len(key) > cap(s.arena) {
			s.compactArena(len(key))
		}
		sl.setPlace(arenaBit|flags, uint32(len(s.arena)), uint32(len(key)))
		s.arena = append(s.arena, key...)
		s.live += len(key)
	}
}

// compactArena moves the live keys into a new arena with room for extra
// more bytes, dropping deleted keys' bytes.
func (s *segment) compactArena(extra int) {
	old := s.arena
	s.arena = make([]byte, 0, arenaFor(s.live+extra))
	s.eachFull(func(i int) {
		sl := s.at(i)
		if sl.meta&arenaBit == 0 {
			return
		}
		off, n := sl.place()
		sl.setPlace(sl.meta, uint32(len(s.arena)), n)
		s.arena = append(s.arena, old[off:off+n]...)
	})
}

// eachFull calls f with the index of every live slot, in slot order. f may
// delete the slot it is given, and nothing else.
func (s *segment) eachFull(f func(i int)) {
	for g, w := range s.ctrl {
		for m := matchFull(w); m != 0; m &= m - 1 {
			f(g*groupSize + bits.TrailingZeros64(m)>>3)
		}
	}
}

// full reports whether slot i holds a key.
func (s *segment) full(i int) bool {
	return uint8(s.ctrl[i/groupSize]>>(uint(i%groupSize)*8)) < ctrlEmpty
}

// remove deletes slot i.
func (s *segment) remove(i int) {
	g, j := i/groupSize, i%groupSize
	sl := s.at(i)
	switch off, n := sl.place(); {
	case sl.meta&longBit != 0:
		s.long[off] = ""
		s.longFree = append(s.longFree, off)
	case sl.meta&arenaBit != 0:
		s.live -= int(n)
	}
	*sl = slot{}
	// A probe never passes a group that has an empty slot, so a slot in such
	// a group can become empty; otherwise it must stay a tombstone.
	if matchEmpty(s.ctrl[g]) != 0 {
		setCtrl(&s.ctrl[g], j, ctrlEmpty)
	} else {
		setCtrl(&s.ctrl[g], j, ctrlDeleted)
		s.dead++
	}
	s.count--
}

// hashOf is the table's mixed hash of key, for a rehash.
func (t *table) hashOf(key string) uint64 { return t.hasher.Sum(key) * mix }

func (t *table) segmentOf(hm uint64) (int, *segment) {
	i := int(hm >> (64 - uint(t.depth))) // 0 at depth 0
	return i, t.dir[i]
}

// find returns key's bucket, or nil. h is the Hasher's sum of key.
func (t *table) find(h uint64, key string) *policy.Bucket {
	if h == t.lastH && t.lastSlot != nil && t.lastSeg.holds(t.lastSlot, key) {
		return &t.lastSlot.b
	}
	hm := h * mix
	_, s := t.segmentOf(hm)
	if i := s.find(hm, key); i >= 0 {
		sl := s.at(i)
		t.remember(h, s, sl)
		return &sl.b
	}
	return nil
}

// remember makes sl, in s, the slot find tries first for hash h.
func (t *table) remember(h uint64, s *segment, sl *slot) {
	t.lastH, t.lastSeg, t.lastSlot = h, s, sl
}

// forget drops the slot find tries first.
func (t *table) forget() { t.lastSeg, t.lastSlot = nil, nil }

// insert adds key, known to be absent, with a zero bucket, and returns the
// bucket. The pointer is good until the next insert or sweep.
func (t *table) insert(h uint64, key string, born bool) *policy.Bucket {
	hm := h * mix
	_, s := t.segmentOf(hm)
	for s.count+s.dead >= s.limit() {
		t.rehash(s, s.count+1)
		_, s = t.segmentOf(hm)
	}
	i := s.put(hm)
	var flags uint8
	if born {
		flags = bornBit
	}
	sl := s.at(i)
	s.storeKey(sl, key, flags)
	t.count++
	t.remember(h, s, sl)
	return &sl.b
}

// remove deletes slot i of s.
func (t *table) remove(s *segment, i int) {
	s.remove(i)
	t.count--
	t.forget() // an emptied slot holds the empty key, as far as holds can tell
}

// rehash rebuilds s for n keys: in place at the right size, or split in two
// once it would outgrow the largest segment size.
func (t *table) rehash(s *segment, n int) {
	t.moves++
	t.forget()
	// Hash each key once, into a buffer the table keeps.
	t.hashes = t.hashes[:0]
	s.eachFull(func(i int) { t.hashes = append(t.hashes, t.hashOf(s.key(s.at(i)))) })
	if groupsFor(n, slotBytes) <= t.maxGroups || s.depth >= maxDepth {
		t.replace(s, s.depth, []*segment{t.copyOf(s, s.depth, n-s.count, func(uint64) bool { return true })})
		return
	}
	if s.depth == t.depth {
		t.grow()
	}
	// The key that asked for room goes to one side or the other: room for
	// it on both.
	bit := uint64(1) << (63 - s.depth)
	lo := t.copyOf(s, s.depth+1, 1, func(hm uint64) bool { return hm&bit == 0 })
	hi := t.copyOf(s, s.depth+1, 1, func(hm uint64) bool { return hm&bit != 0 })
	t.replace(s, s.depth, []*segment{lo, hi})
}

// copyOf returns a new segment of the given depth holding the entries of s
// whose mixed hash (from t.hashes) keep accepts, with room for extra more
// keys. It keeps short keys in their slots unless most of its keys are too
// long to.
func (t *table) copyOf(s *segment, depth uint8, extra int, keep func(uint64) bool) *segment {
	n, long, shortBytes, longBytes, k := 0, 0, 0, 0, 0
	s.eachFull(func(i int) {
		hm := t.hashes[k]
		k++
		if !keep(hm) {
			return
		}
		n++
		switch kn := len(s.key(s.at(i))); {
		case kn <= inlineKey:
			shortBytes += kn
		case kn <= longKey:
			long++
			longBytes += kn
		default:
			long++
		}
	})
	stride, keyBytes := uintptr(slotBytes), longBytes
	if 2*long > n {
		stride, keyBytes = narrowBytes, longBytes+shortBytes
	}
	c := newSegment(depth, groupsFor(n+extra, stride), keyBytes, stride)
	k = 0
	s.eachFull(func(i int) {
		hm := t.hashes[k]
		k++
		if !keep(hm) {
			return
		}
		sl, to := s.at(i), c.at(c.put(hm))
		to.b = sl.b
		c.storeKey(to, s.key(sl), sl.meta&bornBit)
	})
	return c
}

// grow doubles the directory.
func (t *table) grow() {
	dir := make([]*segment, 2*len(t.dir))
	for i, s := range t.dir {
		dir[2*i], dir[2*i+1] = s, s
	}
	t.dir = dir
	t.depth++
}

// replace points the directory entries of s, which had the given depth, at
// parts: one segment, or two that split its prefix range in half.
func (t *table) replace(s *segment, depth uint8, parts []*segment) {
	span := 1 << (t.depth - depth)
	first := 0
	for first < len(t.dir) && t.dir[first] != s {
		first += span
	}
	per := span / len(parts)
	for k, p := range parts {
		for i := range per {
			t.dir[first+k*per+i] = p
		}
	}
}

// segmentAt returns the segment holding the mixed hash cursor, and the
// cursor just past its range; last reports that no segment follows.
func (t *table) segmentAt(cursor uint64) (s *segment, next uint64, last bool) {
	_, s = t.segmentOf(cursor)
	span := uint64(1) << (64 - uint(s.depth)) // 0 for the whole range
	next = cursor&^(span-1) + span
	return s, next, next == 0
}

// shrink rebuilds s smaller once a sweep has left it mostly empty.
func (t *table) shrink(s *segment) {
	if len(s.ctrl) > 1 && s.count < s.limit()/4 {
		t.rehash(s, s.count)
	}
}

// segments yields every segment once, in hash order: the directory holds
// each as a run of entries.
func (t *table) segments() iter.Seq[*segment] {
	return func(visit func(*segment) bool) {
		for i, s := range t.dir {
			if (i == 0 || t.dir[i-1] != s) && !visit(s) {
				return
			}
		}
	}
}

// each calls f for every key and bucket, in hash order. The key is a view
// that f must copy to keep, and f must not insert or remove.
func (t *table) each(f func(key string, b *policy.Bucket)) {
	for s := range t.segments() {
		s.eachFull(func(j int) {
			sl := s.at(j)
			f(s.key(sl), &sl.b)
		})
	}
}

// warm prefetches what deciding items will read (see State.worthWarming):
// for every item, the control word its probe starts at and the item's own
// key; then the slot of the first tag match in that word, which holds the
// key if it is short; then, for a key in the arena, its bytes there. Each
// pass reads only what the one before prefetched, so by the time it asks
// most lines have arrived, and its own prefetches are in flight together, as
// many as the core's miss buffers hold. It keeps where it looked as hints
// for findWarmed, until unwarm.
func (t *table) warm(items []msg.Item) {
	t.warmStart()
	for i := range items {
		t.warmKey(items[i].Key, items[i].Hash)
	}
	t.warmFinish()
}

// warmStart begins a warm whose items warmKey then names one by one, in
// the order findWarmed will number them, and warmFinish ends.
func (t *table) warmStart() {
	t.hints, t.hinted, t.warmArena = t.hints[:0], t.moves, false
}

// warmKey is warm's first pass for one key: its control word and its bytes.
func (t *table) warmKey(key string, h uint64) {
	hm := h * mix
	_, s := t.segmentOf(hm)
	g, tag := s.start(hm)
	t.hints = append(t.hints, hint{seg: s, g: int32(g), slot: -1, tag: tag})
	prefetch(unsafe.Pointer(&s.ctrl[g]))
	prefetch(unsafe.Pointer(unsafe.StringData(key)))
	t.warmArena = t.warmArena || len(key) > inlineKey || !s.inline()
}

// warmFinish is the rest of warm, for the keys warmKey named.
func (t *table) warmFinish() {
	for i := range t.hints {
		hn := &t.hints[i]
		m := matchByte(hn.seg.ctrl[hn.g], hn.tag)
		if m == 0 {
			continue // a new key, or one further along its probe
		}
		hn.slot = hn.g*groupSize + int32(bits.TrailingZeros64(m)>>3)
		// A slot spans two lines when it starts less than its size
		// before the end of one.
		p, n := unsafe.Pointer(hn.seg.at(int(hn.slot))), hn.seg.stride
		prefetch(p)
		if uintptr(p)%64 > 64-n {
			prefetch(unsafe.Add(p, n-1))
		}
	}
	if !t.warmArena {
		return // every key that matches is in its slot
	}
	for _, hn := range t.hints {
		if hn.slot < 0 {
			continue
		}
		if sl := hn.seg.at(int(hn.slot)); sl.meta&arenaBit != 0 {
			off, _ := sl.place()
			prefetch(unsafe.Pointer(unsafe.SliceData(hn.seg.arena[off:])))
		}
	}
}

// findWarmed is find for key, hashed h, the ith item of the last warm: it
// tries the slot warm found first, unless a rehash has moved slots since.
// Inserts in between only fill free slots; nothing removes a key between a
// warm and its lookups.
func (t *table) findWarmed(i int, h uint64, key string) *policy.Bucket {
	if hn := &t.hints[i]; hn.slot >= 0 && t.hinted == t.moves {
		if sl := hn.seg.at(int(hn.slot)); hn.seg.holds(sl, key) {
			return &sl.b
		}
	}
	return t.find(h, key)
}

// unwarm drops the hints of the last warm, which keep segments alive.
func (t *table) unwarm() {
	clear(t.hints)
	t.hints = t.hints[:0]
}
