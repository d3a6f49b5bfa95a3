package model

import (
	"fmt"
	"maps"
	"math/big"
	"strings"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/policy"
)

// The bounds New uses for a zero maxKeys or maxKeyBytes. They are the
// engine's defaults, written again so the model imports nothing above
// policy; internal/enginemodel's tests hold the two equal.
const (
	// DefaultMaxKeys is the key bound when New's maxKeys is 0.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxKeyBytes is the key length bound when New's maxKeyBytes is 0.
	DefaultMaxKeyBytes = 256
)

// Bucket is one key's balance, as last stored, and the reading it was
// brought up to date at. Nothing in it is shared with the model or with
// another Bucket.
type Bucket struct {
	// Units is the primary band's balance in units of its rate's period:
	// tokens x Per in ns, so for a rate per second a token is 1e9 units
	// (policy.UnitsPerToken). It is always a whole number (see Tokens).
	Units *big.Int
	// Last is the reading the bucket was brought up to date at.
	Last int64
	// Tokens is every band's balance in tokens, exactly: Tokens[i] is band
	// i of the key's shape under the policy in force (ShapeOf), the
	// primary first, so Tokens[0] is Units / Per.
	//
	// A band of rate N per P ns only ever holds a multiple of 1/P tokens:
	// it starts at its whole capacity, a refill adds elapsed x N/P, a
	// decision or a charge takes whole tokens, the cap and the floor are
	// whole, and a cutover that changes the period rounds the balance down
	// to a multiple of the new 1/P. A balance may be negative, a debt (see
	// Charge), down to minus the band's capacity.
	Tokens []*big.Rat
}

// bucket is the model's record of one key: the balance of each band of the
// key's shape, in tokens, the primary first, and the reading they were all
// brought up to date at.
type bucket struct {
	bands []*big.Rat
	last  int64
}

func (b bucket) clone() bucket {
	c := bucket{bands: make([]*big.Rat, len(b.bands)), last: b.last}
	for i, t := range b.bands {
		c.bands[i] = new(big.Rat).Set(t)
	}
	return c
}

// Model is the whole engine as one sequential state machine. It is not safe
// for concurrent use and must not be copied (Clone makes an independent
// one); the zero Model is not usable, New makes one.
type Model struct {
	pol         policy.Policy
	maxKeys     int
	maxKeyBytes int
	buckets     map[string]bucket
	last        int64 // latest reading a successful operation observed
}

// New returns an empty model serving p, tracking at most maxKeys keys of at
// most maxKeyBytes bytes. Zero maxKeys and maxKeyBytes take DefaultMaxKeys
// and DefaultMaxKeyBytes.
func New(p policy.Policy, maxKeys, maxKeyBytes int) *Model {
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeys
	}
	if maxKeyBytes == 0 {
		maxKeyBytes = DefaultMaxKeyBytes
	}
	return &Model{pol: p, maxKeys: maxKeys, maxKeyBytes: maxKeyBytes, buckets: map[string]bucket{}}
}

// Clone returns a deep copy.
func (m *Model) Clone() *Model {
	c := *m
	c.buckets = make(map[string]bucket, len(m.buckets))
	for k, b := range m.buckets {
		c.buckets[k] = b.clone()
	}
	return &c
}

// Policy returns the policy in force.
func (m *Model) Policy() policy.Policy { return m.pol }

// KeyCount returns the number of tracked keys.
func (m *Model) KeyCount() int { return len(m.buckets) }

// Keys returns the tracked keys, in no particular order.
func (m *Model) Keys() []string {
	keys := make([]string, 0, len(m.buckets))
	for k := range maps.Keys(m.buckets) {
		keys = append(keys, k)
	}
	return keys
}

