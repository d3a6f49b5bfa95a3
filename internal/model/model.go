// Package model is the sequential specification of tokenshard: DESIGN
// section 3 written in the simplest way that can be checked by eye, in
// math/big, with no sharding, no lazy conversion and no concurrency. The
// stress harness compares the engine with it (differential replay) and
// checks concurrent histories against it (linearizability); later work
// (per-key overrides, snapshots, a Redis store) reuses it.
//
// The model has one observed time for the whole engine. That equals the
// engine's per-shard observed times whenever the clock never steps back,
// which is how the harness drives it (clock.Manual); clock regressions are
// compared against an engine with one shard.
//
// Model is not safe for concurrent use. Clone returns an independent copy.
package model

import (
	"maps"
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
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

// Model is the whole engine as one sequential state machine.
type Model struct {
	pol         policy.Policy
	maxKeys     int
	maxKeyBytes int
	buckets     map[string]Bucket
	last        int64 // latest reading a successful operation observed
}

// New returns an empty model serving p, tracking at most maxKeys keys of at
// most maxKeyBytes bytes. Zero maxKeys and maxKeyBytes take the engine's
// defaults.
func New(p policy.Policy, maxKeys, maxKeyBytes int) *Model {
	if maxKeys == 0 {
		maxKeys = engine.DefaultMaxKeys
	}
	if maxKeyBytes == 0 {
		maxKeyBytes = engine.DefaultMaxKeyBytes
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

// Allow decides one request at now: DESIGN 3.2 steps 1, 4 to 8 (the model
// is never closed and has no context).
func (m *Model) Allow(now int64, key string, cost int64) (engine.Decision, error) {
	if strings.TrimSpace(key) == "" || len(key) > m.maxKeyBytes {
		return engine.Decision{}, engine.ErrInvalidKey
	}
	lim := LimitOf(m.pol, key)
	if cost < 1 {
		return engine.Decision{}, engine.ErrInvalidCost
	}
	if cost > lim.Capacity {
		return engine.Decision{}, engine.ErrCostExceedsCapacity
	}
	if now < m.last {
		return engine.Decision{}, engine.ErrClockRegression
	}
	capacity := capUnits(lim)
	b, ok := m.buckets[key]
	if !ok {
		if len(m.buckets) >= m.maxKeys {
			return engine.Decision{}, engine.ErrKeyCapacity
		}
		b = Bucket{Units: new(big.Int).Set(capacity), Last: now}
	}
	b = refill(b, lim, now)
	need := tokens(cost)
	d := engine.Decision{Version: m.pol.Version, Limit: lim.Capacity}
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

// AllowBatch decides reqs one by one at now, as DESIGN 3.6 defines a batch.
func (m *Model) AllowBatch(now int64, reqs []engine.Request) []engine.Result {
	out := make([]engine.Result, len(reqs))
	for i, r := range reqs {
		d, err := m.Allow(now, r.Key, r.Cost)
		out[i] = engine.Result{Decision: d, Err: err}
	}
	return out
}

// EvictFull removes every bucket that is full at now (DESIGN 3.7).
func (m *Model) EvictFull(now int64) (int, error) {
	if now < m.last {
		return 0, engine.ErrClockRegression
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

// ReplacePolicy cuts over to next at now (DESIGN 3.8): every bucket is
// refilled under its key's old limit up to now, then clamped to the capacity
// the key resolves to under next.
func (m *Model) ReplacePolicy(now int64, next policy.Policy, expectedVersion int64) error {
	if err := next.Validate(); err != nil {
		return err
	}
	if expectedVersion != m.pol.Version || next.Version <= m.pol.Version {
		return engine.ErrStalePolicy
	}
	if now < m.last {
		return engine.ErrClockRegression
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

// refill returns b brought up to now under l (DESIGN 3.1), in a new Bucket.
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

// LimitOf is the limit p gives key, by the rule of the override issue,
// written independently of policy's resolver: an override whose Match is
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
