package main

import (
	"slices"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// diffShrink reduces a failing trace to a short one that still fails: first
// one shard if that still fails, then the ops after the failure go, then
// delta debugging over the ops, over each batch's and AllowAll's requests, over each
// policy's overrides and over its bands and its overrides' bands, and last
// readability: times shifted to start at 0,
// and a Manual clock instead of the regressing one when the times left
// never step back. Every candidate is replayed from scratch on a fresh
// engine and model, and kept only if it still fails. It returns the shrunk
// trace and how many replays it took.
func diffShrink(tr diffTrace, mk diffMaker) (diffTrace, int) {
	replays := 0
	deadline := time.Now().Add(diffShrinkTime)
	var failAt int
	fails := func(t diffTrace) bool {
		if replays >= diffShrinkReplays || time.Now().After(deadline) {
			return false
		}
		replays++
		out, err := diffReplay(t, mk, nil, false)
		if err != nil || !out.valid || out.fail == nil {
			return false
		}
		failAt = out.fail.index
		return true
	}
	cur := tr
	cur.ops = slices.Clone(tr.ops)
	if !fails(cur) {
		return tr, replays // not reproducible; leave it as found
	}
	if cur.cfg.shards > 1 {
		one := cur
		one.cfg.shards = 1
		if fails(one) {
			cur = one
		}
	}
	cur.ops = cur.ops[:failAt+1]
	cur.ops = diffDDMin(cur.ops, func(ops []diffOp) bool {
		t := cur
		t.ops = ops
		return fails(t)
	})
	for i := range cur.ops {
		if k := cur.ops[i].kind; k != diffBatch && k != diffShortBatch && k != diffAllowAll {
			continue
		}
		cur.ops[i].reqs = diffDDMin(cur.ops[i].reqs, func(reqs []engine.Request) bool {
			t := cur
			t.ops = slices.Clone(cur.ops)
			t.ops[i].reqs = reqs
			return fails(t)
		})
	}
	// Overrides the failure does not need go too: all of a policy's at once
	// if it can, else one by one.
	shrinkOverrides := func(p *policy.Policy, with func(policy.Policy) diffTrace) {
		if p.Overrides.Len() == 0 {
			return
		}
		try := func(os []policy.Override) bool {
			q := *p
			q.Overrides = mustOverrides(os...)
			return fails(with(q))
		}
		if try(nil) {
			p.Overrides = nil
			return
		}
		if os := diffDDMin(p.Overrides.Overrides(), try); len(os) < p.Overrides.Len() {
			p.Overrides = mustOverrides(os...)
		}
	}
	// So do bands: a policy's all at once if it can, else one by one; an
	// override's all at once.
	shrinkBands := func(p *policy.Policy, with func(policy.Policy) diffTrace) {
		if p.Bands.Len() > 0 {
			try := func(bs []policy.Band) bool {
				q := *p
				q.Bands = mustBands(bs...)
				return fails(with(q))
			}
			if try(nil) {
				p.Bands = nil
			} else if bs := diffDDMin(p.Bands.Bands(), try); len(bs) < p.Bands.Len() {
				p.Bands = mustBands(bs...)
			}
		}
		for i := range p.Overrides.Len() {
			os := p.Overrides.Overrides()
			if os[i].Bands.Len() == 0 {
				continue
			}
			os[i].Bands = nil
			q := *p
			q.Overrides = mustOverrides(os...)
			if fails(with(q)) {
				p.Overrides = q.Overrides
			}
		}
	}
	shrink := func(p *policy.Policy, with func(policy.Policy) diffTrace) {
		shrinkOverrides(p, with)
		shrinkBands(p, with)
	}
	shrink(&cur.cfg.policy, func(p policy.Policy) diffTrace {
		t := cur
		t.cfg.policy = p
		return t
	})
	for i := range cur.ops {
		if cur.ops[i].kind != diffCutover {
			continue
		}
		shrink(&cur.ops[i].next, func(p policy.Policy) diffTrace {
			t := cur
			t.ops = slices.Clone(cur.ops)
			t.ops[i].next = p
			return t
		})
	}
	if t := cur.shifted(); !slices.Equal(t.times(), cur.times()) && fails(t) {
		cur = t
	}
	if cur.cfg.regress && cur.monotonic() {
		t := cur
		t.cfg.regress = false
		if fails(t) {
			cur = t
		}
	}
	return cur, replays
}

// shifted returns tr with its ops moved back so the earliest is at 0, and
// the clock starting at 0.
func (tr diffTrace) shifted() diffTrace {
	low := slices.Min(tr.times()[1:])
	t := tr
	t.cfg.start = 0
	t.ops = slices.Clone(tr.ops)
	for i := range t.ops {
		t.ops[i].t -= low
	}
	return t
}

// times returns the clock's start and the instant of every op.
func (tr diffTrace) times() []int64 {
	ts := []int64{tr.cfg.start}
	for _, op := range tr.ops {
		ts = append(ts, op.t)
	}
	return ts
}

// monotonic reports whether tr's instants never step back, so a Manual clock
// can play them.
func (tr diffTrace) monotonic() bool {
	last := tr.cfg.start
	for _, op := range tr.ops {
		if op.t < last {
			return false
		}
		last = op.t
	}
	return true
}

// diffDDMin is delta debugging by complements: it removes chunks of xs, from
// halves down to single elements, while fails still holds, and returns a
// fresh slice no element of which can be removed alone.
func diffDDMin[T any](xs []T, fails func([]T) bool) []T {
	xs = slices.Clone(xs)
	n := 2
	for len(xs) >= 2 {
		size := (len(xs) + n - 1) / n
		reduced := false
		for lo := 0; lo < len(xs); lo += size {
			c := slices.Concat(xs[:lo], xs[min(lo+size, len(xs)):])
			if fails(c) {
				xs, n, reduced = c, max(n-1, 2), true
				break
			}
		}
		if !reduced {
			if n >= len(xs) {
				break
			}
			n = min(2*n, len(xs))
		}
	}
	return xs
}
