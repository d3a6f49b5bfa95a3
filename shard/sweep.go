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

// sweepPass is a sweep in progress: a resumable walk over the bucket map,
// judged slice by slice, each slice at its own clock reading (DESIGN 3.7
// allows the reading of the slice that judges a bucket).
type sweepPass struct {
	next    func() (string, policy.Bucket, bool) // yields keys; values are re-read
	stop    func()
	evicted int
	// born holds the keys created since the pass began. Go's map iteration
	// may or may not reach a key inserted during it, and such a key must
	// survive the pass, so the walk skips these.
	born map[string]struct{}
}

// BeginSweep starts a sweep pass. Until it ends, SweepSlice judges the
// buckets that existed when it began. It does nothing if one is running.
func (s *State) BeginSweep() {
	if s.pass != nil {
		return
	}
	// Deleting and assigning entries during a map iteration is allowed, and
	// entries not yet reached that are deleted are not produced.
	next, stop := iter.Pull2(maps.All(s.buckets))
	s.pass = &sweepPass{next: next, stop: stop, born: map[string]struct{}{}}
}

// Sweeping reports whether a sweep pass is in progress.
func (s *State) Sweeping() bool { return s.pass != nil }

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

// EndSweep finishes the pass and returns what it evicted, with err (from
// SweepSlice, or ErrClosed when the shard stops part-way).
func (s *State) EndSweep(err error) msg.SweepReply {
	p := s.pass
	s.pass = nil
	p.stop()
	return msg.SweepReply{Evicted: p.evicted, Err: err}
}

// Sweep runs a whole pass at one reading: every bucket full at now is
// removed, and a reading older than the last one observed is
// ErrClockRegression with nothing removed.
func (s *State) Sweep(now int64) msg.SweepReply {
	if now < s.last {
		return msg.SweepReply{Err: msg.ErrClockRegression}
	}
	s.BeginSweep()
	for {
		if done, err := s.SweepSlice(now, SliceSize); done {
			return s.EndSweep(err)
		}
	}
}
