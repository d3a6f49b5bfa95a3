package shard

import "github.com/tokenshard/tokenshard/policy"

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
type table struct {
	hasher    *Hasher
	dir       []*segment
	depth     uint8
	count     int
	maxGroups int      // maxGroups, or less in tests that want many segments
	hashes    []uint64 // scratch for rehash

	// slotGen counts forget's calls: until the next, every full slot holds
	// the key it held, where it was.
	slotGen uint64
	hints   []hint // where the last warm found each of its items
	hintGen uint64 // slotGen when the hints were taken
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

// mix spreads the routing hash again, so the bits the table uses do not
// repeat the bits that chose the shard (a multiply-shift of the hash).
const mix = 0x9e3779b97f4a7c15

func newTable(h *Hasher) table {
	return table{hasher: h, dir: []*segment{newSegment(0, 1, 0, slotBytes)}, maxGroups: maxGroups}
}

// hashOf is the table's mixed hash of key, for a rehash.
func (t *table) hashOf(key string) uint64 { return t.hasher.Sum(key) * mix }

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

// forget drops every slot the table keeps for later: the one find tries
// first, and (by moving slotGen on) the hints of a warm in progress. Every
// removal and rehash calls it, as they empty or move slots.
func (t *table) forget() {
	t.lastSeg, t.lastSlot = nil, nil
	t.slotGen++
}

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
