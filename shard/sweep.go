package shard

import (
	"iter"
	"maps"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// SliceSize is how many buckets one sweep slice judges before the shard
// serves its mailbox again: a few hundred microseconds of work, so a sweep
// over a million keys never holds up a request for long.
const SliceSize = 1024

// sweepPass is a walk over the bucket map in progress, resumable slice by
// slice. A sweep (evict) judges each bucket at the reading of its slice
// (DESIGN 3.7 allows the reading of the slice that judges a bucket); a
// conversion pass only brings buckets to the policy generation in force.
type sweepPass struct {
	evict   bool
	next    func() (string, policy.Bucket, bool) // yields keys; values are re-read
	stop    func()
	evicted int
	// born holds the keys created since a sweep began. Go's map iteration
	// may or may not reach a key inserted during it, and such a key must
	// survive the sweep, so the walk skips these. Nil for a conversion pass.
	born map[string]struct{}
}

// BeginSweep starts a sweep pass, replacing any conversion pass (a sweep
// converts every bucket it visits). Until it ends, SweepSlice judges the
// buckets that existed when it began. It does nothing if a sweep is running.
func (s *State) BeginSweep() {
	if s.Sweeping() {
		return
	}
	s.beginPass(true)
}

// Sweeping reports whether a sweep pass is in progress.
func (s *State) Sweeping() bool { return s.pass != nil && s.pass.evict }

// Converting reports whether a background conversion pass is in progress.
func (s *State) Converting() bool { return s.pass != nil && !s.pass.evict }

// beginConvert (re)starts a conversion pass, so it brings every bucket to
// the generation now in force; a sweep in progress converts anyway.
func (s *State) beginConvert() {
	if s.Sweeping() {
		return
	}
	s.beginPass(false)
}

func (s *State) beginPass(evict bool) {
	if s.pass != nil {
		s.pass.stop()
	}
	// Deleting and assigning entries during a map iteration is allowed, and
	// entries not yet reached that are deleted are not produced.
	next, stop := iter.Pull2(maps.All(s.buckets))
	s.pass = &sweepPass{evict: evict, next: next, stop: stop}
	if evict {
		s.pass.born = map[string]struct{}{}
	}
}

// ConvertSlice brings up to n buckets of the conversion pass to the policy
// generation in force, and reports done when the pass is over (the history
// is then dropped). It reads no clock and changes no answer: converting is
// what the bucket's next touch would do first anyway.
func (s *State) ConvertSlice(n int) (done bool) {
	exhausted := false
	for range n {
		if s.stale == 0 {
			break // everything is converted: the history is already gone
		}
		k, _, ok := s.pass.next()
		if !ok {
			exhausted = true
			break
		}
		if b, ok := s.buckets[k]; ok && b.Epoch != s.epoch {
			s.bringUp(&b)
			s.buckets[k] = b
		}
	}
	if s.stale == 0 || exhausted {
		s.pass.stop()
		s.pass = nil
		return true
	}
	return false
}

// SweepSlice judges up to n buckets of the pass at now and evicts those that
// are full. It reports done when the pass has visited every bucket. A reading
// older than the last one observed ends the pass with ErrClockRegression;
// what earlier slices evicted stays evicted and is counted.
func (s *State) SweepSlice(now int64, n int) (done bool, err error) {
	if now < s.last {
		return true, msg.ErrClockRegression
	}
	lim := s.Policy().Limit()
	for range n {
		k, _, ok := s.pass.next()
		if !ok {
			s.last = now
			return true, nil
		}
		if _, young := s.pass.born[k]; young {
			continue
		}
		// Read the bucket afresh: requests served between slices may have
		// changed it since the walk was positioned on it.
		b, ok := s.buckets[k]
		if !ok {
			continue
		}
		// Bringing a surviving bucket up to date changes no answer
		// (refilling a to b then b to c equals refilling a to c), and it
		// finishes any pending cutover conversion.
		s.bringUp(&b)
		b.Refill(lim, now)
		if b.Full(lim) {
			delete(s.buckets, k)
			s.budget.Release() // only after the delete: Count never undercounts
			s.pass.evicted++
			continue
		}
		s.buckets[k] = b
	}
	s.last = now
	return false, nil
}

// Abandon drops any pass in progress without finishing it, releasing its
// iterator. A sweep abandoned this way is not answered: use EndSweep for one
// that has a caller.
func (s *State) Abandon() {
	if s.pass != nil {
		s.pass.stop()
		s.pass = nil
	}
}

// EndSweep finishes the pass and returns what it evicted, with err (from
// SweepSlice, or ErrClosed when the shard stops part-way).
func (s *State) EndSweep(err error) msg.SweepReply {
	p := s.pass
	s.pass = nil
	p.stop()
	return msg.SweepReply{Evicted: p.evicted, Err: err}
}
