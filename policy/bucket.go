package policy

import (
	"math"
	"math/bits"
)

// Bucket is one key's balance in its compact form: Tokens whole tokens plus
// Frac units (0 <= Frac < P, one token being P units for a rate of N per P
// ns), brought up to date at clock reading Last. It serves a Limit whose
// period fits Frac's 32 bits (Limit.Compact): every rate given as
// TokensPerSecond, and any period up to about 4.29 s. A Level holds the
// balance of any band.
//
// The balance in units is Tokens*P + Frac; it never exceeds the capacity of
// the Limit it is used with, so Tokens == Capacity implies Frac == 0, and
// never falls below minus that capacity. A negative balance, a debt (see
// Level.Charge), has negative Tokens and a Frac that still counts up from
// them, exactly as a Level's (debt.go says why every step stays in range).
// Splitting whole tokens from the fraction keeps the record at 24 bytes
// while the balance itself needs up to 95 bits.
//
// Epoch and Limit are not interpreted here: the shard that owns the bucket
// records which policy generation the balance is expressed in, so a cutover
// can convert buckets lazily, and which limit of that policy the key
// resolved to, so it is resolved once. Bucket is a plain value and is not
// safe for concurrent use.
type Bucket struct {
	Tokens int64
	Last   int64
	Frac   uint32
	Epoch  uint16     // counts cutovers modulo 1<<16
	Limit  LimitIndex // into the limit table of the Epoch's policy
}

// Outcome is the answer to one admission decision, in tokens and nanoseconds.
type Outcome struct {
	Allowed    bool
	Remaining  int64 // whole tokens left after the decision, floored
	RetryAfter int64 // ns; 0 when allowed, else ceil(missing units / rate), saturated
	ResetAfter int64 // ns until full, ceil, saturated; 0 when full
}

// NewBucket returns a full bucket for l, up to date at now.
func NewBucket(l Limit, now int64) Bucket {
	return Bucket{Tokens: l.Capacity, Last: now}
}

// Refill brings b up to date at now under l, whose rate is N tokens per P
// ns (one token is P units):
//
//	units = min(capacity*P, units + (now-Last)*N); Last = now
//
// computed exactly in 128 bits. A now at or before Last changes nothing (time
// never runs backwards inside a bucket; the shard rejects such readings before
// they get here). l's period must fit the compact fraction (see
// Limit.Compact).
func (b *Bucket) Refill(l Limit, now int64) {
	if now <= b.Last {
		return
	}
	elapsed := uint64(now - b.Last)
	b.Last = now
	if b.Tokens >= l.Capacity {
		b.Tokens, b.Frac = l.Capacity, 0
		return
	}
	n, per := l.rate()
	addHi, addLo := bits.Mul64(elapsed, n)
	defHi, defLo := deficit(b.Tokens, uint64(b.Frac), l.Capacity, per)
	if addHi > defHi || (addHi == defHi && addLo >= defLo) {
		b.Tokens, b.Frac = l.Capacity, 0
		return
	}
	// Here add < deficit, so Frac+add < (capacity-Tokens)*P and the
	// quotient below is under capacity-Tokens <= 2^64-2, even in debt
	// (bits.Div64 needs hi < divisor).
	lo, carry := bits.Add64(addLo, uint64(b.Frac), 0)
	var q, r uint64
	switch hi := addHi + carry; {
	case hi == 0 && l.TokensPerSecond != 0:
		// The usual case, in 64 bits: a division by a constant, which the
		// compiler turns into a multiplication, where bits.Div64 divides.
		q, r = lo/UnitsPerToken, lo%UnitsPerToken
	default:
		q, r = bits.Div64(hi, lo, per)
	}
	b.Tokens += int64(q)
	b.Frac = uint32(r)
}

// Take removes cost tokens if the balance holds them and reports whether it
// did. cost must be >= 1. The balance is untouched on denial, so fractional
// credit is never lost.
func (b *Bucket) Take(cost int64) bool {
	// units >= cost*P exactly when the whole tokens alone cover cost,
	// because Frac < P and cost*P is a whole number of tokens.
	if b.Tokens < cost {
		return false
	}
	b.Tokens -= cost
	return true
}

// Decide refills b to now under l and admits cost if the balance covers it.
// It requires 1 <= cost <= l.Capacity and now >= b.Last; the shard checks
// both before calling.
func (b *Bucket) Decide(l Limit, now, cost int64) Outcome {
	n, per := l.rate()
	if now > b.Last {
		// Refill, written out. A call would keep all four words of l, the
		// bucket and cost live across it, spilled to the stack and loaded
		// back, which made this hot path slower than when a Limit was two
		// words; inline, they stay in registers. Refill's own test also
		// saves the work for a key decided again at one reading.
		elapsed := uint64(now - b.Last)
		b.Last = now
		if b.Tokens < l.Capacity {
			addHi, addLo := bits.Mul64(elapsed, n)
			defHi, defLo := deficit(b.Tokens, uint64(b.Frac), l.Capacity, per)
			if addHi > defHi || (addHi == defHi && addLo >= defLo) {
				b.Tokens, b.Frac = l.Capacity, 0
			} else {
				lo, carry := bits.Add64(addLo, uint64(b.Frac), 0)
				var q, r uint64
				switch hi := addHi + carry; {
				case hi == 0 && l.TokensPerSecond != 0:
					q, r = lo/UnitsPerToken, lo%UnitsPerToken // see Refill
				default:
					q, r = bits.Div64(hi, lo, per)
				}
				b.Tokens += int64(q)
				b.Frac = uint32(r)
			}
		} else {
			b.Tokens, b.Frac = l.Capacity, 0
		}
	}
	o := Outcome{Allowed: b.Take(cost)}
	// The fields, not the methods on a copy: copying a bucket just written
	// field by field reads it back in wider loads, which wait for the
	// stores to retire instead of taking their values.
	if !o.Allowed {
		o.RetryAfter = retryAfter(b.Tokens, uint64(b.Frac), l, cost)
	}
	o.Remaining = b.Tokens
	// resetAfter, written out: too large for the compiler to inline.
	if b.Tokens < l.Capacity {
		hi, lo := deficit(b.Tokens, uint64(b.Frac), l.Capacity, per)
		o.ResetAfter = ceilDiv(hi, lo, n)
	}
	return o
}

