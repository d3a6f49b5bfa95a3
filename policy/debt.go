package policy

// A charge takes tokens from a band without a decision: it is never denied,
// and the balance may fall below zero, a debt that later requests repay
// before any of them is admitted (a request still needs the whole of its
// cost in the balance). A band's balance never falls below minus its own
// capacity, its floor: a charge that would go further leaves the band at
// the floor and the rest is forgiven. Nothing is rounded: a debt is exact
// in units.
//
// # Representation and range
//
// A debt is a balance of Tokens*P + Frac units with Tokens negative and, as
// always, 0 <= Frac < P: Tokens is floor(units / P), so -0.25 tokens is
// Tokens -1 and Frac 3P/4. A band of capacity C holds -C <= Tokens <= C,
// and Tokens is -C only with the balance at or above the floor -C*P. Every
// step stays in range over every int64 capacity C (1 to 2^63-1), every
// period P and every rate N (1 to 2^63-1), every cost or charge (1 to
// 2^63-1) and every elapsed time (0 to 2^63-1):
//
//   - Tokens fits int64: -C >= -(2^63-1) > math.MinInt64.
//   - target - Tokens, for a target of a capacity or a cost (<= 2^63-1),
//     is at most 2^63-1 + 2^63-1 = 2^64-2: it fits uint64, computed as the
//     difference of the two words modulo 2^64 (headroom), which is exact
//     since the true value lies in [0, 2^64).
//   - a deficit, (target - Tokens)*P - Frac, is below 2^64 * 2^63 = 2^127:
//     it fits the 128 bits of bits.Mul64, and ceilDiv saturates a quotient
//     that does not fit 63 bits.
//   - a refill adds elapsed*N < 2^126 units; when that is short of the
//     deficit to the capacity, (elapsed*N + Frac) / P is below C - Tokens
//     <= 2^64-2, so bits.Div64's high word is below P and the quotient and
//     the new Tokens (below C) fit.
//   - a charge compares tokens with Tokens + C, in [0, 2^64-2] the same
//     way, and only subtracts when the result is >= -C.
//   - a credit compares tokens with C - Tokens, in [0, 2^64-2].
//   - a cutover's fraction floor(Frac*Pnext/Pold) is below Pnext, and the
//     clamp to [-Cnext, Cnext] only moves Tokens toward zero.

// headroom returns target - tokens, for tokens <= target and tokens >=
// -math.MaxInt64: at most 2^64-2, exact in uint64 (see above).
func headroom(tokens, target int64) uint64 { return uint64(target) - uint64(tokens) }

// clampLevel brings a balance of tokens whole tokens and frac units into
// [-capacity, capacity] tokens: above the capacity it is the capacity,
// below the floor it is the floor. It never moves a balance in between.
func clampLevel(tokens *int64, frac *uint64, capacity int64) {
	switch {
	case *tokens >= capacity:
		*tokens, *frac = capacity, 0
	case *tokens < -capacity:
		*tokens, *frac = -capacity, 0
	}
}

// chargeTokens takes n (>= 1) tokens from a balance of tokens whole tokens
// and frac units of a band of the given capacity, down to the floor.
func chargeTokens(tokens *int64, frac *uint64, capacity, n int64) {
	// The balance minus n tokens is below -capacity*P exactly when tokens
	// - n < -capacity, since 0 <= frac < P: when n > tokens + capacity.
	if uint64(n) > headroom(-capacity, *tokens) {
		*tokens, *frac = -capacity, 0
		return
	}
	*tokens -= n // >= -capacity
}

// Charge takes tokens (>= 1) from v under l, whatever its balance, down to
// the floor of minus l's capacity; what would go below it is forgiven.
// The fraction is kept. Refill v to the instant of the charge first.
func (v *Level) Charge(l Limit, tokens int64) {
	chargeTokens(&v.Tokens, &v.Frac, l.Capacity, tokens)
}

// Charge refills b to now under l and takes tokens (>= 1) from it, down to
// the floor of minus l's capacity (see Level.Charge). It requires now >=
// b.Last. The Outcome is allowed, with Remaining the whole tokens left
// (floored, negative in debt) and ResetAfter the time to repay any debt and
// refill to the capacity.
func (b *Bucket) Charge(l Limit, now, tokens int64) Outcome {
	b.Refill(l, now)
	frac := uint64(b.Frac)
	chargeTokens(&b.Tokens, &frac, l.Capacity, tokens)
	b.Frac = uint32(frac)
	return Outcome{Allowed: true, Remaining: b.Tokens, ResetAfter: resetAfter(b.Tokens, frac, l)}
}

// ChargeLevels takes tokens (>= 1) from every band of sh, lv[i] being band
// i, already refilled to the instant of the charge: each band down to its
// own floor (see Level.Charge). Any tokens >= 1 will do, above any capacity.
//
// It returns the band with the fewest whole tokens left (ties to the lowest
// index, the primary first) and an allowed Outcome describing it, as
// DecideLevels describes an admitted request.
func ChargeLevels(sh Shape, lv []Level, tokens int64) (Outcome, int) {
	for i := range lv {
		lv[i].Charge(sh.Band(i), tokens)
	}
	return bindingOutcome(sh, lv, tokens, true)
}
