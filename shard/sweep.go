package shard

import (
	"math"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// SliceSize is about how many slots one sweep slice visits before the shard
// serves its mailbox again: a slice takes whole segments of the table, at
// least one, so it is a few tens of microseconds of work, and a sweep over a
// million keys never holds up a request for long. It is internal to
// tokenshard: package engine's tests size their tables by it.
const SliceSize = 1024

// sweepPass is a walk over the table in progress, resumable slice by slice.
// A sweep (evict) judges each bucket at the reading of the slice that visits
// it, not at one reading for the whole pass; a conversion pass only brings
// buckets to the policy generation in force.
//
// The walk goes segment by segment in hash order: every key whose mixed hash
// is below cursor has been visited. Segments grow, split and shrink between
// slices, but a key never leaves its place in hash order, so the cursor stays
// right. A key created during a sweep at or past the cursor is marked born
// and skipped (and unmarked) when the walk reaches it: it survives the sweep.
type sweepPass struct {
	evict   bool
	cursor  uint64
	evicted int
	// soonest, when estimate is set, is the earliest reading at which a
	// bucket the sweep kept is full again.
	estimate bool
	soonest  int64
	// A conversion pass may stop inside a segment: it resumes at slot in
	// seg if the cursor still names that very segment, and otherwise scans
	// the segment again from its start, which only costs a look at each
	// bucket's epoch, since converting twice changes nothing.
	seg  *segment
	slot int
	done bool // a sweep that has visited everything, waiting for endSweep
}

// beginSweep starts a sweep pass, replacing any conversion pass (a sweep
// converts every bucket it visits). Until it ends, sweepSlice judges the
// buckets that existed when it began. With estimate set it also finds when
// the first bucket it keeps is full again (endSweep's Soonest), at the cost
// of a division per bucket kept. It does nothing if a sweep is running.
func (s *State) beginSweep(estimate bool) {
	if s.sweeping() {
		return
	}
	s.pass = &sweepPass{evict: true, estimate: estimate}
	if estimate {
		s.pass.soonest = math.MaxInt64
	}
}

// sweeping reports whether a sweep pass is in progress.
func (s *State) sweeping() bool { return s.pass != nil && s.pass.evict && !s.pass.done }

// converting reports whether a background conversion pass is in progress.
func (s *State) converting() bool { return s.pass != nil && !s.pass.evict }

// beginConvert (re)starts a conversion pass, so it brings every bucket to
// the generation now in force; a sweep in progress converts anyway.
func (s *State) beginConvert() {
	if s.sweeping() {
		return
	}
	s.pass = &sweepPass{}
}

// convertSlice does about n units of the conversion pass, a unit being one
// slot looked at, one cutover replayed on a bucket, or one pattern its key
// is tried against to resolve it again at a cutover, and reports done when
// the pass is over (the history is then dropped). Work, not slots, bounds
// a slice: a bucket many cutovers behind costs that many, and more under
// policies with patterns. It reads no clock and changes no answer:
// converting is what the bucket's next touch would do first anyway.
func (s *State) convertSlice(n int) (done bool) {
	p := s.pass
	for work := 0; s.stale != 0; {
		seg, next, last := s.tab.segmentAt(p.cursor)
		i := 0
		if seg == p.seg {
			i = p.slot
		}
		for ; i < seg.nslot; i++ {
			if work >= n {
				p.seg, p.slot = seg, i
				return false
			}
			work++ // looking costs too: a slice over converted slots is still bounded
			if !seg.full(i) {
				continue
			}
			sl := seg.at(i)
			if b := &sl.b; b.Epoch != s.epoch {
				for i := int(b.Epoch-s.base) + 1; i < len(s.gens); i++ {
					work += s.gens[i].replay
				}
				s.bringUp(b, seg.key(sl))
			}
		}
		p.seg, p.cursor = nil, next
		if last {
			break
		}
	}
	s.pass = nil
	return true
}

// sweepSlice judges the buckets of about n slots of the pass at now and
// evicts those that are full. It reports done when the pass has visited
// every bucket. A reading older than the last one observed ends the pass with
// ErrClockRegression; what earlier slices evicted stays evicted and is
// counted.
func (s *State) sweepSlice(now int64, n int) (done bool, err error) {
	if now < s.last {
		return true, msg.ErrClockRegression
	}
	s.last = now
	limits := s.gens[len(s.gens)-1].limits
	for visited := 0; visited < n; {
		seg, next, last := s.tab.segmentAt(s.pass.cursor)
		visited += seg.nslot
		seg.eachFull(func(i int) {
			sl := seg.at(i)
			if sl.meta&bornBit != 0 {
				sl.meta &^= bornBit // created after the sweep began: it survives it
				return
			}
			// Bringing a surviving bucket up to date changes no answer
			// (refilling a to b then b to c equals refilling a to c), and it
			// finishes any pending cutover conversion.
			s.bringUp(&sl.b, seg.key(sl))
			in := &limits[sl.b.Limit] // the key's own limit
			switch {
			case s.refillFull(&sl.b, in, now):
				s.forgetLevels(&sl.b, in)
				s.tab.remove(seg, i)
				s.budget.release() // only after the delete: Count never undercounts
				s.pass.evicted++
			case s.pass.estimate:
				at := now + s.resetAfter(&sl.b, in)
				if at < now { // saturated: full no sooner than the end of time
					at = math.MaxInt64
				}
				s.pass.soonest = min(s.pass.soonest, at)
			}
		})
		s.tab.shrink(seg)
		s.pass.cursor = next
		if last {
			s.pass.done = true // keys created from now on are not ahead of it
			return true, nil
		}
	}
	return false, nil
}

// abandon drops any pass in progress without finishing it. A sweep abandoned
// this way is not answered: use endSweep for one that has a caller.
func (s *State) abandon() {
	if s.sweeping() {
		s.unmarkBorn()
	}
	s.pass = nil
}

// endSweep finishes the pass and returns what it evicted, with err (from
// sweepSlice, ErrClosed when the shard stops part-way, or ErrSweepStopped
// when the caller does).
func (s *State) endSweep(err error) msg.SweepReply {
	p := s.pass
	if !p.done {
		s.unmarkBorn() // the walk did not reach them all
	}
	s.pass = nil
	if s.stale != 0 && len(s.gens) > convertAfter {
		// The sweep replaced a conversion pass and did not finish it:
		// start another, or a full history would stay full.
		s.beginConvert()
	}
	return msg.SweepReply{Evicted: p.evicted, Soonest: p.soonest, Err: err}
}

// unmarkBorn clears the born mark of every key, for a sweep that ends before
// its walk reached them; the next sweep judges them like any other.
func (s *State) unmarkBorn() { s.unmarkSlice(math.MaxInt) }

// unmarkSlice goes on with the sweep's walk over about n slots, judging
// nothing: it only clears born marks, which only keys at or past the cursor
// carry. It reports done when the walk has reached the end.
func (s *State) unmarkSlice(n int) (done bool) {
	p := s.pass
	for visited := 0; visited < n; {
		seg, next, last := s.tab.segmentAt(p.cursor)
		visited += seg.nslot
		for j := range seg.nslot {
			seg.at(j).meta &^= bornBit
		}
		p.cursor = next
		if last {
			p.done = true // keys created from now on are not ahead of it
			return true
		}
	}
	return false
}

// bucket returns key's bucket and whether it is tracked, for tests.
func (s *State) bucket(key string) (policy.Bucket, bool) {
	if b := s.tab.find(s.hasher.Sum(key), key); b != nil {
		return *b, true
	}
	return policy.Bucket{}, false
}

// beginSnapshot starts a snapshot walk from the start of the table. Keys
// created ahead of its cursor are copied when it gets there; keys created
// behind it are not in the snapshot, as if created after it.
func (s *State) beginSnapshot() { s.snapCursor = 0 }

// snapshotSlice copies the buckets of about n slots into c, which it resets,
// each brought to the policy in force and paired with its key's limit, and
// reports whether the walk is over. It reads no clock and changes no answer.
func (s *State) snapshotSlice(c *msg.SnapChunk, n int) (done bool) {
	c.Records, c.Keys, c.Levels = c.Records[:0], c.Keys[:0], c.Levels[:0]
	limits := s.gens[len(s.gens)-1].limits
	for visited := 0; visited < n; {
		seg, next, last := s.tab.segmentAt(s.snapCursor)
		visited += seg.nslot
		seg.eachFull(func(i int) {
			sl := seg.at(i)
			k := seg.key(sl)
			s.bringUp(&sl.b, k)
			in := &limits[sl.b.Limit]
			var buf [maxLevels]policy.Level
			lv := s.load(&sl.b, in, &buf)
			c.Records = append(c.Records, msg.SnapRecord{KeyOff: len(c.Keys), KeyLen: len(k), Last: sl.b.Last, Limit: sl.b.Limit, Shape: in.shape, LevelOff: len(c.Levels)})
			c.Keys = append(c.Keys, k...)
			c.Levels = append(c.Levels, lv...)
		})
		s.snapCursor = next
		if last {
			return true
		}
	}
	return false
}
