package shard

import (
	"math/bits"
	"unsafe"
)

const (
	groupSize = 8

	ctrlEmpty   = 0x80
	ctrlDeleted = 0xfe
	lsbs        = 0x0101010101010101
	msbs        = 0x8080808080808080
)

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