// RetryAfter is the time, in ns, until b (as it stands) holds cost tokens at
// l's rate of N per P: ceil((cost*P - units) / N), 0 if it already does,
// saturated at math.MaxInt64. It is an estimate, not a reservation.
func (b Bucket) RetryAfter(l Limit, cost int64) int64 {
	return retryAfter(b.Tokens, uint64(b.Frac), l, cost)
}

func retryAfter(tokens int64, frac uint64, l Limit, cost int64) int64 {
	if tokens >= cost {
		return 0
	}
	n, per := l.rate()
	hi, lo := deficit(tokens, frac, cost, per)
	return ceilDiv(hi, lo, n)
}

// ResetAfter is the time, in ns, until b is full at l's rate of N per P:
// ceil((capacity*P - units) / N), 0 when full, saturated at math.MaxInt64.
func (b Bucket) ResetAfter(l Limit) int64 {
	return resetAfter(b.Tokens, uint64(b.Frac), l)
}

func resetAfter(tokens int64, frac uint64, l Limit) int64 {
	if tokens >= l.Capacity {
		return 0
	}
	n, per := l.rate()
	hi, lo := deficit(tokens, frac, l.Capacity, per)
	return ceilDiv(hi, lo, n)
}

// Full reports whether b holds exactly l's capacity (call Refill first to
// judge it at a given instant). A full bucket is indistinguishable from a
// bucket created afresh, which is what makes dropping it safe.
func (b Bucket) Full(l Limit) bool {
	return b.Tokens >= l.Capacity
}

// Clamp lowers the balance to capacity tokens if it is above; it raises it
// only to -capacity, the floor of a debt, if it is below. Raising a limit
// therefore tops nobody up, and a debt is kept.
func (b *Bucket) Clamp(capacity int64) {
	frac := uint64(b.Frac)
	clampLevel(&b.Tokens, &frac, capacity)
	b.Frac = uint32(frac)
}

// Credit gives tokens (>= 1) back to b, capped at l's capacity: the exact
// refund of a cost that was over-estimated. Call Refill first, so the credit
// lands at a known instant. Fractional credit is kept; a debt is repaid
// first.
func (b *Bucket) Credit(l Limit, tokens int64) {
	if uint64(tokens) >= headroom(b.Tokens, l.Capacity) {
		b.Tokens, b.Frac = l.Capacity, 0
		return
	}
	b.Tokens += tokens
}

// Cutover converts b from old to next at the cutover instant at: refill under
// old up to at, move the fraction to next's unit if the period changes
// (rounding down: see Level.Convert), then clamp to next's capacity, and a
// debt to next's floor (see Clamp). From
// then on b refills under next. It requires at >= b.Last, and both periods
// compact.
func (b *Bucket) Cutover(old, next Limit, at int64) {
	b.Refill(old, at)
	if po, pn := old.period(), next.period(); po != pn {
		b.Frac = uint32(convertFrac(uint64(b.Frac), po, pn))
	}
	b.Clamp(next.Capacity)
}

// deficit returns target*per minus the balance tokens*per + frac as a
// 128-bit value; it requires tokens < target, or tokens == target with
// frac == 0, and tokens >= -MaxInt64 (any balance, debts included).
func deficit(tokens int64, frac uint64, target int64, per uint64) (hi, lo uint64) {
	hi, lo = bits.Mul64(headroom(tokens, target), per)
	lo, borrow := bits.Sub64(lo, frac, 0)
	return hi - borrow, lo
}

// convertFrac moves a fraction of frac/from of a token to the unit 1/to,
// rounding down: floor(frac*to/from), < to when frac < from.
func convertFrac(frac, from, to uint64) uint64 {
	hi, lo := bits.Mul64(frac, to)
	q, _ := bits.Div64(hi, lo, from) // hi < from, as frac < from
	return q
}

// ceilDiv returns ceil((hi<<64 | lo) / d) for d >= 1, saturated at
// math.MaxInt64.
func ceilDiv(hi, lo, d uint64) int64 {
	if hi >= d { // the quotient needs more than 64 bits
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, d)
	if q >= math.MaxInt64 { // the ceiling is at least q: saturate before q++ can wrap
		return math.MaxInt64
	}
	if r != 0 {
		q++
	}
	return int64(q)
}
