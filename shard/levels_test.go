package shard

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// eagerBands is the reference for keys of any shape: every key's levels
// held in a map and converted at every cutover, at once, with policy's own
// band functions. State converts lazily, keeps compact keys in their Bucket
// and the others in its level store; the answers must be the same.
type eagerBands struct {
	pol  policy.Policy
	keys map[string]*eagerKey
	max  int
	last int64
}

type eagerKey struct {
	last int64
	sh   policy.Shape
	lv   []policy.Level
}

func (m *eagerBands) refill(k *eagerKey, now int64) {
	if now > k.last {
		policy.RefillLevels(k.sh, k.lv, now-k.last)
		k.last = now
	}
}

func (m *eagerBands) allow(now int64, key string, cost int64) msg.Reply {
	k, ok := m.keys[key]
	sh := m.pol.ShapeAt(m.pol.Overrides.Resolve(key))
	if ok {
		sh = k.sh
	}
	for i := range sh.Len() {
		if cost > sh.Band(i).Capacity {
			return msg.Reply{Err: msg.ErrCostExceedsCapacity}
		}
	}
	if now < m.last {
		return msg.Reply{Err: msg.ErrClockRegression}
	}
	if !ok {
		if len(m.keys) == m.max {
			return msg.Reply{Err: msg.ErrKeyCapacity}
		}
		k = &eagerKey{last: now, sh: sh, lv: make([]policy.Level, sh.Len())}
		for i := range k.lv {
			k.lv[i] = policy.FullLevel(sh.Band(i))
		}
		m.keys[key] = k
	}
	m.last = now
	m.refill(k, now)
	o, band := policy.DecideLevels(sh, k.lv, cost)
	return msg.Reply{Decision: decision.Decision{Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: time.Duration(o.RetryAfter),
		Version: m.pol.Version, Limit: sh.Band(band).Capacity, ResetAfter: time.Duration(o.ResetAfter), Band: decision.NameOf(sh.BandName(band))}}
}

func (m *eagerBands) peek(now int64, key string) msg.Reply {
	if now < m.last {
		return msg.Reply{Err: msg.ErrClockRegression}
	}
	k, ok := m.keys[key]
	var sh policy.Shape
	var lv []policy.Level
	if ok {
		sh = k.sh
		lv = append([]policy.Level(nil), k.lv...)
		if now > k.last {
			policy.RefillLevels(sh, lv, now-k.last)
		}
	} else {
		sh = m.pol.ShapeAt(m.pol.Overrides.Resolve(key))
		for i := range sh.Len() {
			lv = append(lv, policy.FullLevel(sh.Band(i)))
		}
	}
	o, band := policy.PeekLevels(sh, lv)
	return msg.Reply{Decision: decision.Decision{Allowed: o.Allowed, Remaining: o.Remaining, RetryAfter: time.Duration(o.RetryAfter),
		Version: m.pol.Version, Limit: sh.Band(band).Capacity, ResetAfter: time.Duration(o.ResetAfter), Band: decision.NameOf(sh.BandName(band))}}
}

func (m *eagerBands) refund(now int64, key string, n int64) msg.Reply {
	k, ok := m.keys[key]
	if !ok || now < m.last {
		return m.peek(now, key)
	}
	m.last = now
	m.refill(k, now)
	for i := range k.lv {
		k.lv[i].Credit(k.sh.Band(i), n)
	}
	return m.peek(now, key)
}

func (m *eagerBands) sweep(now int64) msg.SweepReply {
	if now < m.last {
		return msg.SweepReply{Err: msg.ErrClockRegression}
	}
	m.last = now
	n := 0
	for key, k := range m.keys {
		m.refill(k, now)
		if policy.FullLevels(k.sh, k.lv) {
			delete(m.keys, key)
			n++
		}
	}
	return msg.SweepReply{Evicted: n}
}

func (m *eagerBands) cutover(now int64, next policy.Policy) error {
	if now < m.last {
		return msg.ErrClockRegression
	}
	m.last = now
	for key, k := range m.keys {
		m.refill(k, now)
		sh := next.ShapeAt(next.Overrides.Resolve(key))
		out := make([]policy.Level, sh.Len())
		policy.CutoverLevels(k.sh, k.lv, sh, out)
		k.sh, k.lv = sh, out
	}
	m.pol = next
	return nil
}

