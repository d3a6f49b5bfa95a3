package shard

import (
	"time"
	"unsafe"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// A key whose limit is one band of a compact period (policy.Limit.Compact:
// every rate per second) keeps its whole balance in its slot's 24-byte
// policy.Bucket. Any other key (one with bands, or a period too long for
// the Bucket's 32-bit fraction, such as a rate per minute) keeps one
// policy.Level per band, 16 bytes each, in the shard's level store, and its
// Bucket keeps only Last, Epoch and Limit, with Frac naming where its
// levels are. Which of the two a bucket is follows from its limit
// (limitInfo.n), so nothing in the slot says it.

// levelsPerChunk is how many levels a chunk of the store holds: 64 KiB, so
// the store grows by small steps and wastes little at any size.
const (
	levelsChunkShift = 12
	levelsPerChunk   = 1 << levelsChunkShift
	maxLevels        = 1 + policy.MaxBands
	maxChunks        = 1 << (32 - levelsChunkShift) // a record index is 32 bits
)

// levelStore holds the levels of the keys a Bucket alone cannot hold, in
// records of n consecutive levels (n the key's band count), none straddling
// two chunks. A freed record is reused by the next key of the same band
// count. Chunks are never given back: a store's memory is that of its most
// keys at once.
type levelStore struct {
	chunks [][]policy.Level
	used   int                 // levels handed out in the last chunk
	free   [maxLevels][]uint32 // free[n-1]: freed records of n levels
	live   int                 // levels in records in use
}

// alloc returns a record of n levels, 1 <= n <= maxLevels, with undefined
// contents.
func (x *levelStore) alloc(n int) uint32 {
	x.live += n
	if f := x.free[n-1]; len(f) > 0 {
		i := f[len(f)-1]
		x.free[n-1] = f[:len(f)-1]
		return i
	}
	if len(x.chunks) == 0 || x.used+n > levelsPerChunk {
		if len(x.chunks) == maxChunks {
			// 2^32 levels, 64 GiB in one shard: a record index would wrap
			// and two keys would share levels. No key bound comes near.
			panic("shard: the level store is full (2^32 levels in one shard)")
		}
		x.chunks = append(x.chunks, make([]policy.Level, levelsPerChunk))
		x.used = 0
	}
	i := uint32(len(x.chunks)-1)<<levelsChunkShift | uint32(x.used)
	x.used += n
	return i
}

// levels returns record i of n levels.
func (x *levelStore) levels(i uint32, n int) []policy.Level {
	off := int(i & (levelsPerChunk - 1))
	return x.chunks[i>>levelsChunkShift][off : off+n : off+n]
}

// release gives record i of n levels back.
func (x *levelStore) release(i uint32, n int) {
	x.live -= n
	x.free[n-1] = append(x.free[n-1], i)
}

// limitInfo is what the shard needs of one limit of a generation.
type limitInfo struct {
	lim     policy.Limit // the primary band
	maxCost int64        // the least capacity of any band: no request may cost more
	n       int          // the levels of a key of this limit in the store; 0: its Bucket holds it
	shape   policy.Shape
	names   []decision.Name // band i's name, made once here rather than per decision
}

func limitInfos(p policy.Policy) []limitInfo {
	shapes := p.Shapes()
	out := make([]limitInfo, len(shapes))
	count := 0
	for _, sh := range shapes {
		count += sh.Len()
	}
	// Every limit's band names, in one array of each (for up to
	// policy.MaxLimits limits): strs keeps the strings that names point to.
	strs, names := make([]string, count), make([]decision.Name, count)
	for i, sh := range shapes {
		in := limitInfo{lim: sh.Primary, maxCost: sh.Primary.Capacity, shape: sh, names: names[:sh.Len():sh.Len()]}
		for j := range sh.Len() {
			in.maxCost = min(in.maxCost, sh.Band(j).Capacity)
			strs[j] = sh.BandName(j)
			in.names[j] = decision.NameAt(&strs[j])
		}
		strs, names = strs[sh.Len():], names[sh.Len():]
		if !sh.Compact() {
			in.n = sh.Len()
		}
		out[i] = in
	}
	return out
}

// load copies b's levels into buf and returns them: its Bucket's balance as
// one level, or its record in the store.
func (s *State) load(b *policy.Bucket, in *limitInfo, buf *[maxLevels]policy.Level) []policy.Level {
	if in.n == 0 {
		buf[0] = policy.LevelOf(*b)
		return buf[:1]
	}
	return buf[:copy(buf[:], s.levels.levels(b.Frac, in.n))]
}

// newExt makes b, a bucket just inserted for a key of limit in (in.n > 0),
// full at now.
func (s *State) newExt(b *policy.Bucket, in *limitInfo, now int64) {
	b.Tokens, b.Last = 0, now
	b.Frac = s.levels.alloc(in.n)
	lv := s.levels.levels(b.Frac, in.n)
	for i := range lv {
		lv[i] = policy.FullLevel(in.shape.Band(i))
	}
}

// decideExt decides cost for b, a bucket of limit in (in.n > 0), at now,
// into d: every band refilled, then decided at once.
func (s *State) decideExt(b *policy.Bucket, in *limitInfo, now, cost int64, d *decision.Decision) {
	lv := s.levels.levels(b.Frac, in.n)
	if now > b.Last {
		policy.RefillLevels(in.shape, lv, now-b.Last)
		b.Last = now
	}
	o, band := policy.DecideLevels(in.shape, lv, cost)
	d.Allowed = o.Allowed
	d.Remaining = o.Remaining
	d.RetryAfter = time.Duration(o.RetryAfter)
	d.Limit = in.shape.Band(band).Capacity
	d.ResetAfter = time.Duration(o.ResetAfter)
	d.Band = in.names[band]
}

// reportLevels writes the answer of Peek and Refund for levels lv of limit
// in, as report does for one.
func (s *State) reportLevels(lv []policy.Level, in *limitInfo, r *msg.Reply) {
	o, band := policy.PeekLevels(in.shape, lv)
	d := &r.Decision
	d.Allowed = o.Allowed
	d.Remaining = o.Remaining
	d.RetryAfter = time.Duration(o.RetryAfter)
	d.Version = s.gens[len(s.gens)-1].pol.Version
	d.Limit = in.shape.Band(band).Capacity
	d.ResetAfter = time.Duration(o.ResetAfter)
	d.Band = in.names[band]
	r.Err = nil
}

// refillFull refills b, of limit in, to now and reports whether every band
// is full.
func (s *State) refillFull(b *policy.Bucket, in *limitInfo, now int64) bool {
	if in.n == 0 {
		b.Refill(in.lim, now)
		return b.Full(in.lim)
	}
	lv := s.levels.levels(b.Frac, in.n)
	if now > b.Last {
		policy.RefillLevels(in.shape, lv, now-b.Last)
		b.Last = now
	}
	return policy.FullLevels(in.shape, lv)
}

// resetAfter is the ns until b, of limit in, is full in every band.
func (s *State) resetAfter(b *policy.Bucket, in *limitInfo) int64 {
	if in.n == 0 {
		return b.ResetAfter(in.lim)
	}
	lv := s.levels.levels(b.Frac, in.n)
	var w int64
	for i := range lv {
		w = max(w, lv[i].ResetAfter(in.shape.Band(i)))
	}
	return w
}

// cutover carries b from limit old to limit next at the cutover reading
// at (>= b.Last, or b is newer and only converts): refilled under old up
// to at, then each band carried over by name (policy.CutoverLevels), into a
// Bucket or a record as next needs.
func (s *State) cutover(b *policy.Bucket, old, next *limitInfo, at int64) {
	if old.n == 0 && next.n == 0 {
		b.Cutover(old.lim, next.lim, at)
		return
	}
	var src, dst [maxLevels]policy.Level
	lv := s.load(b, old, &src)
	if at > b.Last {
		policy.RefillLevels(old.shape, lv, at-b.Last)
		b.Last = at
	}
	out := dst[:next.shape.Len()]
	policy.CutoverLevels(old.shape, lv, next.shape, out)
	switch {
	case next.n == 0:
		s.levels.release(b.Frac, old.n)
		b.Tokens, b.Frac = out[0].Tokens, uint32(out[0].Frac)
	case old.n == next.n:
		copy(s.levels.levels(b.Frac, next.n), out)
	default:
		if old.n != 0 {
			s.levels.release(b.Frac, old.n)
		}
		b.Tokens, b.Frac = 0, s.levels.alloc(next.n)
		copy(s.levels.levels(b.Frac, next.n), out)
	}
}

// warmLevels is the last pass of a warm (see worthWarming) under a policy
// some of whose keys keep their levels in the store: for every item whose
// slot warm found, and whose limit in force keeps levels, it prefetches
// the record, which is elsewhere in memory than the slot. It reads the
// slots the warm prefetched, by now mostly arrived.
func (s *State) warmLevels() {
	g := &s.gens[len(s.gens)-1]
	if !g.stored {
		return
	}
	for _, hn := range s.tab.hints {
		if hn.slot < 0 {
			continue
		}
		b := &hn.seg.at(int(hn.slot)).b
		if b.Epoch != s.epoch || int(b.Limit) >= len(g.limits) {
			continue // an empty slot's, or a stale bucket's: not worth it
		}
		if in := &g.limits[b.Limit]; in.n != 0 {
			i := b.Frac
			if c := int(i >> levelsChunkShift); c < len(s.levels.chunks) {
				prefetch(unsafe.Pointer(&s.levels.chunks[c][i&(levelsPerChunk-1)]))
			}
		}
	}
}

// infoOf returns the limit of b in the generation its balance is expressed
// in.
func (s *State) infoOf(b *policy.Bucket) *limitInfo {
	return &s.gens[int(b.Epoch-s.base)].limits[b.Limit]
}

// forgetLevels releases the record of b, of limit in, if it has one: for a
// bucket being removed.
func (s *State) forgetLevels(b *policy.Bucket, in *limitInfo) {
	if in.n != 0 {
		s.levels.release(b.Frac, in.n)
	}
}