// Bucket returns key's bucket as last stored (not refilled), and whether the
// key is tracked. It is a copy.
func (m *Model) Bucket(key string) (Bucket, bool) {
	b, ok := m.buckets[key]
	if !ok {
		return Bucket{}, false
	}
	primary := bandsOf(m.pol, key)[0]
	units := new(big.Rat).Mul(b.bands[0], new(big.Rat).SetInt64(primary.per))
	if !units.IsInt() {
		panic(fmt.Sprintf("model: key %q: primary balance %v is not a whole unit of 1/%d", key, b.bands[0], primary.per))
	}
	out := Bucket{Units: new(big.Int).Set(units.Num()), Last: b.last, Tokens: make([]*big.Rat, len(b.bands))}
	for i, t := range b.bands {
		out.Tokens[i] = new(big.Rat).Set(t)
	}
	return out, true
}

// Allow decides one request at now. It checks, in this order, that the key
// is neither blank nor longer than the bound (ErrInvalidKey), that the cost
// is at least 1 (ErrInvalidCost) and at most the capacity of every band of
// the key's limit (ErrCostExceedsCapacity), that now is not before the
// latest reading an operation succeeded at (ErrClockRegression), and that a
// new key finds room under the key bound (ErrKeyCapacity); an error changes
// nothing. A new key starts with every band full at now.
//
// Every band is refilled up to now. The request is allowed only if every
// band holds the cost, and then the cost is taken from every band; else it
// is denied and nothing is taken. The Decision describes the binding band
// (see binding). The model is never closed and takes no context, so it has
// none of the engine's errors for those.
func (m *Model) Allow(now int64, key string, cost int64) (Decision, error) {
	if !m.validKey(key) {
		return Decision{}, ErrInvalidKey
	}
	bands := bandsOf(m.pol, key)
	if cost < 1 {
		return Decision{}, ErrInvalidCost
	}
	for _, bd := range bands {
		if cost > bd.capacity {
			return Decision{}, ErrCostExceedsCapacity
		}
	}
	if now < m.last {
		return Decision{}, ErrClockRegression
	}
	b, ok := m.buckets[key]
	if ok {
		b = b.clone()
	} else {
		if len(m.buckets) >= m.maxKeys {
			return Decision{}, ErrKeyCapacity
		}
		b = full(bands, now)
	}
	refill(bands, &b, now)
	allowed := holds(b, cost)
	if allowed {
		take(b, cost)
	}
	d := m.answer(bands, b, cost, allowed)
	m.buckets[key] = b
	m.last = now
	return d, nil
}

// Charge takes tokens from key at now without a decision: it is never
// denied for lack of tokens. It checks, in this order, that the key is
// neither blank nor longer than the bound (ErrInvalidKey), that tokens is at
// least 1 (ErrInvalidCost; no bound above: a cost known after the work may
// exceed every capacity), that now is not before the latest reading an
// operation succeeded at (ErrClockRegression), and that a new key finds
// room under the key bound (ErrKeyCapacity); an error changes nothing. A
// new key starts with every band full at now, and is then charged.
//
// Every band is refilled up to now, then loses tokens, down to minus its
// capacity at most (its floor); what would go below the floor is forgiven.
// The Decision is allowed and describes the band with the fewest whole
// tokens left (ties to the lowest index): Remaining is floored and may be
// negative, ResetAfter is the time to repay the debt and refill to full,
// RetryAfter is 0.
func (m *Model) Charge(now int64, key string, tokens int64) (Decision, error) {
	if !m.validKey(key) {
		return Decision{}, ErrInvalidKey
	}
	if tokens < 1 {
		return Decision{}, ErrInvalidCost
	}
	if now < m.last {
		return Decision{}, ErrClockRegression
	}
	bands := bandsOf(m.pol, key)
	b, ok := m.buckets[key]
	if ok {
		b = b.clone()
	} else {
		if len(m.buckets) >= m.maxKeys {
			return Decision{}, ErrKeyCapacity
		}
		b = full(bands, now)
	}
	refill(bands, &b, now)
	n := new(big.Rat).SetInt64(tokens)
	for i, bd := range bands {
		t := b.bands[i]
		t.Sub(t, n)
		if f := new(big.Rat).SetInt64(-bd.capacity); t.Cmp(f) < 0 {
			t.Set(f)
		}
	}
	d := m.answer(bands, b, 1, true)
	m.buckets[key] = b
	m.last = now
	return d, nil
}

