package main

import (
	"cmp"
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// The conservation bound: how many tokens one key can have been admitted.
//
// Take one key and any window [s, T] of clock readings, where s and T are
// readings the coordinator took while no cutover was in flight, so the
// policy in force at s is known. The key lives on one shard, whose policy is
// piecewise constant: P_k from its cutover reading τ_k on, where τ_k lies in
// [b_k, a_k], the readings taken just before ReplacePolicy k was called and
// just after it returned. Split the window into the key's lives: a life
// starts when the key is created (full) or at s if it exists then, and ends
// when a sweep evicts it (full) or at T. Within a life, from x to y,
//
//	admitted(x, y) = bal(x) - bal(y) + refill(x, y) - clamped(x, y)
//	              <= bal(x) - bal(y) + ∫_x^y rate(t) dt
//
// because a refill between two readings adds at most rate x elapsed before
// the cap and a clamp only ever removes units. Summing over the lives:
// bal(x_1) <= cap(s) if the key exists at s, and = cap(c_1) if it is created
// at c_1 > s; each eviction at e_i leaves bal = cap(e_i), and the next life
// starts at cap(c_{i+1}); the last life ends at bal(T) >= 0. So
//
//	admitted(s, T) <= cap(s) + Σ_i [cap(c_{i+1}) - cap(e_i)] + [cap(c_1) - cap(s)]
//	                  + ∫_s^T rate(t) dt
//
// and each bracket is the net change of the capacity over disjoint intervals,
// at most the sum of the capacity increases made by cutovers inside them. An
// eviction and a recreation after a raise do hand out the raise (only a full
// bucket is evicted, and a key created after a cutover starts full at the new
// capacity), which is why raises count and
// decreases do not; a raise without an eviction grants nothing, so this
// is generous, never short. The rate integral is exact outside cutover
// windows; inside [b_k, a_k] the shard runs at the old rate then the new one,
// so max(old, new) over the whole window is an upper bound. Hence, in units
// (1 token = 1e9 units, a rate of r tokens/s adds r units per ns):
//
//	admitted(s, T) * 1e9 <= cap(s)*1e9 + C(T) - C(s)
//	C(t) = Σ rate upper bound x ns over [0, t] + Σ capacity raises x 1e9 up to t
//
// The check runs this for every window start the coordinator marked (a
// boundary) and every window end it finalizes, so a generous period (a huge
// rate for a while) cannot hide an excess that comes after it. Writing
// A(s) for the key's tokens admitted before s, the condition for all s <= T
// is
//
//	A(T)*1e9 - C(T) <= min_s [ A(s)*1e9 - C(s) + cap(s)*1e9 ]
//
// kept per key as a running minimum, updated lazily when the key is next
// admitted (the condition cannot newly fail for a key with no admissions,
// since C only grows).
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

// consUnits is units per token: a rate of r tokens/s adds r units per ns.
const consUnits = policy.UnitsPerToken

var consBigUnits = big.NewInt(consUnits)

// consTimeline integrates C(t), the credit bound, for the keys of one class
// (keys every policy gives the same limit, see consClassOf), from the
// coordinator's own clock readings. It is owned by the coordinator goroutine.
type consTimeline struct {
	at       int64        // last reading folded in
	lim      policy.Limit // the class's limit on every shard since at
	rate     big.Int      // ∫ rate upper bound over [0, at], in units
	raise    big.Int      // Σ capacity raises x 1e9 up to at, in units
	cutovers int          // successful cutovers up to at
	tmp      big.Int
}

// advance folds [tl.at, t] in at tokensPerSecond. Readings must come in
// order: folding an earlier one would credit the wrong rate to some interval.
func (tl *consTimeline) advance(t, tokensPerSecond int64) {
	if t < tl.at {
		panic(fmt.Sprintf("stress: conservation reading %d before %d", t, tl.at))
	}
	tl.tmp.SetInt64(t - tl.at)
	tl.tmp.Mul(&tl.tmp, big.NewInt(tokensPerSecond))
	tl.rate.Add(&tl.rate, &tl.tmp)
	tl.at = t
}

// cutover folds a successful ReplacePolicy that gives the class next, called
// after reading before and returned before reading after: the old rate up to
// before, the larger of the two rates over the window, and the capacity
// raise if any.
func (tl *consTimeline) cutover(before, after int64, next policy.Limit) {
	tl.advance(before, tl.lim.TokensPerSecond)
	tl.advance(after, max(tl.lim.TokensPerSecond, next.TokensPerSecond))
	if d := next.Capacity - tl.lim.Capacity; d > 0 {
		tl.tmp.SetInt64(d)
		tl.tmp.Mul(&tl.tmp, consBigUnits)
		tl.raise.Add(&tl.raise, &tl.tmp)
	}
	tl.lim = next
	tl.cutovers++
}

// consBoundary is a candidate window start for one class: a reading taken
// while no cutover was in flight, with C and the class's capacity at that
// reading.
type consBoundary struct {
	at       int64
	capacity int64
	rate     big.Int // C's rate part at at
	raise    big.Int // C's raise part at at
	cutovers int
	w        big.Int // capacity*1e9 - C(at)
}

// consClass is the bound's state for one class of keys: its own timeline,
// its boundaries (one per segment, like every class's) and their suffix
// minima.
type consClass struct {
	rep    string // a key of the class: the policy's limit for it is the class's
	tl     consTimeline
	bounds []consBoundary
	stack  []int // boundary indices; w increases from bottom to top (suffix minima)
	ct     big.Int
}

// consKey is one key's running state in the check.
type consKey struct {
	class    int     // index in consLedger.classes
	admitted int64   // tokens admitted in finalized segments
	last     int     // last segment whose admissions were folded in; -1 none
	min      big.Int // min over boundaries s folded so far of A(s)*1e9 + w(s)
	from     int     // the boundary that gave min
	before   int64   // A(from): tokens admitted before that boundary
}

// consAdmission is what workers admitted to one key in one segment.
type consAdmission struct {
	key    int32
	tokens int64
}

// consLedger checks the bound for every key. It is a pure state machine: the
// coordinator feeds it cutovers, boundaries and finalized segments; tests
// feed it fabricated ones. Not safe for concurrent use.
//
// With overrides keys have limits of their own, so the bound is kept per
// class of keys that every policy gives the same limit: the argument above
// holds key by key with the key's own capacity and rate, and all keys of a
// class share them.
type consLedger struct {
	pol     policy.Policy // in force since the last cutover
	classes []consClass
	done    int // segments finalized
	keys    []consKey
	names   []string
	seed    uint64
	tmp     big.Int
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
			l.classes = append(l.classes, consClass{rep: name})
			l.classes[c].tl.lim = model.LimitOf(p, name)
		}
		l.keys[i] = consKey{class: c, last: -1, from: -1}
	}
	l.boundary(0)
	return l
}

