package policy

import (
	"math"
	"math/bits"
)

// Bucket is one key's balance: Tokens whole tokens plus Frac units
// (0 <= Frac < UnitsPerToken), brought up to date at clock reading Last.
//
// The balance in units is Tokens*UnitsPerToken + Frac; it never exceeds the
// capacity of the Limit it is used with, so Tokens == Capacity implies
// Frac == 0. Splitting whole tokens from the fraction keeps the record at 24
// bytes while the balance itself needs up to 93 bits.
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

// Refill brings b up to date at now under l:
//
//	units = min(capacity*1e9, units + (now-Last)*rate); Last = now
//
// computed exactly in 128 bits. A now at or before Last changes nothing (time
// never runs backwards inside a bucket; the shard rejects such readings before
// they get here).
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
	addHi, addLo := bits.Mul64(elapsed, uint64(l.TokensPerSecond))
	defHi, defLo := deficit(b.Tokens, b.Frac, l.Capacity)
	if addHi > defHi || (addHi == defHi && addLo >= defLo) {
		b.Tokens, b.Frac = l.Capacity, 0
		return
	}
	// Here add < deficit, so Frac+add < (capacity-Tokens)*1e9 and the
	// quotient below fits in 64 bits (bits.Div64 needs hi < divisor).
	lo, carry := bits.Add64(addLo, uint64(b.Frac), 0)
	var q, r uint64
	if hi := addHi + carry; hi == 0 {
		// The usual case, in 64 bits: a division by a constant, which the
		// compiler turns into a multiplication, where bits.Div64 divides.
		q, r = lo/UnitsPerToken, lo%UnitsPerToken
	} else {
		q, r = bits.Div64(hi, lo, UnitsPerToken)
	}
	b.Tokens += int64(q)
	b.Frac = uint32(r)
}

// Take removes cost tokens if the balance holds them and reports whether it
// did. cost must be >= 1. The balance is untouched on denial, so fractional
// credit is never lost.
func (b *Bucket) Take(cost int64) bool {
	// units >= cost*1e9 exactly when the whole tokens alone cover cost,
	// because Frac < 1e9 and cost*1e9 is a whole number of tokens.
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
	if now > b.Last { // Refill's own test, saving the call for a key decided again at one reading
		b.Refill(l, now)
	}
	o := Outcome{Allowed: b.Take(cost)}
	// The fields, not the methods on a copy: copying a bucket just written
	// field by field reads it back in wider loads, which wait for the
	// stores to retire instead of taking their values.
	if !o.Allowed {
		o.RetryAfter = retryAfter(b.Tokens, b.Frac, l, cost)
	}
	o.Remaining = b.Tokens
	// resetAfter, written out: too large for the compiler to inline.
	if b.Tokens < l.Capacity {
		hi, lo := deficit(b.Tokens, b.Frac, l.Capacity)
		o.ResetAfter = ceilDiv(hi, lo, uint64(l.TokensPerSecond))
	}
	return o
}

// RetryAfter is the time, in ns, until b (as it stands) holds cost tokens at
// rate l.TokensPerSecond: ceil((cost*1e9 - units) / rate), 0 if it already
// does, saturated at math.MaxInt64. It is an estimate, not a reservation.
func (b Bucket) RetryAfter(l Limit, cost int64) int64 {
	return retryAfter(b.Tokens, b.Frac, l, cost)
}

func retryAfter(tokens int64, frac uint32, l Limit, cost int64) int64 {
	if tokens >= cost {
		return 0
	}
	hi, lo := deficit(tokens, frac, cost)
	return ceilDiv(hi, lo, uint64(l.TokensPerSecond))
}

// ResetAfter is the time, in ns, until b is full at rate l.TokensPerSecond:
// ceil((capacity*1e9 - units) / rate), 0 when full, saturated at
// math.MaxInt64.
func (b Bucket) ResetAfter(l Limit) int64 {
	return resetAfter(b.Tokens, b.Frac, l)
}

func resetAfter(tokens int64, frac uint32, l Limit) int64 {
	if tokens >= l.Capacity {
		return 0
	}
	hi, lo := deficit(tokens, frac, l.Capacity)
	return ceilDiv(hi, lo, uint64(l.TokensPerSecond))
}

// Full reports whether b holds exactly l's capacity (call Refill first to
// judge it at a given instant). A full bucket is indistinguishable from a
// bucket created afresh, which is what makes dropping it safe.
func (b Bucket) Full(l Limit) bool {
	return b.Tokens >= l.Capacity
}

// Clamp lowers the balance to capacity tokens if it is above; it never raises
// it. Raising a limit therefore tops nobody up.
func (b *Bucket) Clamp(capacity int64) {
	if b.Tokens >= capacity {
		b.Tokens, b.Frac = capacity, 0
	}
}

// Credit gives tokens (>= 1) back to b, capped at l's capacity: the exact
// refund of a cost that was over-estimated. Call Refill first, so the credit
// lands at a known instant. Fractional credit is kept.
func (b *Bucket) Credit(l Limit, tokens int64) {
	if tokens >= l.Capacity-b.Tokens { // no overflow: 0 <= Tokens <= Capacity
		b.Tokens, b.Frac = l.Capacity, 0
		return
	}
	b.Tokens += tokens
}

// Cutover converts b from old to next at the cutover instant at: refill under
// old up to at, then clamp to next's capacity. From then on b refills under
// next. It requires at >= b.Last.
func (b *Bucket) Cutover(old, next Limit, at int64) {
	b.Refill(old, at)
	b.Clamp(next.Capacity)
}

// deficit returns target*1e9 minus the balance tokens*1e9 + frac as a
// 128-bit value; it requires tokens < target, or tokens == target with
// frac == 0.
func deficit(tokens int64, frac uint32, target int64) (hi, lo uint64) {
	hi, lo = bits.Mul64(uint64(target-tokens), UnitsPerToken)
	lo, borrow := bits.Sub64(lo, uint64(frac), 0)
	return hi - borrow, lo
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