// randomShapedPolicy draws a policy that is sometimes one compact band,
// sometimes a long period (kept in the level store), sometimes bands,
// sometimes with an override of its own bands: every kind of conversion
// between compact and stored keys occurs.
func randomShapedPolicy(t *testing.T, r *rand.Rand, version int64) policy.Policy {
	rate := func() (int64, policy.Rate) {
		switch r.IntN(4) {
		case 0:
			return 1 + r.Int64N(8), policy.Rate{}
		case 1:
			return 0, policy.Rate{Tokens: 1 + r.Int64N(10), Per: time.Duration(1 + r.Int64N(int64(3*time.Second)))}
		case 2:
			return 0, policy.Rate{Tokens: 1 + r.Int64N(100), Per: []time.Duration{time.Minute, time.Hour, 7 * time.Second}[r.IntN(3)]}
		}
		return 0, policy.Rate{Tokens: 1 + r.Int64N(3), Per: time.Duration(1 + r.Int64N(int64(10*time.Second)))}
	}
	bandSet := func() *policy.BandSet {
		names := []string{"a", "b", "c", "d"}
		r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		var bs []policy.Band
		for i := range r.IntN(4) {
			_, rt := rate()
			if rt.IsZero() {
				rt = policy.PerSecond(1 + r.Int64N(5))
			}
			bs = append(bs, policy.Band{Name: names[i], Capacity: 1 + r.Int64N(30), Refill: rt})
		}
		set, err := policy.NewBands(bs...)
		require.NoError(t, err)
		return set
	}
	p := policy.Policy{Version: version, Capacity: 1 + r.Int64N(25)}
	p.TokensPerSecond, p.Refill = rate()
	if r.IntN(2) == 0 {
		p.Bands = bandSet()
	}
	if r.IntN(2) == 0 {
		o := policy.Override{Match: "k1", Capacity: 1 + r.Int64N(25), Name: "vip"}
		o.TokensPerSecond, o.Refill = rate()
		if r.IntN(2) == 0 {
			o.Bands = bandSet()
		}
		set, err := policy.NewOverrideSet(o)
		require.NoError(t, err)
		p.Overrides = set
	}
	require.NoError(t, p.Validate())
	return p
}

// TestStateBandsMatchEager drives State and the eager reference with one
// random trace over keys of every shape: allows, peeks, refunds, drops,
// sweeps and cutovers between shapes. Every answer must match, and so must
// the invariants, the level store's included.
func TestStateBandsMatchEager(t *testing.T) {
	skipUnderRace(t)
	for seed := uint64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, seed*104729))
			start := randomShapedPolicy(t, r, 1)
			maxKeys := 3 + r.IntN(6)
			budget := NewBudget(int64(maxKeys))
			s := newState(NewLimits(start), budget, &testHasher)
			if seed%2 == 1 {
				s.tab.maxGroups = 1
			}
			defer s.abandon()
			m := &eagerBands{pol: start, keys: map[string]*eagerKey{}, max: maxKeys}
			now := int64(0)
			for step := range 2000 {
				now += []int64{0, 1, 333_333_333, int64(time.Second), int64(time.Minute), r.Int64N(int64(time.Hour))}[r.IntN(6)]
				if s.converting() && r.IntN(3) == 0 {
					s.convertSlice(1 + r.IntN(3))
				}
				key := fmt.Sprintf("k%d", r.IntN(maxKeys+2))
				where := fmt.Sprintf("seed %d step %d key %q at %d", seed, step, key, now)
				switch op := r.IntN(40); {
				case op == 0:
					require.Equal(t, m.sweep(now), sweepAll(s, now), "%s: sweep", where)
				case op < 3:
					next := randomShapedPolicy(t, r, m.pol.Version+1)
					require.NoError(t, m.cutover(now, next))
					require.NoError(t, s.prepare(now, NewLimits(next)))
					s.publish()
				case op < 6:
					var got msg.Reply
					s.peek(now, key, s.hasher.Sum(key), &got)
					require.Equal(t, m.peek(now, key), got, "%s: peek", where)
				case op < 8:
					n := 1 + r.Int64N(5)
					var got msg.Reply
					s.refund(now, key, s.hasher.Sum(key), n, &got)
					require.Equal(t, m.refund(now, key, n), got, "%s: refund %d", where, n)
				case op < 9:
					_, had := m.keys[key]
					delete(m.keys, key)
					require.Equal(t, had, s.Drop(key, s.hasher.Sum(key)), "%s: drop", where)
				default:
					cost := 1 + r.Int64N(8)
					require.Equal(t, m.allow(now, key, cost), s.allow(now, key, cost), "%s: allow %d", where, cost)
				}
				require.Equal(t, int64(len(m.keys)), budget.Count(), "%s: key count", where)
				s.checkInvariants(t, "%s", where)
			}
		})
	}
}