// cutover records a successful ReplacePolicy(next) bracketed by the readings
// before and after.
func (l *consLedger) cutover(before, after int64, next policy.Policy) {
	for i := range l.classes {
		c := &l.classes[i]
		c.tl.cutover(before, after, model.LimitOf(next, c.rep))
	}
	l.pol = next
}

// boundary marks a window start at reading at (no cutover in flight) and
// returns its index, which is also the number of the segment it starts.
func (l *consLedger) boundary(at int64) int {
	for i := range l.classes {
		c := &l.classes[i]
		c.tl.advance(at, c.tl.lim.TokensPerSecond)
		c.bounds = append(c.bounds, consBoundary{at: at, capacity: c.tl.lim.Capacity, cutovers: c.tl.cutovers})
		b := &c.bounds[len(c.bounds)-1]
		b.rate.Set(&c.tl.rate)
		b.raise.Set(&c.tl.raise)
		b.w.SetInt64(b.capacity)
		b.w.Mul(&b.w, consBigUnits)
		b.w.Sub(&b.w, &b.rate)
		b.w.Sub(&b.w, &b.raise)
	}
	return l.segments() - 1
}

// segments returns how many boundaries (segments) there are.
func (l *consLedger) segments() int {
	if len(l.classes) == 0 {
		return 0
	}
	return len(l.classes[0].bounds)
}

