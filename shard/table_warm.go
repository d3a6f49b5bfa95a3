package shard

import (
	"math/bits"
	"unsafe"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// hint is where warm looked for an item's key: its segment, the group its
// probe starts at, and the slot of the first tag match there, which is
// almost always the key's slot when the key is present.
type hint struct {
	seg  *segment
	g    int32
	slot int32 // -1: no tag match in the first group
	tag  uint8
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
	// warmKey's first pass, with the hints in a local: appending to the
	// field would wait at every item for the length the last append stored.
	hints, arena := t.hints, false
	for i := range items {
		hn, a := t.firstPass(items[i].Key, items[i].Hash)
		hints, arena = append(hints, hn), arena || a
	}
	t.hints, t.warmArena = hints, arena
	t.warmFinish()
}

// warmStart begins a warm whose items warmKey then names one by one, in
// the order findWarmed will number them, and warmFinish ends.
func (t *table) warmStart() {
	t.hints, t.hintGen, t.warmArena = t.hints[:0], t.slotGen, false
}

// warmKey is warm's first pass for one key: its control word and its bytes.
func (t *table) warmKey(key string, h uint64) {
	hn, arena := t.firstPass(key, h)
	t.hints = append(t.hints, hn)
	t.warmArena = t.warmArena || arena
}

// firstPass prefetches key's control word and bytes, and returns its hint
// and whether its key may be in an arena.
func (t *table) firstPass(key string, h uint64) (hint, bool) {
	hm := h * mix
	_, s := t.segmentOf(hm)
	g, tag := s.start(hm)
	prefetch(unsafe.Pointer(&s.ctrl[g]))
	prefetch(unsafe.Pointer(unsafe.StringData(key)))
	return hint{seg: s, g: int32(g), slot: -1, tag: tag}, len(key) > inlineKey || !s.inline()
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

// findWarmed is find for key, hashed h, trying first the slot warm found
// for its ith item unless forget has run since. Inserts only fill free
// slots, so until a removal or a rehash (which leaves the old segment
// behind) a hinted slot that holds key is key's own, whichever item it was
// found for. It is exactly find provided every path that empties or moves a
// slot calls forget, and it saves the probe when item i of the warm in
// progress was this key.
func (t *table) findWarmed(i int, h uint64, key string) *policy.Bucket {
	if uint(i) < uint(len(t.hints)) {
		if hn := &t.hints[i]; hn.slot >= 0 && t.hintGen == t.slotGen {
			if sl := hn.seg.at(int(hn.slot)); hn.seg.holds(sl, key) {
				return &sl.b
			}
		}
	}
	return t.find(h, key)
}

// unwarm drops the hints of the last warm, which keep segments alive.
func (t *table) unwarm() {
	clear(t.hints)
	t.hints = t.hints[:0]
}