// validKey reports whether key is neither blank nor longer than the bound.
func (m *Model) validKey(key string) bool {
	return strings.TrimSpace(key) != "" && len(key) <= m.maxKeyBytes
}

// holds reports whether every band of b holds cost tokens.
func holds(b bucket, cost int64) bool {
	need := new(big.Rat).SetInt64(cost)
	for _, t := range b.bands {
		if t.Cmp(need) < 0 {
			return false
		}
	}
	return true
}

// take takes cost tokens from every band of b, in place.
func take(b bucket, cost int64) {
	need := new(big.Rat).SetInt64(cost)
	for _, t := range b.bands {
		t.Sub(t, need)
	}
}

// answer is the Decision for a request of cost on b, already decided
// (allowed, and then already taken): it describes the binding band.
func (m *Model) answer(bands []band, b bucket, cost int64, allowed bool) Decision {
	at := binding(bands, b, cost, allowed)
	bd, t := bands[at], b.bands[at]
	d := Decision{
		Allowed:    allowed,
		Remaining:  floor(t).Int64(),
		Version:    m.pol.Version,
		Limit:      bd.capacity,
		ResetAfter: bd.wait(t, bd.capacity),
		Band:       decision.NameOf(bd.name),
	}
	if !allowed {
		d.RetryAfter = bd.wait(t, cost)
	}
	return d
}

// binding returns the index of the band a decision describes, b being
// already decided. On a denial it is the band with the longest wait until it
// holds cost (the wait as reported: rounded up to the nanosecond and
// saturated); when allowed, the band with the fewest whole tokens left. Ties
// go to the lowest index: the primary first, then the bands in order.
func binding(bands []band, b bucket, cost int64, allowed bool) int {
	at := 0
	if allowed {
		least := floor(b.bands[0])
		for i := 1; i < len(bands); i++ {
			if f := floor(b.bands[i]); f.Cmp(least) < 0 {
				at, least = i, f
			}
		}
		return at
	}
	longest := bands[0].wait(b.bands[0], cost)
	for i := 1; i < len(bands); i++ {
		if w := bands[i].wait(b.bands[i], cost); w > longest {
			at, longest = i, w
		}
	}
	return at
}

// AllowBatch decides reqs at now, one by one in order, each exactly as Allow
// would: that is what a batch means. A request's error is in its Result and
// touches no other request.
func (m *Model) AllowBatch(now int64, reqs []Request) []Result {
	out := make([]Result, len(reqs))
	for i, r := range reqs {
		d, err := m.Allow(now, r.Key, r.Cost)
		out[i] = Result{Decision: d, Err: err}
	}
	return out
}

// EvictFull removes every bucket whose bands are all full once refilled up
// to now, and only those, and returns how many it removed. A now before the
// latest reading an operation succeeded at is ErrClockRegression, and evicts
// nothing.
func (m *Model) EvictFull(now int64) (int, error) {
	if now < m.last {
		return 0, ErrClockRegression
	}
	n := 0
	for k := range m.buckets {
		if m.evictIfFull(now, k) {
			n++
		}
	}
	m.last = now
	return n, nil
}

// EvictIfFull is EvictFull's work on key alone: it removes key's bucket if
// every band is full once refilled up to now, and reports whether it did. A
// key not tracked is not removed; a now before the latest reading an
// operation succeeded at is ErrClockRegression, and evicts nothing. An
// engine sweeps shard by shard, each key at an instant of its own, so a
// caller checking a concurrent sweep needs its passes one key at a time.
func (m *Model) EvictIfFull(now int64, key string) (bool, error) {
	if now < m.last {
		return false, ErrClockRegression
	}
	evicted := m.evictIfFull(now, key)
	m.last = now
	return evicted, nil
}

