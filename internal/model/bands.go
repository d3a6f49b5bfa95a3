package model

import (
	"math"
	"math/big"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/policy"
)

// band is one band of a key's limit as the model reads it: a name, a
// capacity, and a rate of tokens every per ns.
type band struct {
	name     string
	capacity int64
	tokens   int64
	per      int64
}

func bandOf(name string, l policy.Limit) band {
	r := l.Rate()
	return band{name: name, capacity: l.Capacity, tokens: r.Tokens, per: int64(r.Per)}
}

// bandsOf lists the bands of the limit p gives key: the primary first, named
// by the override that gives it (or "" for the policy's own), then the
// bands of its BandSet in order.
func bandsOf(p policy.Policy, key string) []band {
	sh := ShapeOf(p, key)
	bands := []band{bandOf(sh.Name, sh.Primary)}
	for i := range sh.Bands.Len() {
		b := sh.Bands.At(i)
		bands = append(bands, bandOf(b.Name, policy.Limit{Capacity: b.Capacity, Refill: b.Refill}))
	}
	return bands
}

// indexOf returns the index of the band named name among bands[1:], or -1:
// the bands a cutover matches by name (the primary is matched with the
// primary, whatever its name).
func indexOf(bands []band, name string) int {
	for i := 1; i < len(bands); i++ {
		if bands[i].name == name {
			return i
		}
	}
	return -1
}

// wait is the time until a balance of t tokens holds target tokens at b's
// rate: ceil((target - t) x per / tokens) ns, 0 if it already does,
// saturated at math.MaxInt64.
func (b band) wait(t *big.Rat, target int64) time.Duration {
	missing := new(big.Rat).Sub(new(big.Rat).SetInt64(target), t)
	if missing.Sign() <= 0 {
		return 0
	}
	ns := missing.Mul(missing, big.NewRat(b.per, b.tokens))
	q := ceil(ns)
	if q.Cmp(maxInt64) > 0 {
		return math.MaxInt64
	}
	return time.Duration(q.Int64())
}

var maxInt64 = big.NewInt(math.MaxInt64)

// floor returns the greatest integer at most x, a debt's included.
func floor(x *big.Rat) *big.Int { return new(big.Int).Div(x.Num(), x.Denom()) } // Euclidean: floor, as Denom > 0

// ceil returns the least integer at least x.
func ceil(x *big.Rat) *big.Int {
	q, m := new(big.Int).DivMod(x.Num(), x.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// ShapeOf is the whole limit p gives key, by policy's override rule written
// independently of policy's resolver: an override whose Match is key; else
// the first override, in declaration order, whose Match contains '*' and
// matches key, each '*' standing for any run of bytes; else p's own limit.
// An override's limit is its primary band (named by its Name) and its own
// Bands; p's own is p's primary band, named "", and p's Bands.
func ShapeOf(p policy.Policy, key string) policy.Shape {
	if o, ok := overrideFor(p, key); ok {
		return policy.Shape{
			Name:    o.Name,
			Primary: policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill},
			Bands:   o.Bands,
		}
	}
	return policy.Shape{Primary: p.Limit(), Bands: p.Bands}
}

// LimitOf is the primary band of the limit p gives key (ShapeOf).
func LimitOf(p policy.Policy, key string) policy.Limit { return ShapeOf(p, key).Primary }

// overrideFor returns the override that gives key its limit under p, if any.
func overrideFor(p policy.Policy, key string) (policy.Override, bool) {
	overrides := p.Overrides.Overrides()
	for _, o := range overrides {
		if o.Match == key && !strings.Contains(o.Match, "*") {
			return o, true
		}
	}
	for _, o := range overrides {
		if strings.Contains(o.Match, "*") && globMatch(o.Match, key) {
			return o, true
		}
	}
	return policy.Override{}, false
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
