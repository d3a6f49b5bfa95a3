package model

import (
	"maps"
	"math"
	"math/big"
	"strings"
	"time"

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

var (
	unitsPerToken = big.NewInt(policy.UnitsPerToken)
	maxInt64      = big.NewInt(math.MaxInt64)
)

// Bucket is one key's balance in units and the reading it was brought up to
// date at. Units is never shared between two Buckets.
type Bucket struct {
	Units *big.Int
	Last  int64
}

// Model is the whole engine as one sequential state machine. It is not safe
// for concurrent use and must not be copied (Clone makes an independent
// one); the zero Model is not usable, New makes one.
type Model struct {
	pol         policy.Policy
	maxKeys     int
	maxKeyBytes int
	buckets     map[string]Bucket
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
	return &Model{pol: p, maxKeys: maxKeys, maxKeyBytes: maxKeyBytes, buckets: map[string]Bucket{}}
}

// Clone returns a deep copy.
func (m *Model) Clone() *Model {
	c := *m
	c.buckets = make(map[string]Bucket, len(m.buckets))
	for k, b := range m.buckets {
		c.buckets[k] = Bucket{Units: new(big.Int).Set(b.Units), Last: b.Last}
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
// key is tracked. The Units are a copy.
func (m *Model) Bucket(key string) (Bucket, bool) {
	b, ok := m.buckets[key]
	if !ok {
		return Bucket{}, false
	}
	return Bucket{Units: new(big.Int).Set(b.Units), Last: b.Last}, true
}

// Allow decides one request at now. It checks, in this order, that the key
// is neither blank nor longer than the bound (ErrInvalidKey), that the cost
// is at least 1 (ErrInvalidCost) and at most the key's capacity
// (ErrCostExceedsCapacity), that now is not before the latest reading an
// operation succeeded at (ErrClockRegression), and that a new key finds room
// under the key bound (ErrKeyCapacity); an error changes nothing. A new key
// starts full at now. The bucket is refilled up to now, and the cost taken
// if the balance holds it; else the request is denied, with RetryAfter the
// time the missing units take to earn. The model is never closed and takes
// no context, so it has none of the engine's errors for those.
func (m *Model) Allow(now int64, key string, cost int64) (Decision, error) {
	if strings.TrimSpace(key) == "" || len(key) > m.maxKeyBytes {
		return Decision{}, ErrInvalidKey
	}
	lim := LimitOf(m.pol, key)
	if cost < 1 {
		return Decision{}, ErrInvalidCost
	}
	if cost > lim.Capacity {
		return Decision{}, ErrCostExceedsCapacity
	}
	if now < m.last {
		return Decision{}, ErrClockRegression
	}
	capacity := capUnits(lim)
	b, ok := m.buckets[key]
	if !ok {
		if len(m.buckets) >= m.maxKeys {
			return Decision{}, ErrKeyCapacity
		}
		b = Bucket{Units: new(big.Int).Set(capacity), Last: now}
	}
	b = refill(b, lim, now)
	need := tokens(cost)
	d := Decision{Version: m.pol.Version, Limit: lim.Capacity}
	if b.Units.Cmp(need) >= 0 {
		d.Allowed = true
		b.Units.Sub(b.Units, need)
	} else {
		d.RetryAfter = ceilDiv(new(big.Int).Sub(need, b.Units), lim.TokensPerSecond)
	}
	d.Remaining = new(big.Int).Quo(b.Units, unitsPerToken).Int64()
	d.ResetAfter = ceilDiv(new(big.Int).Sub(capacity, b.Units), lim.TokensPerSecond)
	m.buckets[key] = b
	m.last = now
	return d, nil
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

// EvictFull removes every bucket that is full once refilled up to now, and
// only those, and returns how many it removed. A now before the latest
// reading an operation succeeded at is ErrClockRegression, and evicts
// nothing.
func (m *Model) EvictFull(now int64) (int, error) {
	if now < m.last {
		return 0, ErrClockRegression
	}
	n := 0
	for k, b := range m.buckets {
		lim := LimitOf(m.pol, k)
		if refill(b, lim, now).Units.Cmp(capUnits(lim)) == 0 {
			delete(m.buckets, k)
			n++
		}
	}
	m.last = now
	return n, nil
}

// ReplacePolicy cuts over to next at now: every bucket is refilled under its
// key's old limit up to now, then clamped to the capacity the key resolves
// to under next, so a cutover never hands out tokens. The errors come in this
// order: next's own Validate error (which wraps policy.ErrInvalid), then
// ErrStalePolicy when expectedVersion is not the version in force or next's
// version is not above it, then ErrClockRegression; an error changes
// nothing.
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
		b = refill(b, LimitOf(m.pol, k), now)
		if newCap := capUnits(LimitOf(next, k)); b.Units.Cmp(newCap) > 0 {
			b.Units.Set(newCap)
		}
		m.buckets[k] = b
	}
	m.pol = next
	m.last = now
	return nil
}

// refill returns b brought up to now under l, in a new Bucket: a rate of r
// tokens per second earns r units per nanosecond (a token is
// policy.UnitsPerToken units), the balance never exceeds the capacity, and a
// reading at or before b.Last earns nothing.
func refill(b Bucket, l policy.Limit, now int64) Bucket {
	units := new(big.Int).Set(b.Units)
	if now > b.Last {
		earned := new(big.Int).Mul(big.NewInt(now-b.Last), big.NewInt(l.TokensPerSecond))
		units.Add(units, earned)
		if c := capUnits(l); units.Cmp(c) > 0 {
			units.Set(c)
		}
		return Bucket{Units: units, Last: now}
	}
	return Bucket{Units: units, Last: b.Last}
}

func capUnits(l policy.Limit) *big.Int { return tokens(l.Capacity) }

// LimitOf is the limit p gives key, by policy's override rule written
// independently of policy's resolver: an override whose Match is
// key; else the first override, in declaration order, whose Match contains
// '*' and matches key, each '*' standing for any run of bytes; else p's
// default.
func LimitOf(p policy.Policy, key string) policy.Limit {
	overrides := p.Overrides.Overrides()
	for _, o := range overrides {
		if o.Match == key && !strings.Contains(o.Match, "*") {
			return policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond}
		}
	}
	for _, o := range overrides {
		if strings.Contains(o.Match, "*") && globMatch(o.Match, key) {
			return policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond}
		}
	}
	return p.Limit()
}

// globMatch matches key against pattern by plain backtracking, byte by
// byte: a '*' tries every run of key, everything else must equal.
func globMatch(pattern, key string) bool {
	if pattern == "" {
		return key == ""
	}
	if pattern[0] == '*' {
		for i := 0; i <= len(key); i++ {
			if globMatch(pattern[1:], key[i:]) {
				return true
			}
		}
		return false
	}
	return key != "" && pattern[0] == key[0] && globMatch(pattern[1:], key[1:])
}

func tokens(n int64) *big.Int { return new(big.Int).Mul(big.NewInt(n), unitsPerToken) }

// ceilDiv returns ceil(x / d) nanoseconds, saturated at math.MaxInt64.
func ceilDiv(x *big.Int, d int64) time.Duration {
	q, r := new(big.Int).QuoRem(x, big.NewInt(d), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if q.Cmp(maxInt64) > 0 {
		return math.MaxInt64
	}
	return time.Duration(q.Int64())
}