func (m *Model) evictIfFull(now int64, key string) bool {
	b, ok := m.buckets[key]
	if !ok {
		return false
	}
	bands := bandsOf(m.pol, key)
	b = b.clone()
	refill(bands, &b, now)
	for i, bd := range bands {
		if b.bands[i].Cmp(new(big.Rat).SetInt64(bd.capacity)) != 0 {
			return false
		}
	}
	delete(m.buckets, key)
	return true
}

// ReplacePolicy cuts over to next at now. Every bucket is refilled under its
// key's old limit up to now, then carried band by band to the limit the key
// resolves to under next: the primary band takes over the primary's
// balance, and each other band the balance of the old limit's band of the
// same name (the old primary is not a candidate). A carried balance whose
// band's period changes is rounded down to a whole unit of the new period
// (a multiple of 1/Per tokens; a debt toward more debt), the one rounding
// the contract allows, and is then clamped to the new capacity, never
// raised, and a debt to the new floor (minus the new capacity) if it is
// deeper; a band new in next starts full, and a band next does not have is
// dropped. So a cutover never hands
// out tokens, except through a new band, which only ever restricts.
//
// The errors come in this order: next's own Validate error (which wraps
// policy.ErrInvalid), then ErrStalePolicy when expectedVersion is not the
// version in force or next's version is not above it, then
// ErrClockRegression; an error changes nothing.
func (m *Model) ReplacePolicy(now int64, next policy.Policy, expectedVersion int64) error {
	if err := next.Validate(); err != nil {
		return err
	}
	if expectedVersion != m.pol.Version || next.Version <= m.pol.Version {
		return ErrStalePolicy
	}
	if now < m.last {
		return ErrClockRegression
	}
	for k, b := range m.buckets {
		old, nw := bandsOf(m.pol, k), bandsOf(next, k)
		refill(old, &b, now)
		carried := bucket{bands: make([]*big.Rat, len(nw)), last: b.last}
		for i, bd := range nw {
			j := 0
			if i > 0 {
				j = indexOf(old, bd.name)
			}
			if j < 0 {
				carried.bands[i] = new(big.Rat).SetInt64(bd.capacity)
				continue
			}
			t := new(big.Rat).Set(b.bands[j])
			if old[j].per != bd.per {
				units := floor(new(big.Rat).Mul(t, new(big.Rat).SetInt64(bd.per)))
				t.SetFrac(units, big.NewInt(bd.per))
			}
			if c := new(big.Rat).SetInt64(bd.capacity); t.Cmp(c) > 0 {
				t.Set(c)
			}
			if f := new(big.Rat).SetInt64(-bd.capacity); t.Cmp(f) < 0 {
				t.Set(f)
			}
			carried.bands[i] = t
		}
		m.buckets[k] = carried
	}
	m.pol = next
	m.last = now
	return nil
}

// full returns a bucket with every band at its capacity, at now.
func full(bands []band, now int64) bucket {
	b := bucket{bands: make([]*big.Rat, len(bands)), last: now}
	for i, bd := range bands {
		b.bands[i] = new(big.Rat).SetInt64(bd.capacity)
	}
	return b
}

// refill brings b up to now, in place: each band earns elapsed x Tokens/Per
// tokens, up to its capacity. A reading at or before b.last earns nothing.
func refill(bands []band, b *bucket, now int64) {
	if now <= b.last {
		return
	}
	elapsed := big.NewInt(now - b.last)
	for i, bd := range bands {
		earned := new(big.Int).Mul(elapsed, big.NewInt(bd.tokens))
		t := b.bands[i]
		t.Add(t, new(big.Rat).SetFrac(earned, big.NewInt(bd.per)))
		if c := new(big.Rat).SetInt64(bd.capacity); t.Cmp(c) > 0 {
			t.Set(c)
		}
	}
	b.last = now
}
