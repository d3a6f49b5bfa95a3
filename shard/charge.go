package shard

import (
	"time"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// charge takes tokens (>= 1) from key, hashed h, at now, into r, without a
// decision: every band of the key is refilled to now and then loses tokens,
// down to minus its capacity at most (policy.ChargeLevels), so a charge is
// never denied and may leave the key in debt. An unknown key is created
// full, then charged. Errors, in decide's order less the cost bound (a
// cost known after the work may exceed every capacity): a reading older
// than the last one observed is ErrClockRegression, an unknown key at the
// key bound ErrKeyCapacity. An error changes nothing.
//
// The answer is allowed and describes the band with the fewest whole
// tokens left: Remaining (negative in debt), and ResetAfter, the time to
// repay the debt and refill to full. Like decide, it writes r field by
// field.
func (s *State) charge(now int64, key string, h uint64, tokens int64, r *msg.Reply) {
	b := s.tab.find(h, key)
	if b != nil && b.Epoch != s.epoch {
		s.bringUp(b, key) // may drop the history: read the generation after
	}
	if now < s.last {
		*r = msg.Reply{Err: msg.ErrClockRegression}
		return
	}
	g := &s.gens[len(s.gens)-1]
	var idx policy.LimitIndex
	if b != nil {
		idx = b.Limit
	} else {
		idx = g.pol.Overrides.Resolve(key)
	}
	in := &g.limits[idx]
	if b == nil {
		if !s.budget.reserve() {
			*r = msg.Reply{Err: msg.ErrKeyCapacity}
			return
		}
		b = s.tab.insert(h, key, s.sweeping() && h*mix >= s.pass.cursor) // as decideFound
		if in.n == 0 {
			*b = policy.NewBucket(in.lim, now)
		} else {
			s.newExt(b, in, now)
		}
		b.Epoch, b.Limit = s.epoch, idx
	}
	s.last = now
	d := &r.Decision
	d.Allowed = true
	d.RetryAfter = 0
	d.Version = g.pol.Version
	r.Err = nil
	if in.n == 0 {
		o := b.Charge(in.lim, now, tokens)
		d.Remaining = o.Remaining
		d.Limit = in.lim.Capacity
		d.ResetAfter = time.Duration(o.ResetAfter)
		d.Band = in.names[0]
		return
	}
	lv := s.levels.levels(b.Frac, in.n)
	if now > b.Last {
		policy.RefillLevels(in.shape, lv, now-b.Last)
		b.Last = now
	}
	o, band := policy.ChargeLevels(in.shape, lv, tokens)
	d.Remaining = o.Remaining
	d.Limit = in.shape.Band(band).Capacity
	d.ResetAfter = time.Duration(o.ResetAfter)
	d.Band = in.names[band]
}