// finalize folds in segment g (which must be the next one) with adm, what
// was admitted in it, and checks every key it touched against the credit up
// to reading T; every admission counted so far must have happened by T, and
// no cutover may be in flight at T. It returns the first violation.
func (l *consLedger) finalize(g int, adm []consAdmission, T int64) *Violation {
	if g != l.done || g >= l.segments() {
		panic(fmt.Sprintf("stress: finalize segment %d, next is %d of %d", g, l.done, l.segments()))
	}
	l.done++
	for i := range l.classes {
		c := &l.classes[i]
		// Boundary g becomes a candidate start now that A(g) is final for
		// every key: segments before g are folded in.
		for len(c.stack) > 0 && c.bounds[c.stack[len(c.stack)-1]].w.Cmp(&c.bounds[g].w) >= 0 {
			c.stack = c.stack[:len(c.stack)-1]
		}
		c.stack = append(c.stack, g)
		c.tl.advance(T, c.tl.lim.TokensPerSecond)
		c.ct.Add(&c.tl.rate, &c.tl.raise)
	}

	slices.SortFunc(adm, func(a, b consAdmission) int { return cmp.Compare(a.key, b.key) })
	for _, a := range adm {
		if a.tokens == 0 {
			continue
		}
		k := &l.keys[a.key]
		c := &l.classes[k.class]
		l.fold(k, c, g)
		k.admitted += a.tokens
		k.last = g
		// A(T)*1e9 - C(T) <= min
		l.tmp.SetInt64(k.admitted)
		l.tmp.Mul(&l.tmp, consBigUnits)
		l.tmp.Sub(&l.tmp, &c.ct)
		if l.tmp.Cmp(&k.min) > 0 {
			return l.violation(a.key, T)
		}
	}
	return nil
}

// fold lowers k.min with every boundary of its class c in (k.last, g]: A is
// constant over them (no admissions since segment k.last), so the best is
// the smallest w, the first suffix minimum past k.last.
func (l *consLedger) fold(k *consKey, c *consClass, g int) {
	if k.last >= g {
		return
	}
	j, _ := slices.BinarySearch(c.stack, k.last+1)
	i := c.stack[j] // exists: g, just pushed, is on top and g > k.last
	l.tmp.SetInt64(k.admitted)
	l.tmp.Mul(&l.tmp, consBigUnits)
	l.tmp.Add(&l.tmp, &c.bounds[i].w)
	if k.from < 0 || l.tmp.Cmp(&k.min) < 0 {
		k.min.Set(&l.tmp)
		k.from = i
		k.before = k.admitted
	}
}

// violation explains the window that failed for key.
func (l *consLedger) violation(key int32, T int64) *Violation {
	k := &l.keys[key]
	c := &l.classes[k.class]
	b := &c.bounds[k.from]
	refill := new(big.Int).Sub(&c.tl.rate, &b.rate)
	raises := new(big.Int).Sub(&c.tl.raise, &b.raise)
	bound := new(big.Int).SetInt64(b.capacity)
	bound.Mul(bound, consBigUnits)
	bound.Add(bound, refill)
	bound.Add(bound, raises)
	return &Violation{
		Check: "conservation",
		Key:   l.names[key],
		Op:    fmt.Sprintf("Allow/AllowBatch admissions between readings %v and %v", time.Duration(b.at), time.Duration(T)),
		Want: fmt.Sprintf("at most %s tokens: the key's capacity %d at the window start + refill bound %s + capacity raises %s, over %d cutovers",
			consTokens(bound), b.capacity, consTokens(refill), consTokens(raises), c.tl.cutovers-b.cutovers),
		Got:  fmt.Sprintf("%d tokens admitted", k.admitted-k.before),
		Seed: l.seed,
		Detail: fmt.Sprintf("window from boundary %d of %d; the key's admissions total %d tokens; its limit now %d/%d under %s",
			k.from, len(c.bounds), k.admitted, c.tl.lim.Capacity, c.tl.lim.TokensPerSecond, policyText(l.pol)),
	}
}

// consTokens formats units as tokens, floored, with the remainder when there is one.
func consTokens(units *big.Int) string {
	q, r := new(big.Int).QuoRem(units, consBigUnits, new(big.Int))
	if r.Sign() == 0 {
		return q.String()
	}
	return fmt.Sprintf("%s+%s/1e9", q, r)
}
