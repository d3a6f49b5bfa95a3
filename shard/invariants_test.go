package shard

import (
	"fmt"
	"testing"
)

// checkInvariants recounts, by walking the table, what State keeps counts
// of, and fails t where one is off, saying where (format and args) it was
// called: stale against the buckets whose Epoch is not the one in force, the
// table's and each segment's count against their live slots and tombstones,
// and the budget's count against the keys. It also checks that the history
// reaches back to every bucket's generation and is dropped once no bucket
// needs it, and that only keys created ahead of a sweep in progress carry
// the born mark, and that the level store's records in use are exactly
// those of the keys that need one, each its own. It takes the budget to be the state's alone, as every test
// here makes it.
func (s *State) checkInvariants(t testing.TB, format string, args ...any) {
	t.Helper()
	fail := func(what string, a ...any) {
		t.Helper()
		t.Fatalf("%s: %s", fmt.Sprintf(format, args...), fmt.Sprintf(what, a...))
	}
	stale, live, levels := 0, 0, 0
	records := map[uint32]bool{}
	for seg := range s.tab.segments() {
		full, dead := 0, 0
		for g, w := range seg.ctrl {
			for j := range groupSize {
				c := uint8(w >> (8 * j))
				if c == ctrlDeleted {
					dead++
				}
				if c >= ctrlEmpty {
					continue
				}
				full++
				sl := seg.at(g*groupSize + j)
				if sl.b.Epoch != s.epoch {
					stale++
				}
				if int(sl.b.Epoch-s.base) >= len(s.gens) {
					fail("a bucket of epoch %d, but the history starts at %d and holds %d", sl.b.Epoch, s.base, len(s.gens))
				}
				if in := s.infoOf(&sl.b); in.n != 0 {
					levels += in.n
					if records[sl.b.Frac] {
						fail("two keys share the level record %d", sl.b.Frac)
					}
					records[sl.b.Frac] = true
				}
				if sl.meta&bornBit != 0 && (!s.sweeping() || s.tab.hashOf(seg.key(sl)) < s.pass.cursor) {
					fail("a key marked born, not ahead of a sweep in progress")
				}
			}
		}
		if full != seg.count || dead != seg.dead {
			fail("a segment counts %d live and %d dead slots, and has %d and %d", seg.count, seg.dead, full, dead)
		}
		live += full
	}
	if levels != s.levels.live {
		fail("the level store counts %d levels in use, and the keys hold %d", s.levels.live, levels)
	}
	if live != s.tab.count {
		fail("the table counts %d keys, and has %d", s.tab.count, live)
	}
	if stale != s.stale {
		fail("stale is %d, and %d buckets have an Epoch other than %d", s.stale, stale, s.epoch)
	}
	if s.base+uint16(len(s.gens)-1) != s.epoch {
		fail("the history runs from %d for %d generations, but %d is in force", s.base, len(s.gens), s.epoch)
	}
	if s.stale == 0 && len(s.gens) != 1 {
		fail("no bucket is stale, but %d generations are kept", len(s.gens))
	}
	if n := s.budget.Count(); n != int64(s.tab.count) {
		fail("the budget counts %d keys, and the table holds %d", n, s.tab.count)
	}
}
