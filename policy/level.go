package policy

import "math/bits"

// Shape is the whole limit of a key: its primary band, the band's name, and
// the bands of a BandSet beside it. Band 0 is the primary, band i >= 1 is
// Bands.At(i-1). It is a comparable value.
type Shape struct {
	Name    string // the primary band's: the override's Name, or "" for the policy's own limit
	Primary Limit
	Bands   *BandSet
}

// Len returns the number of bands, the primary included.
func (sh Shape) Len() int { return 1 + sh.Bands.Len() }

// Band returns band i's shape.
func (sh Shape) Band(i int) Limit {
	if i == 0 {
		return sh.Primary
	}
	return sh.Bands.limits[i-1]
}

// BandName returns band i's name.
func (sh Shape) BandName(i int) string {
	if i == 0 {
		return sh.Name
	}
	return sh.Bands.bands[i-1].Name
}

// Compact reports whether a Bucket alone can hold a key of this shape: one
// band, of a compact period (Limit.Compact).
func (sh Shape) Compact() bool { return sh.Bands.Len() == 0 && sh.Primary.Compact() }

// Level is the balance of one band of any period: Tokens whole tokens plus
// Frac units, one token being P units for a rate of N per P ns, so the
// balance is Tokens*P + Frac units with 0 <= Frac < P, and Tokens is
// floor(units / P). It lies between minus the capacity and the capacity:
// -capacity <= Tokens <= capacity, and Tokens == capacity implies Frac == 0.
// A negative balance is a debt (see Charge): Tokens is negative and Frac
// still counts up from it, so -2.25 tokens at P = 4 is Tokens -3, Frac 3.
// The bands of one key share the instant they were brought up to date at,
// so a Level has none. The range argument is in debt.go.
type Level struct {
	Tokens int64
	Frac   uint64
}

// FullLevel returns a full band of shape l.
func FullLevel(l Limit) Level { return Level{Tokens: l.Capacity} }

// Refill adds elapsed (>= 0) ns of refill under l, exactly, up to l's
// capacity: units = min(capacity*P, units + elapsed*N). A debt is repaid
// first: the refill is the same whatever the sign of the balance.
func (v *Level) Refill(l Limit, elapsed int64) {
	if v.Tokens >= l.Capacity {
		v.Tokens, v.Frac = l.Capacity, 0
		return
	}
	if elapsed <= 0 {
		return
	}
	n, per := l.rate()
	addHi, addLo := bits.Mul64(uint64(elapsed), n)
	defHi, defLo := deficit(v.Tokens, v.Frac, l.Capacity, per)
	if addHi > defHi || (addHi == defHi && addLo >= defLo) {
		v.Tokens, v.Frac = l.Capacity, 0
		return
	}
	// add < deficit, so the quotient is below capacity-Tokens <= 2^64-2
	// (see Bucket.Refill and debt.go) and hi < per.
	lo, carry := bits.Add64(addLo, v.Frac, 0)
	q, r := bits.Div64(addHi+carry, lo, per)
	v.Tokens += int64(q)
	v.Frac = r
}

// RetryAfter is the ns until v holds cost tokens under l: ceil((cost*P -
// units) / N), 0 if it already does, saturated at math.MaxInt64. Any debt
// is part of what is missing. cost may be any int64 >= 1.
func (v Level) RetryAfter(l Limit, cost int64) int64 { return retryAfter(v.Tokens, v.Frac, l, cost) }

// ResetAfter is the ns until v is full under l: ceil((capacity*P - units) /
// N), 0 when full, saturated at math.MaxInt64: repaying any debt, then
// refilling to the capacity.
func (v Level) ResetAfter(l Limit) int64 { return resetAfter(v.Tokens, v.Frac, l) }

// Full reports whether v holds l's capacity; a band in debt never does.
func (v Level) Full(l Limit) bool { return v.Tokens >= l.Capacity }

// Credit gives tokens (>= 1) back, capped at l's capacity; the fraction is
// kept. It repays a debt first, like any credit.
func (v *Level) Credit(l Limit, tokens int64) {
	if uint64(tokens) >= headroom(v.Tokens, l.Capacity) {
		v.Tokens, v.Frac = l.Capacity, 0
		return
	}
	v.Tokens += tokens
}

