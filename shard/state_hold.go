package shard

import (
	"time"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// The State's side of a hold (msg.Hold): one shard's part of an
// all-or-nothing decision. HoldBegin checks the part and reserves the key
// bound's room for its new keys; HoldEval answers what deciding every item
// at T would give, changing no answer; HoldCommit decides them all at T, or
// none; HoldRelease gives the reservation back. Items are distinct keys
// with summed costs.

// HoldBegin checks items at now, into out, and reports whether the hold may
// be taken. On failure exactly one reply has an error, and nothing changed:
// the first item whose cost is above its key's capacity, else (every item)
// a reading older than the last one observed, else the first new key past
// the key bound. On success the budget holds a slot for every new key, and
// fresh says how many.
func (s *State) HoldBegin(now int64, items []msg.Item, out []msg.Reply, fresh *int) bool {
	clear(out)
	g := &s.gens[len(s.gens)-1]
	*fresh = 0
	for i, it := range items {
		b := s.tab.find(it.Hash, it.Key)
		var idx policy.LimitIndex
		if b != nil {
			s.bringUp(b, it.Key)
			g = &s.gens[len(s.gens)-1]
			idx = b.Limit
		} else {
			idx = g.pol.Overrides.Resolve(it.Key)
			*fresh++
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
	for n := range *fresh {
		if !s.budget.Reserve() {
			for range n {
				s.budget.Release()
			}
			for i, it := range items { // the first new key past the bound
				if s.tab.find(it.Hash, it.Key) == nil {
					if n == 0 {
						out[i].Err = msg.ErrKeyCapacity
						break
					}
					n--
				}
			}
			return false
		}
	}
	s.last = now
	return true
}

// HoldEval writes into out what deciding each item at T (>= the hold's
// reading) would answer, changing no answer: the buckets are refilled on
// copies, and new keys are not created.
func (s *State) HoldEval(T int64, items []msg.Item, out []msg.Reply) {
	g := &s.gens[len(s.gens)-1]
	var buf [maxLevels]policy.Level
	for i, it := range items {
		b := s.tab.find(it.Hash, it.Key)
		var in *limitInfo
		var lv []policy.Level
		last := T
		if b == nil {
			in = &g.limits[g.pol.Overrides.Resolve(it.Key)]
			lv = buf[:in.shape.Len()]
			for j := range lv {
				lv[j] = policy.FullLevel(in.shape.Band(j))
			}
		} else {
			in = &g.limits[b.Limit] // brought up by HoldBegin
			lv = s.load(b, in, &buf)
			last = b.Last
		}
		if T > last {
			policy.RefillLevels(in.shape, lv, T-last)
		}
		o, band := policy.DecideLevels(in.shape, lv, it.Cost)
		d := &out[i].Decision
		d.Allowed = o.Allowed
		d.Remaining = o.Remaining
		d.RetryAfter = time.Duration(o.RetryAfter)
		d.Version = g.pol.Version
		d.Limit = in.shape.Band(band).Capacity
		d.ResetAfter = time.Duration(o.ResetAfter)
		d.Band = in.shape.BandName(band)
		out[i].Err = nil
	}
}

// HoldCommit ends the hold at T: with admit, every item is decided at T
// (as HoldEval answered, every one allowed), its new keys created in the
// slots HoldBegin reserved; without, nothing is taken and the reservation
// is given back. It writes no answer: the caller has HoldEval's, and may be
// reading them.
func (s *State) HoldCommit(T int64, items []msg.Item, admit bool) {
	if !admit {
		s.HoldRelease(items)
		s.last = max(s.last, T)
		return
	}
	var r msg.Reply
	for _, it := range items {
		s.decideFound(T, it.Key, it.Hash, it.Cost, &r, s.tab.find(it.Hash, it.Key), true)
	}
}

// HoldRelease gives back the budget HoldBegin reserved for items' new keys.
func (s *State) HoldRelease(items []msg.Item) {
	for _, it := range items {
		if s.tab.find(it.Hash, it.Key) == nil {
			s.budget.Release()
		}
	}
}
