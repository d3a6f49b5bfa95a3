package shard

import "iter"

const (
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
)

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

func (t *table) segmentOf(hm uint64) (int, *segment) {
	i := int(hm >> (64 - uint(t.depth))) // 0 at depth 0
	return i, t.dir[i]
}

// rehash rebuilds s for n keys: in place at the right size, or split in two
// once it would outgrow the largest segment size.
func (t *table) rehash(s *segment, n int) {
	t.forget()
	// Hash each key once, into a buffer the table keeps.
	t.hashes = t.hashes[:0]
	s.eachFull(func(i int) { t.hashes = append(t.hashes, t.hashOf(s.key(s.at(i)))) })
	if groupsFor(n, slotBytes) <= t.maxGroups || s.depth >= maxDepth {
		t.replace(s, s.depth, []*segment{t.copyOf(s, s.depth, n-s.count, func(uint64) bool { return true })})
		return
	}
	if s.depth == t.depth {
		t.doubleDir()
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

// doubleDir doubles the directory, each entry repeated: no segment changes
// and no key moves (rehash grows and splits segments).
func (t *table) doubleDir() {
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
