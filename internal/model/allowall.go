package model

import "math/big"

// MaxAllowAll is the most requests one AllowAll may carry: the engine's
// bound, written again so the model imports nothing above policy;
// internal/enginemodel's tests hold the two equal.
const MaxAllowAll = 64

// AllowAll decides reqs as one at now: they are admitted only if every
// request's key holds its cost, and then every cost is taken; otherwise
// nothing is taken from any key. Requests for one key add up: their costs
// are summed, exactly.
//
// Each key's answer is the one Allow would give for its summed cost at now,
// Band and all (for an admitted call, with the cost taken). The Decision is
// that of the binding request, whose index in reqs the int gives: when
// denied, the request whose key waits longest (the greatest RetryAfter);
// when admitted, the request whose key has the fewest whole tokens left
// (the least Remaining); ties go to the first such request. Allowed is the
// call's verdict.
//
// Errors, with the zero Decision, the index of the request at fault (-1 for
// none) and nothing changed, in this order: ErrAllowAllSize for no requests
// or more than MaxAllowAll; ErrInvalidKey for the first request with a bad
// key; ErrInvalidCost for the first cost below 1; then, over all requests,
// ErrCostExceedsCapacity for the first key (by its first request) whose
// summed cost is above the capacity of a band of its limit, at its first
// request; ErrClockRegression for a now before the latest reading an
// operation succeeded at, at index 0 (the model has one observed time: see
// the package doc); ErrKeyCapacity when the key bound has no room for every
// new key at once, at the first request of the first new key past the room,
// new keys taken in the order of their first requests.
//
// That last index is the engine's with one shard. An engine with several
// reserves room shard by shard in the order of their numbers, which the
// model does not know, so its index is that of some new key's first
// request.
//
// A new key starts with every band full at now, and is created only if the
// call is admitted. A call that is decided, admitted or not, has observed
// now.
func (m *Model) AllowAll(now int64, reqs []Request) (Decision, int, error) {
	if len(reqs) == 0 || len(reqs) > MaxAllowAll {
		return Decision{}, -1, ErrAllowAllSize
	}
	for i, r := range reqs {
		if !m.validKey(r.Key) {
			return Decision{}, i, ErrInvalidKey
		}
	}
	for i, r := range reqs {
		if r.Cost < 1 {
			return Decision{}, i, ErrInvalidCost
		}
	}
	// The call's keys in the order of their first requests, each with its
	// costs summed.
	type part struct {
		key   string
		first int      // the index of the key's first request
		sum   *big.Int // exact: a sum may pass math.MaxInt64
		bands []band
		b     bucket // decided: the cost taken if the key holds it
		d     Decision
	}
	var parts []*part
	byKey := map[string]*part{}
	of := make([]*part, len(reqs)) // of[i]: reqs[i]'s key
	for i, r := range reqs {
		p := byKey[r.Key]
		if p == nil {
			p = &part{key: r.Key, first: i, sum: new(big.Int), bands: bandsOf(m.pol, r.Key)}
			byKey[r.Key] = p
			parts = append(parts, p)
		}
		p.sum.Add(p.sum, big.NewInt(r.Cost))
		of[i] = p
	}
	for _, p := range parts {
		for _, bd := range p.bands {
			if p.sum.Cmp(big.NewInt(bd.capacity)) > 0 {
				return Decision{}, p.first, ErrCostExceedsCapacity
			}
		}
	}
	if now < m.last {
		return Decision{}, 0, ErrClockRegression
	}
	room := m.maxKeys - len(m.buckets)
	for _, p := range parts {
		if _, ok := m.buckets[p.key]; !ok {
			if room <= 0 {
				return Decision{}, p.first, ErrKeyCapacity
			}
			room--
		}
	}
	admit := true
	for _, p := range parts {
		b, ok := m.buckets[p.key]
		if ok {
			b = b.clone()
		} else {
			b = full(p.bands, now)
		}
		refill(p.bands, &b, now)
		cost := p.sum.Int64() // within a capacity: it fits
		allowed := holds(b, cost)
		if allowed {
			take(b, cost)
		}
		p.b, p.d = b, m.answer(p.bands, b, cost, allowed)
		admit = admit && allowed
	}
	at := 0
	for i := 1; i < len(reqs); i++ {
		d, best := of[i].d, of[at].d
		if (admit && d.Remaining < best.Remaining) || (!admit && d.RetryAfter > best.RetryAfter) {
			at = i
		}
	}
	if admit {
		for _, p := range parts {
			m.buckets[p.key] = p.b
		}
	}
	m.last = now
	d := of[at].d
	d.Allowed = admit
	return d, at, nil
}

// Peek answers a request of one token for key at now, taking nothing and
// creating nothing: Allowed and RetryAfter say whether such a request would
// pass and when it could, the binding band chosen as for Allow. A key not
// tracked reports every band full. Errors: ErrInvalidKey, then
// ErrClockRegression. Peek observes no reading: as the engine's, it leaves
// the latest one an operation succeeded at as it was.
func (m *Model) Peek(now int64, key string) (Decision, error) {
	if !m.validKey(key) {
		return Decision{}, ErrInvalidKey
	}
	if now < m.last {
		return Decision{}, ErrClockRegression
	}
	bands := bandsOf(m.pol, key)
	b, ok := m.buckets[key]
	if ok {
		b = b.clone()
		refill(bands, &b, now)
	} else {
		b = full(bands, now)
	}
	return m.answer(bands, b, 1, holds(b, 1)), nil
}

// Refund credits tokens back to key at now: every band is refilled up to
// now, then earns tokens, exactly, capped at its capacity. It answers as
// Peek does with the balance after the refund. It never creates a key: a
// key not tracked changes nothing and is answered as Peek answers it (and,
// as Peek, observes no reading). Errors: ErrInvalidKey, ErrInvalidCost for
// tokens below 1, then ErrClockRegression.
func (m *Model) Refund(now int64, key string, tokens int64) (Decision, error) {
	if !m.validKey(key) {
		return Decision{}, ErrInvalidKey
	}
	if tokens < 1 {
		return Decision{}, ErrInvalidCost
	}
	b, ok := m.buckets[key]
	if !ok || now < m.last {
		return m.Peek(now, key)
	}
	bands := bandsOf(m.pol, key)
	b = b.clone()
	refill(bands, &b, now)
	credit := new(big.Rat).SetInt64(tokens)
	for i, bd := range bands {
		t := b.bands[i]
		t.Add(t, credit)
		if c := new(big.Rat).SetInt64(bd.capacity); t.Cmp(c) > 0 {
			t.Set(c)
		}
	}
	m.buckets[key] = b
	m.last = now
	return m.answer(bands, b, 1, holds(b, 1)), nil
}
