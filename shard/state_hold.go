package shard

import (
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// The State's side of a hold (msg.Hold): one shard's part of an
// all-or-nothing decision. holdBegin checks the part and lists its new keys;
// holdSnap copies its buckets for the caller, who decides from them what
// every item at T would answer; holdCommit decides them all at T, or none. Items are distinct
// keys with summed costs. The key bound's room for new keys is reserved by
// the caller, and only for a call it admits.

// holdBegin checks items at now, into out, and reports whether the hold may
// be taken, listing in fresh the items whose keys are not tracked. On
// failure exactly one reply has an error, and nothing changed: the first
// item whose cost is above its key's capacity, else (every item) a reading
// older than the last one observed. On success the items' keys are held
// (isHeld) until holdCommit or holdRelease: the loop serves nothing else for
// them meanwhile, and takes no hold while a sweep runs.
func (s *State) holdBegin(now int64, items []msg.Item, out []msg.Reply, fresh *[]int) bool {
	clear(out)
	*fresh = (*fresh)[:0]
	g := &s.gens[len(s.gens)-1]
	for i, it := range items {
		b := s.tab.find(it.Hash, it.Key)
		var idx policy.LimitIndex
		if b != nil {
			s.bringUp(b, it.Key)
			g = &s.gens[len(s.gens)-1]
			idx = b.Limit
		} else {
			idx = g.pol.Overrides.Resolve(it.Key)
			*fresh = append(*fresh, i)
		}
		if it.Cost > g.limits[idx].maxCost {
			out[i].Err = msg.ErrCostExceedsCapacity
			return false
		}
	}
	if now < s.last {
		out[0].Err = msg.ErrClockRegression
		return false
	}
	// s.last stays: a call that fails elsewhere changes nothing here, and
	// holdCommit records T, which is at least now.
	if s.held == nil {
		s.held = map[string]struct{}{}
	}
	for _, it := range items {
		s.held[it.Key] = struct{}{}
	}
	return true
}

// isHeld reports whether key belongs to a hold in progress.
func (s *State) isHeld(key string) bool {
	_, ok := s.held[key]
	return ok
}

// holdSnap copies into snaps each item's bucket as of now, the hold's
// reading, for the caller to decide at its instant (msg.Snap.Decide); a key
// not tracked gets the full bucket it would be created with. It changes
// nothing.
func (s *State) holdSnap(now int64, items []msg.Item, snaps []msg.Snap) {
	g := &s.gens[len(s.gens)-1]
	var buf [maxLevels]policy.Level
	for i, it := range items {
		sn := &snaps[i]
		b := s.tab.find(it.Hash, it.Key)
		if b == nil {
			in := &g.limits[g.pol.Overrides.Resolve(it.Key)]
			sn.Shape, sn.Names, sn.Last = in.shape, in.names, now
			for j := range in.shape.Len() {
				sn.Levels[j] = policy.FullLevel(in.shape.Band(j))
			}
			continue
		}
		in := &g.limits[b.Limit] // brought up by holdBegin
		sn.Shape, sn.Names, sn.Last = in.shape, in.names, b.Last
		copy(sn.Levels[:], s.load(b, in, &buf))
	}
}

// holdCommit ends the hold at T: with admit, every item is decided at T
// (as the caller found from holdSnap's copies, every one allowed), its new keys created in the
// room the caller reserved in the key bound; without, nothing is taken. It
// writes no answer: the caller has its own, and may be reading them.
//
// Other keys may have been decided at later readings while these were held:
// T is the call's instant, not this shard's latest, and the held buckets
// were last brought up to date no later than the hold's reading, so
// deciding them at T is sound. The shard's latest reading is kept.
func (s *State) holdCommit(T int64, items []msg.Item, admit bool) {
	s.holdRelease(items)
	latest := max(s.last, T)
	if admit {
		s.last = min(s.last, T) // so decideFound takes T for what it is
		var r msg.Reply
		for _, it := range items {
			s.decideFound(T, it.Key, it.Hash, it.Cost, &r, s.tab.find(it.Hash, it.Key), true)
		}
	}
	s.last = latest
}

// holdRelease ends a hold without deciding anything: its keys are free.
func (s *State) holdRelease(items []msg.Item) {
	for _, it := range items {
		delete(s.held, it.Key)
	}
}