// Convert carries v, brought up to date under old, over to next: the
// fraction moves to next's unit if the period changes, rounding down
// (floor(Frac * Pnext / Pold): a cutover may lose part of a unit, never mint
// one; the whole balance is floored, so a debt rounds toward more debt),
// then the balance is clamped to next's capacity, never raised, and a debt
// deeper than next's floor (minus its capacity) is raised to that floor.
func (v *Level) Convert(old, next Limit) {
	if po, pn := old.period(), next.period(); po != pn {
		v.Frac = convertFrac(v.Frac, po, pn)
	}
	clampLevel(&v.Tokens, &v.Frac, next.Capacity)
}

// LevelOf returns b's balance as a Level.
func LevelOf(b Bucket) Level { return Level{Tokens: b.Tokens, Frac: uint64(b.Frac)} }

// RefillLevels refills every band of sh by elapsed ns; lv[i] is band i.
func RefillLevels(sh Shape, lv []Level, elapsed int64) {
	for i := range lv {
		lv[i].Refill(sh.Band(i), elapsed)
	}
}

// FullLevels reports whether every band of sh is full.
func FullLevels(sh Shape, lv []Level) bool {
	for i := range lv {
		if !lv[i].Full(sh.Band(i)) {
			return false
		}
	}
	return true
}

// DecideLevels decides cost over every band of sh at once, lv[i] being band
// i, already refilled to the instant of the decision: allowed only if every
// band holds cost, and then cost is taken from every band; a denial takes
// nothing. It requires 1 <= cost <= every band's capacity.
//
// It returns the binding band's index and an Outcome describing it: on a
// denial the band with the longest wait (RetryAfter is the time until every
// band holds cost; waits are compared as Level.RetryAfter reports them,
// saturated, so two past math.MaxInt64 ns tie), when allowed the band with
// the fewest whole tokens left; ties go to the lowest index, the primary
// first. Remaining and
// ResetAfter are that band's.
func DecideLevels(sh Shape, lv []Level, cost int64) (Outcome, int) {
	allowed := true
	for i := range lv {
		if lv[i].Tokens < cost {
			allowed = false
			break
		}
	}
	if allowed {
		for i := range lv {
			lv[i].Tokens -= cost
		}
	}
	return bindingOutcome(sh, lv, cost, allowed)
}

// PeekLevels is the answer of a request of one token over every band of sh,
// taking nothing: Allowed says whether one token would pass, and the
// binding band is chosen as DecideLevels chooses it.
func PeekLevels(sh Shape, lv []Level) (Outcome, int) {
	allowed := true
	for i := range lv {
		if lv[i].Tokens < 1 {
			allowed = false
		}
	}
	return bindingOutcome(sh, lv, 1, allowed)
}

func bindingOutcome(sh Shape, lv []Level, cost int64, allowed bool) (Outcome, int) {
	at := 0
	o := Outcome{Allowed: allowed}
	if allowed {
		for i := 1; i < len(lv); i++ {
			if lv[i].Tokens < lv[at].Tokens {
				at = i
			}
		}
	} else {
		o.RetryAfter = lv[0].RetryAfter(sh.Primary, cost)
		for i := 1; i < len(lv); i++ {
			if w := lv[i].RetryAfter(sh.Band(i), cost); w > o.RetryAfter {
				o.RetryAfter, at = w, i
			}
		}
	}
	o.Remaining = lv[at].Tokens
	o.ResetAfter = lv[at].ResetAfter(sh.Band(at))
	return o, at
}

// CutoverLevels carries a key's bands from old to next at a cutover: lv
// (old's bands, refilled up to the cutover) becomes out (next's bands,
// len(out) == next.Len()). The primary takes over the primary's balance and
// a band takes over the balance of old's band of the same name, each by
// Level.Convert; a band new in next starts full; a band of old that next
// does not have is dropped.
func CutoverLevels(old Shape, lv []Level, next Shape, out []Level) {
	for i := range out {
		j := 0
		if i > 0 {
			j = old.Bands.Index(next.BandName(i)) + 1 // 0: no match
			if j == 0 {
				out[i] = FullLevel(next.Band(i))
				continue
			}
		}
		out[i] = lv[j]
		out[i].Convert(old.Band(j), next.Band(i))
	}
}
