package main

import (
	"cmp"
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// The conservation bound: how many tokens one key can have been admitted.
//
// Every admission takes its cost from every band of the key's limit, so the
// bound holds band by band: whatever one band allows, the key was admitted
// no more than that. Take one key, one band of its limit, and any window
// [s, T] of clock readings, where s and T are readings the coordinator took
// while no cutover was in flight, so the policy in force at s is known, and
// where the band exists throughout the window (see "Bands that come and go"
// below). The key lives on one shard, whose policy is piecewise constant:
// P_k from its cutover reading τ_k on, where τ_k lies in [b_k, a_k], the
// readings taken just before ReplacePolicy k was called and just after it
// returned. Split the window into the key's lives: a life starts when the
// key is created (every band full) or at s if it exists then, and ends
// when a sweep evicts it (every band full) or at T. Within a life, from x
// to y, for the band's balance bal in tokens,
//
//	admitted(x, y) = bal(x) - bal(y) + refill(x, y) - lost(x, y)
//	              <= bal(x) - bal(y) + ∫_x^y rate(t) dt
//
// because a refill between two readings adds at most rate x elapsed before
// the cap, and everything else only ever removes tokens: the cap, the clamp
// of a cutover to a lower capacity, and the rounding down of a cutover that
// changes the band's period (the balance moves to the new unit, 1/Per
// tokens, rounding down). Summing over the lives: bal(x_1) <= cap(s) if the
// key exists at s, and = cap(c_1) if it is created at c_1 > s; each
// eviction at e_i leaves bal = cap(e_i), and the next life starts at
// cap(c_{i+1}); the last life ends at bal(T) >= 0. So
//
//	admitted(s, T) <= cap(s) + Σ_i [cap(c_{i+1}) - cap(e_i)] + [cap(c_1) - cap(s)]
//	                  + ∫_s^T rate(t) dt
//
// and each bracket is the net change of the band's capacity over disjoint
// intervals, at most the sum of the capacity increases made by cutovers
// inside them. An eviction and a recreation after a raise do hand out the
// raise (only a full bucket is evicted, and a key created after a cutover
// starts full at the new capacity), which is why raises count and decreases
// do not; a raise without an eviction grants nothing, as a cutover clamps
// and never tops up, so this is generous, never short. The rate integral is
// exact outside cutover windows; inside [b_k, a_k] the shard runs at the old
// rate then the new one, so the larger of the two over the whole window is
// an upper bound (rates compared as Tokens/Per, whatever their periods).
// Hence, in tokens, exactly (math/big.Rat: a rate of N per P ns adds N/P
// tokens a nanosecond),
//
//	admitted(s, T) <= cap(s) + C(T) - C(s)
//	C(t) = ∫ rate upper bound over [start, t] + Σ capacity raises up to t
//
// Bands that come and go. A band is matched across a cutover by name (the
// primary with the primary), so one band of a class of keys is a track:
// the primary for the whole run, or a named band from the cutover that
// added it to the one that dropped it (one dropped and added again is a new
// track). A band added by cutover k starts full, at every key that has it:
// it only restricts. A window that starts before a_k is not bounded by it
// at all (admissions before τ_k never met it), so a track's windows start
// at its first boundary after a_k, where the argument above holds as it
// stands: the balance is at most the capacity then. A dropped band bounds
// nothing from τ_k on, so its track stops at the cutover that drops it:
// every segment finalized before then was checked against a reading taken
// before that call, and none after is checked against the track.
//
// The check runs this for every track, every window start the coordinator
// marked (a boundary) and every window end it finalizes, so a generous
// period (a huge rate for a while) cannot hide an excess that comes after
// it. Writing A(s) for the key's tokens admitted before s, the condition for
// all s <= T is
//
//	A(T) - C(T) <= min_s [ A(s) - C(s) + cap(s) ]
//
// kept per key and track as a running minimum, updated lazily when the key
// is next admitted (the condition cannot newly fail for a key with no
// admissions, since C only grows).
//
// Which admissions count for which window: a worker reads the current segment
// number g before each call and attributes its admissions to g. Segment g
// starts at boundary g, whose reading was taken before g was published, so
// the admission's shard reading is >= the start of g: admissions attributed
// to segments >= i really happened in [boundary i, ...]. A segment is
// finalized only once every worker has moved past it (its calls in it have
// returned), and checked against C at a reading taken after that, so every
// counted admission lies inside the window it is checked in. Counting fewer
// admissions than happened (a window start after an admission that spans it
// is never credited with it) only weakens the check, never makes it unsound.

// consTimeline integrates C(t), the credit bound, for one track, from the
// coordinator's own clock readings. It is owned by the coordinator goroutine.
type consTimeline struct {
	at       int64        // last reading folded in
	lim      policy.Limit // the band's shape on every shard since at
	rate     big.Rat      // ∫ rate upper bound since the track began, in tokens
	raise    big.Rat      // Σ capacity raises since the track began, in tokens
	cutovers int          // successful cutovers since the track began
}

// advance folds [tl.at, t] at r. Readings must come in order: folding an
// earlier one would credit the wrong rate to some interval.
func (tl *consTimeline) advance(t int64, r policy.Rate) {
	if t < tl.at {
		panic(fmt.Sprintf("stress: conservation reading %d before %d", t, tl.at))
	}
	earned := new(big.Int).Mul(big.NewInt(t-tl.at), big.NewInt(r.Tokens))
	tl.rate.Add(&tl.rate, new(big.Rat).SetFrac(earned, big.NewInt(int64(r.Per))))
	tl.at = t
}

// cutover folds a successful ReplacePolicy that gives the band next, called
// after reading before and returned before reading after: the old rate up to
// before, the larger of the two rates over the window, and the capacity
// raise if any.
func (tl *consTimeline) cutover(before, after int64, next policy.Limit) {
	old := tl.lim.Rate()
	tl.advance(before, old)
	tl.advance(after, consFaster(old, next.Rate()))
	if d := next.Capacity - tl.lim.Capacity; d > 0 {
		tl.raise.Add(&tl.raise, new(big.Rat).SetInt64(d))
	}
	tl.lim = next
	tl.cutovers++
}

// consFaster returns the faster of two rates: a/Pa against b/Pb, compared
// as a x Pb against b x Pa, exactly.
func consFaster(a, b policy.Rate) policy.Rate {
	x := new(big.Int).Mul(big.NewInt(a.Tokens), big.NewInt(int64(b.Per)))
	y := new(big.Int).Mul(big.NewInt(b.Tokens), big.NewInt(int64(a.Per)))
	if x.Cmp(y) >= 0 {
		return a
	}
	return b
}

// consBoundary is a candidate window start for one track: a reading taken
// while no cutover was in flight, with C and the band's capacity at that
// reading.
type consBoundary struct {
	at       int64
	capacity int64
	rate     big.Rat // C's rate part at at
	raise    big.Rat // C's raise part at at
	cutovers int
	w        big.Rat // capacity - C(at)
}

// consTrack is one band of one class of keys across cutovers: the primary,
// or a named band from the cutover that added it to the one that dropped it.
type consTrack struct {
	name    string // the band's name when it is not the primary
	primary bool
	tl      consTimeline
	first   int            // the segment (boundary) its windows start at, at the earliest
	base    int            // the boundary bounds[0] is: first, or later once older ones are dropped
	bounds  []consBoundary // bounds[i] is boundary base+i: the stack's and those not yet finalized
	stack   []int          // boundary numbers; w increases from bottom to top (suffix minima)
	ct      big.Rat        // C at the last finalization
	keys    map[int32]*consKeyTrack
}

func (tr *consTrack) bound(g int) *consBoundary { return &tr.bounds[g-tr.base] }

// drop forgets the boundaries before the stack's bottom once they are most
// of bounds: no window can start at one again (fold looks only at the
// stack), and a key's window start is kept as a copy (consKeyTrack.start),
// so that a long run's memory does not grow with its segments.
func (tr *consTrack) drop() {
	if n := tr.stack[0] - tr.base; n >= 64 && n >= len(tr.bounds)/2 {
		tr.bounds = slices.Delete(tr.bounds, 0, n)
		tr.base += n
	}
}

// label names the track for violations.
func (tr *consTrack) label() string {
	if tr.primary {
		return "the primary band"
	}
	return fmt.Sprintf("band %q", tr.name)
}

// consKeyTrack is one key's running state on one track.
type consKeyTrack struct {
	last   int          // last segment whose admissions were folded in; first-1 at the start
	min    big.Rat      // min over boundaries s folded so far of A(s) + w(s)
	from   int          // the boundary that gave min; -1 none
	before int64        // A(from): tokens admitted before that boundary
	start  consBoundary // boundary from, as it was (for a violation's account; w unset)
}

// consClass is the bound's state for one class of keys: the tracks of the
// bands its limit has had, the live ones last in tracks.
type consClass struct {
	rep    string // a key of the class: the policy's limit for it is the class's
	shape  policy.Shape
	tracks []*consTrack // live: the primary, then each band of shape, in order
}

// consKey is one key's running state in the check.
type consKey struct {
	class    int   // index in consLedger.classes
	admitted int64 // tokens admitted in finalized segments
}

// consAdmission is what workers admitted to one key in one segment.
type consAdmission struct {
	key    int32
	tokens int64
}

// consLedger checks the bound for every key and band. It is a pure state
// machine: the coordinator feeds it cutovers, boundaries and finalized
// segments; tests feed it fabricated ones. Not safe for concurrent use.
//
// With overrides keys have limits of their own, so the bound is kept per
// class of keys that every policy gives the same limit: the argument above
// holds key by key with the key's own bands, and all keys of a class share
// them.
type consLedger struct {
	pol     policy.Policy // in force since the last cutover
	classes []consClass
	nseg    int // boundaries (segments) so far
	done    int // segments finalized
	keys    []consKey
	names   []string
	seed    uint64
}

// newConsLedger returns a ledger for an engine started at reading 0 under p,
// with boundary 0 at reading 0. Keys fall into classes by consClassOf.
func newConsLedger(p policy.Policy, names []string, seed uint64) *consLedger {
	l := &consLedger{pol: p, names: names, seed: seed, keys: make([]consKey, len(names))}
	index := map[string]int{}
	for i, name := range names {
		c, ok := index[consClassOf(name)]
		if !ok {
			c = len(l.classes)
			index[consClassOf(name)] = c
			sh := shapeOf(p, name)
			cl := consClass{rep: name, shape: sh}
			for b := range sh.Len() {
				cl.tracks = append(cl.tracks, l.newTrack(sh, b, 0))
			}
			l.classes = append(l.classes, cl)
		}
		l.keys[i] = consKey{class: c}
	}
	l.boundary(0)
	return l
}

// newTrack starts a track for band b of sh, at reading at; its windows
// start at the next boundary.
func (l *consLedger) newTrack(sh policy.Shape, b int, at int64) *consTrack {
	tr := &consTrack{primary: b == 0, first: l.nseg, base: l.nseg, keys: map[int32]*consKeyTrack{}}
	if b > 0 {
		tr.name = sh.BandName(b)
	}
	tr.tl.at, tr.tl.lim = at, sh.Band(b)
	return tr
}

// cutover records a successful ReplacePolicy(next) bracketed by the readings
// before and after: each class's primary and each band next keeps (by name)
// carry on, a band next drops ends, and a band new in next starts a track.
func (l *consLedger) cutover(before, after int64, next policy.Policy) {
	for i := range l.classes {
		c := &l.classes[i]
		sh := shapeOf(next, c.rep)
		tracks := make([]*consTrack, sh.Len())
		for _, tr := range c.tracks {
			j := 0
			if !tr.primary {
				j = sh.Bands.Index(tr.name) + 1 // 0: dropped
				if j == 0 {
					continue // dropped: it bounds nothing more
				}
			}
			tr.tl.cutover(before, after, sh.Band(j))
			tracks[j] = tr
		}
		for j := range tracks {
			if tracks[j] == nil {
				tracks[j] = l.newTrack(sh, j, after)
			}
		}
		c.tracks, c.shape = tracks, sh
	}
	l.pol = next
}

// boundary marks a window start at reading at (no cutover in flight) and
// returns its index, which is also the number of the segment it starts.
func (l *consLedger) boundary(at int64) int {
	for i := range l.classes {
		for _, tr := range l.classes[i].tracks {
			tr.tl.advance(at, tr.tl.lim.Rate())
			b := consBoundary{at: at, capacity: tr.tl.lim.Capacity, cutovers: tr.tl.cutovers}
			b.rate.Set(&tr.tl.rate)
			b.raise.Set(&tr.tl.raise)
			b.w.SetInt64(b.capacity)
			b.w.Sub(&b.w, &b.rate)
			b.w.Sub(&b.w, &b.raise)
			tr.bounds = append(tr.bounds, b)
		}
	}
	l.nseg++
	return l.nseg - 1
}

// segments returns how many boundaries (segments) there are.
func (l *consLedger) segments() int { return l.nseg }

// finalize folds in segment g (which must be the next one) with adm, what
// was admitted in it, and checks every key it touched, on every band, against
// the credit up to reading T; every admission counted so far must have
// happened by T, and no cutover may be in flight at T. It returns the first
// violation.
func (l *consLedger) finalize(g int, adm []consAdmission, T int64) *Violation {
	if g != l.done || g >= l.segments() {
		panic(fmt.Sprintf("stress: finalize segment %d, next is %d of %d", g, l.done, l.segments()))
	}
	l.done++
	for i := range l.classes {
		for _, tr := range l.classes[i].tracks {
			if g >= tr.first {
				// Boundary g becomes a candidate start now that A(g) is
				// final for every key: segments before g are folded in.
				for len(tr.stack) > 0 && tr.bound(tr.stack[len(tr.stack)-1]).w.Cmp(&tr.bound(g).w) >= 0 {
					tr.stack = tr.stack[:len(tr.stack)-1]
				}
				tr.stack = append(tr.stack, g)
				tr.drop()
			}
			tr.tl.advance(T, tr.tl.lim.Rate())
			tr.ct.Add(&tr.tl.rate, &tr.tl.raise)
		}
	}

	slices.SortFunc(adm, func(a, b consAdmission) int { return cmp.Compare(a.key, b.key) })
	var excess big.Rat
	for _, a := range adm {
		if a.tokens == 0 {
			continue
		}
		k := &l.keys[a.key]
		c := &l.classes[k.class]
		for _, tr := range c.tracks {
			if g < tr.first {
				continue // no window of it has started yet
			}
			kt := tr.keys[a.key]
			if kt == nil {
				kt = &consKeyTrack{last: tr.first - 1, from: -1}
				tr.keys[a.key] = kt
			}
			l.fold(kt, tr, g, k.admitted)
		}
		k.admitted += a.tokens
		for _, tr := range c.tracks {
			if g < tr.first {
				continue
			}
			kt := tr.keys[a.key]
			kt.last = g
			// A(T) - C(T) <= min
			excess.SetInt64(k.admitted)
			excess.Sub(&excess, &tr.ct)
			if excess.Cmp(&kt.min) > 0 {
				return l.violation(a.key, tr, kt, T)
			}
		}
	}
	return nil
}

// fold lowers kt.min with every boundary of track tr in (kt.last, g]: A is
// constant over them (no admissions since segment kt.last), and is
// admitted, so the best is the smallest w, the first suffix minimum past
// kt.last.
func (l *consLedger) fold(kt *consKeyTrack, tr *consTrack, g int, admitted int64) {
	if kt.last >= g {
		return
	}
	j, _ := slices.BinarySearch(tr.stack, kt.last+1)
	i := tr.stack[j] // exists: g, just pushed, is on top and g > kt.last
	cand := new(big.Rat).SetInt64(admitted)
	cand.Add(cand, &tr.bound(i).w)
	if kt.from < 0 || cand.Cmp(&kt.min) < 0 {
		kt.min.Set(cand)
		kt.from = i
		kt.before = admitted
		b := tr.bound(i)
		kt.start.at, kt.start.capacity, kt.start.cutovers = b.at, b.capacity, b.cutovers
		kt.start.rate.Set(&b.rate)
		kt.start.raise.Set(&b.raise)
	}
}

// violation explains the window that failed for key on track tr.
func (l *consLedger) violation(key int32, tr *consTrack, kt *consKeyTrack, T int64) *Violation {
	k := &l.keys[key]
	b := &kt.start
	refill := new(big.Rat).Sub(&tr.tl.rate, &b.rate)
	raises := new(big.Rat).Sub(&tr.tl.raise, &b.raise)
	bound := new(big.Rat).SetInt64(b.capacity)
	bound.Add(bound, refill)
	bound.Add(bound, raises)
	return &Violation{
		Check: "conservation",
		Key:   l.names[key],
		Op:    fmt.Sprintf("Allow/AllowBatch admissions between readings %v and %v", time.Duration(b.at), time.Duration(T)),
		Want: fmt.Sprintf("at most %s tokens by %s: its capacity %d at the window start + refill bound %s + capacity raises %s, over %d cutovers",
			consTokens(bound), tr.label(), b.capacity, consTokens(refill), consTokens(raises), tr.tl.cutovers-b.cutovers),
		Got:  fmt.Sprintf("%d tokens admitted", k.admitted-kt.before),
		Seed: l.seed,
		Detail: fmt.Sprintf("window from boundary %d of %d; the key's admissions total %d tokens; %s now %d at %s under %s",
			kt.from, l.nseg, k.admitted, tr.label(), tr.tl.lim.Capacity, rateText(tr.tl.lim.Rate()), policyText(l.pol)),
	}
}

// consTokens formats tokens, floored, with the fraction when there is one.
func consTokens(t *big.Rat) string {
	q, r := new(big.Int).QuoRem(t.Num(), t.Denom(), new(big.Int))
	if r.Sign() == 0 {
		return q.String()
	}
	return fmt.Sprintf("%s+%s/%s", q, r, t.Denom())
}
