package shard

import (
	"encoding/binary"
	"math"
	"strings"
	"unsafe"

	"github.com/tokenshard/tokenshard/policy"
)

const (
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
