package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// diffGen builds one trace, running the model alongside so it can aim at the
// instants that matter (exactly when a retry estimate or a reset falls due).
type diffGen struct {
	r      *rand.Rand
	cfg    diffConfig
	m      *enginemodel.Model
	t      int64
	keys   []string // the trace's working set, so keys repeat
	fresh  int
	marks  []int64    // instants named by recent answers
	shapes diffShapes // which limits the trace's policies may have
}

// diffShapes is what a trace's limits may be: rates per second only, as
// before rates of any period; Refill rates too, of awkward periods; or
// those and bands.
type diffShapes uint8

const (
	diffPerSecond diffShapes = iota
	diffRates
	diffBands
)

var (
	// The keys with a '*' cannot have an exact override (a Match with a star
	// is a pattern) but patterns match them, themselves included.
	diffGoodKeys  = []string{"a", "b", "k1", "k22", "key333", "ключ", "\u200b", " x", "x\t", "\xff", "\x7f", "a*b", "*", "k*1"}
	diffBlankKeys = []string{"", " ", "\t\n", "\u00a0", "\u3000", "\u0085 \u2028"}
)

// diffGenerate returns the trace of seed: a configuration drawn from
// shardCounts and the edge values, and about nops operations.
func diffGenerate(seed uint64, shardCounts []int, nops int) diffTrace {
	return diffGenerateFor(seed, shardCounts, nops, false)
}

// diffGenerateStore returns the Redis store's trace of seed: drawn as
// diffGenerate draws, with everything the store shares with the engine
// (overrides, edge capacities, rates, costs and instants, batches, cutover
// chains past the store's history, blank and over-long keys), but in the
// configuration whose meaning the store shares: no key bound (MaxKeys 0,
// whose default the model never reaches in a trace), a clock that never
// steps back, and one shard. The operations are drawn against the model in
// that configuration, so none depends on what was dropped.
func diffGenerateStore(seed uint64, nops int) diffTrace {
	return diffGenerateFor(seed, []int{1, 2, 16}, nops, true)
}

func diffGenerateFor(seed uint64, shardCounts []int, nops int, store bool) diffTrace {
	r := rand.New(rand.NewPCG(seed, 0x646966666572656e))
	g := &diffGen{r: r}
	cfg := &g.cfg
	cfg.shards = shardCounts[r.IntN(len(shardCounts))]
	if r.IntN(6) == 0 {
		cfg.regress, cfg.shards = true, 1 // the model has one observed time
	}
	switch r.IntN(4) {
	case 1:
		cfg.maxKeys = 1 + r.IntN(3)
	case 2:
		cfg.maxKeys = 3 + r.IntN(6)
	case 3:
		cfg.maxKeys = 100
	}
	if store {
		// Drawn above all the same, so the rest of the configuration is
		// drawn as diffGenerate draws it for the same seed.
		cfg.store, cfg.regress, cfg.maxKeys, cfg.shards = true, false, 0, 1
	}
	switch r.IntN(4) {
	case 2:
		cfg.maxKeyBytes = 1 + r.IntN(4)
	case 3:
		cfg.maxKeyBytes = 8
	}
	switch r.IntN(12) {
	case 7, 8, 9:
		cfg.start = r.Int64N(1 << 50)
	case 10:
		cfg.start = math.MaxInt64 - r.Int64N(1<<56)
	case 11:
		cfg.start = math.MaxInt64 - r.Int64N(100)
	}
	g.t = cfg.start
	version := int64(1)
	switch r.IntN(5) {
	case 3:
		version = 1 + r.Int64N(1e6)
	case 4:
		version = math.MaxInt64 - r.Int64N(3)
	}
	for _, i := range r.Perm(len(diffGoodKeys))[:1+r.IntN(5)] {
		g.keys = append(g.keys, diffGoodKeys[i])
	}
	// Half the traces keep to rates per second; a quarter draw Refill
	// rates of awkward periods as well, and a quarter bands too.
	g.shapes = []diffShapes{diffPerSecond, diffPerSecond, diffRates, diffBands}[r.IntN(4)]
	cfg.policy = policy.Policy{Version: version, Capacity: g.capacity(0)}
	cfg.policy.TokensPerSecond, cfg.policy.Refill = g.limitRate()
	cfg.policy.Bands = g.bandSet(nil, cfg.policy.Capacity)
	cfg.policy.Overrides = g.overrides(nil, cfg.policy.Limit())
	g.m = enginemodel.New(cfg.policy, cfg.maxKeys, cfg.maxKeyBytes)

	// Weights of allow, batch, short batch, evict, cutover, keys,
	// AllowAll, Peek, Refund, Charge and Snapshot; the cutover-heavy
	// profile runs past the shard's 64-generation history, and cuts over
	// keys in debt. The Redis store's target has no Snapshot (and on a
	// cluster its runner drops AllowAll). A snapshot is restored at the
	// reading it was taken at, so it needs a clock that never steps back
	// (the restored shards have all observed that reading; the model has
	// one observed time only for what it served).
	profiles := [][diffNumKinds]int{
		{45, 20, 2, 10, 10, 3, 15, 3, 6, 10, 2},
		{35, 15, 1, 35, 10, 4, 10, 2, 4, 8, 2},
		{15, 5, 1, 5, 70, 4, 5, 1, 2, 6, 1},
	}
	pi := r.IntN(len(profiles))
	prof := profiles[pi]
	if store || cfg.regress {
		prof[diffSnapshot] = 0
	}
	if pi == 2 {
		nops *= 2
	}
	total := 0
	for _, w := range prof {
		total += w
	}
	tr := diffTrace{seed: seed, cfg: *cfg}
	for range nops {
		g.step()
		x, kind := r.IntN(total), diffKind(0)
		for ; x >= prof[kind]; kind++ {
			x -= prof[kind]
		}
		tr.ops = append(tr.ops, g.op(kind))
	}
	return tr
}

// op builds one op of kind at g.t and applies it to the model.
func (g *diffGen) op(kind diffKind) diffOp {
	op := diffOp{kind: kind, t: g.t}
	switch kind {
	case diffAllow:
		op.key = g.key()
		op.cost = g.cost(op.key)
		d, err := g.m.Allow(g.t, op.key, op.cost)
		g.mark(d, err)
	case diffBatch:
		op.reqs = g.batch(g.r.IntN(9))
		if diffAmbiguous(g.m, g.cfg, op.reqs) {
			op.reqs = slices.DeleteFunc(op.reqs, func(q engine.Request) bool {
				_, ok := g.m.Bucket(q.Key)
				return !ok
			})
		}
		for _, res := range g.m.AllowBatch(g.t, op.reqs) {
			g.mark(res.Decision, res.Err)
		}
	case diffShortBatch:
		op.reqs = g.batch(1 + g.r.IntN(4))
	case diffAllowAll:
		op.reqs = g.allReqs()
		d, _, err := g.m.AllowAll(g.t, op.reqs)
		g.mark(d, err)
	case diffPeek:
		op.key = g.key()
		d, err := g.m.Peek(g.t, op.key)
		g.mark(d, err)
	case diffRefund:
		op.key = g.key()
		op.cost = g.cost(op.key)
		if g.r.IntN(2) == 0 {
			op.cost = 1 + g.r.Int64N(3)
		}
		d, err := g.m.Refund(g.t, op.key, op.cost)
		g.mark(d, err)
	case diffCharge:
		op.key = g.key()
		op.cost = g.chargeTokens(op.key)
		d, err := g.m.Charge(g.t, op.key, op.cost)
		g.mark(d, err)
	case diffSnapshot:
		// The model is its own snapshot: nothing changes.
	case diffEvict:
		_, _ = g.m.EvictFull(g.t)
	case diffCutover:
		g.cutover(&op)
		r := op.resolve(g.m.Policy().Version)
		_ = g.m.ReplacePolicy(g.t, r.next, r.expected)
	}
	return op
}

// step moves g.t: mostly by 0 or 1 ns, often to an instant a recent answer
// named (or 1 ns either side), to one token's refill time, sometimes far,
// rarely to math.MaxInt64; backwards now and then when the clock may regress.
func (g *diffGen) step() {
	r := g.r
	if g.cfg.regress && r.IntN(8) == 0 {
		switch r.IntN(3) {
		case 0:
			g.t--
		case 1:
			g.t -= r.Int64N(max(g.t, 1))
		default:
			g.t = 0
		}
		g.t = max(g.t, 0)
		return
	}
	var d int64
	switch r.IntN(16) {
	case 6:
		d = 1
	case 7, 8, 9:
		if len(g.marks) > 0 {
			at := diffAdd(g.marks[r.IntN(len(g.marks))], int64(r.IntN(3)-1))
			d = max(at-g.t, 0)
			if d > 1<<50 && r.IntN(8) != 0 {
				d = 0 // a far mark, often saturated: rarely, or the trace ends frozen there
			}
		}
	case 10:
		// The time one token of a band of a key takes: ceil(Per/Tokens),
		// or 1 ns less; rarely when that is far, or the trace ends frozen.
		sh := shapeOf(g.m.Policy(), g.keys[r.IntN(len(g.keys))])
		rate := sh.Band(r.IntN(sh.Len())).Rate()
		d = max((int64(rate.Per)-1)/rate.Tokens+1-int64(r.IntN(2)), 0)
		if d > 1<<50 && r.IntN(8) != 0 {
			d = 0
		}
	case 11:
		d = r.Int64N(2e9)
	case 12:
		d = r.Int64N(1 << 50)
	case 13:
		if r.IntN(64) == 0 {
			d = r.Int64N(math.MaxInt64)
		}
	case 14:
		if r.IntN(64) == 0 {
			d = math.MaxInt64
		}
	}
	g.t = diffAdd(g.t, d)
}

// diffAdd is a + b for b >= -1, saturated at math.MaxInt64 as Manual does.
func diffAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// mark remembers when a denied request could next be admitted and when the
// bucket is full again: the instants an off-by-one would show at.
func (g *diffGen) mark(d engine.Decision, err error) {
	if err != nil {
		return
	}
	for _, at := range []time.Duration{d.RetryAfter, d.ResetAfter} {
		if at > 0 {
			g.marks = append(g.marks, diffAdd(g.t, int64(at)))
		}
	}
	if len(g.marks) > 8 {
		g.marks = slices.Delete(g.marks, 0, len(g.marks)-8)
	}
}

// chargeTokens draws the tokens of a Charge on key: a few, about its least
// capacity, a multiple of it (past the floor of its bands), anything up to
// math.MaxInt64, or an invalid count.
func (g *diffGen) chargeTokens(key string) int64 {
	c := minCapacity(shapeOf(g.m.Policy(), key))
	switch g.r.IntN(12) {
	case 0:
		return int64(g.r.IntN(2)) - 1 // 0 or -1: ErrInvalidCost
	case 1, 2:
		return 1 + g.r.Int64N(3)
	case 3, 4:
		return max(1, diffAdd(c, int64(g.r.IntN(3)-1)))
	case 5, 6:
		return diffAdd(c, diffAdd(c, int64(g.r.IntN(3)-1))) // about twice: a full bucket's floor
	case 7:
		return math.MaxInt64 - g.r.Int64N(2)
	default:
		return 1 + g.r.Int64N(min(c, math.MaxInt64/3)*3)
	}
}

func (g *diffGen) key() string {
	_, maxKeyBytes := diffBounds(g.cfg)
	switch x := g.r.IntN(20); {
	case x < 14:
		return g.keys[g.r.IntN(len(g.keys))]
	case x == 14:
		return diffGoodKeys[g.r.IntN(len(diffGoodKeys))]
	case x == 15:
		g.fresh++
		return fmt.Sprintf("n%d", g.fresh) // a new key, to press on the key bound
	case x == 16:
		return strings.Repeat("x", maxKeyBytes) // exactly MaxKeyBytes: valid
	case x == 17:
		return strings.Repeat("y", maxKeyBytes+1)
	}
	return diffBlankKeys[g.r.IntN(len(diffBlankKeys))]
}

// cost draws a cost for key, around the largest its own limit admits (its
// smallest band's capacity), and now and then around the capacity of
// another limit or band of the policy, so a cost may be above key's
// capacity while within the default's, or within one band and above
// another.
func (g *diffGen) cost(key string) int64 {
	p := g.m.Policy()
	sh := shapeOf(p, key)
	c := minCapacity(sh)
	if (p.Overrides.Len() > 0 || sh.Len() > 1 || p.Bands.Len() > 0) && g.r.IntN(4) == 0 {
		caps := []int64{p.Capacity}
		for _, o := range p.Overrides.Overrides() {
			caps = append(caps, o.Capacity)
		}
		for i := range sh.Len() {
			caps = append(caps, sh.Band(i).Capacity)
		}
		for _, b := range p.Bands.Bands() {
			caps = append(caps, b.Capacity)
		}
		return diffAdd(caps[g.r.IntN(len(caps))], int64(g.r.IntN(3)-1))
	}
	switch g.r.IntN(16) {
	case 6:
		return 2
	case 7:
		return c
	case 8:
		return max(c-1, 1)
	case 9, 10:
		return 1 + g.r.Int64N(c)
	case 11:
		return diffAdd(c, 1) // over capacity (or MaxInt64 at MaxInt64)
	case 12:
		return math.MaxInt64
	case 13:
		return 0
	case 14:
		return -1
	case 15:
		return math.MinInt64
	}
	return 1
}

// batch returns n requests over at most three keys, so keys repeat.
func (g *diffGen) batch(n int) []engine.Request {
	keys := []string{g.key(), g.key(), g.key()}
	reqs := make([]engine.Request, n)
	for i := range reqs {
		k := keys[g.r.IntN(len(keys))]
		reqs[i] = engine.Request{Key: k, Cost: g.cost(k)}
	}
	return reqs
}

// allReqs draws an AllowAll's requests: mostly 1 to 6 over at most three
// keys (so costs of one key add up), with costs mostly small so that calls
// are decided, admitted or refused, rather than rejected; now and then none,
// or MaxAllowAll or one more of one request.
func (g *diffGen) allReqs() []engine.Request {
	switch g.r.IntN(40) {
	case 0:
		return nil
	case 1:
		n := engine.MaxAllowAll + g.r.IntN(2)
		k := g.key()
		return slices.Repeat([]engine.Request{{Key: k, Cost: 1}}, n)
	}
	var keys [3]string
	for i := range keys {
		keys[i] = g.keys[g.r.IntN(len(g.keys))]
		if g.r.IntN(5) == 0 {
			keys[i] = g.key() // now and then new, blank or too long
		}
	}
	reqs := make([]engine.Request, 1+g.r.IntN(6))
	for i := range reqs {
		k := keys[g.r.IntN(len(keys))]
		reqs[i] = engine.Request{Key: k, Cost: g.cost(k)}
		if g.r.IntN(6) != 0 {
			reqs[i].Cost = 1
			if g.r.IntN(2) == 0 {
				reqs[i].Cost += g.r.Int64N(min(minCapacity(shapeOf(g.m.Policy(), k)), 3))
			}
		}
	}
	return reqs
}

// capacity draws a capacity: edge values, or near cur when cur > 0.
func (g *diffGen) capacity(cur int64) int64 {
	if cur > 0 && g.r.IntN(2) == 0 {
		switch g.r.IntN(4) {
		case 0:
			return diffAdd(cur, 1)
		case 1:
			return diffAdd(cur, cur)
		case 2:
			return max(cur-1, 1)
		}
		return max(cur/2, 1)
	}
	caps := []int64{1, 2, 3, 10, 10, 1000, 1 + g.r.Int64N(1e6),
		math.MaxInt64 / policy.UnitsPerToken, math.MaxInt64/policy.UnitsPerToken + 1, math.MaxInt64 - 1, math.MaxInt64}
	return caps[g.r.IntN(len(caps))]
}

func (g *diffGen) rate() int64 {
	rates := []int64{1, 2, 3, 7, 1000, policy.UnitsPerToken - 1, policy.UnitsPerToken, policy.UnitsPerToken + 1,
		3 * policy.UnitsPerToken, 1 + g.r.Int64N(1e12), math.MaxInt64}
	return rates[g.r.IntN(len(rates))]
}

// limitRate draws a limit's rate fields: TokensPerSecond alone, or, in a
// trace of rates of any period, two times in three a Refill alone.
func (g *diffGen) limitRate() (tokensPerSecond int64, refill policy.Rate) {
	if g.shapes == diffPerSecond || g.r.IntN(3) == 0 {
		return g.rate(), policy.Rate{}
	}
	return 0, g.refill()
}

// refill draws a Refill rate: awkward ones (7 per 3 s, 1 per
// day, 1 per MaxInt64 ns, MaxInt64 per 1 ns, 100 per minute), the units a
// 32-bit fraction holds and just past it (a period of 2^32 ns), a rate per
// second in the other form, and random ones of any period.
func (g *diffGen) refill() policy.Rate {
	r := g.r
	rates := []policy.Rate{
		{Tokens: 7, Per: 3 * time.Second}, policy.PerDay(1), {Tokens: 1, Per: math.MaxInt64}, {Tokens: math.MaxInt64, Per: 1},
		policy.PerMinute(100), policy.PerHour(1000), policy.PerDay(10_000), {Tokens: 1, Per: 1}, {Tokens: 3, Per: 7},
		{Tokens: 1, Per: 1 << 32}, {Tokens: 1, Per: 1<<32 + 1}, {Tokens: 1<<32 + 3, Per: 1<<32 + 1},
		policy.PerSecond(g.rate()),
		{Tokens: 1 + r.Int64N(1000), Per: time.Duration(1 + r.Int64N(int64(time.Hour)))},
		{Tokens: 1 + r.Int64N(math.MaxInt64), Per: time.Duration(1 + r.Int64N(math.MaxInt64))},
	}
	return rates[r.IntN(len(rates))]
}

// diffBandNames are the names bands draw from: short, shared across
// policies so cutovers match bands by name, a blank-looking one, one of
// the longest; "daily" is also an override name (diffOverrideNames), so a
// key may move from a band "daily" to a primary band "daily", which a
// cutover does not match.
var diffBandNames = []string{"daily", "burst", "b", "hourly", " ", "x~y", strings.Repeat("n", policy.MaxNameBytes)}

// diffOverrideNames are the names overrides draw from.
var diffOverrideNames = []string{"gold", "daily", "o1", "o2"}

// bandSet draws the bands of a limit whose primary capacity is capacity,
// in a trace with bands (else nil): usually one to three, rarely the
// MaxBands a set may hold, sometimes none. Half the time it starts from
// prev's: some dropped, some reshaped (capacity moved, rate changed within
// its period or to another period), the order shuffled; then new bands may
// join.
func (g *diffGen) bandSet(prev *policy.BandSet, capacity int64) *policy.BandSet {
	r := g.r
	if g.shapes != diffBands || r.IntN(6) == 0 {
		return nil
	}
	most := 3
	if r.IntN(40) == 0 {
		most = policy.MaxBands
	}
	var out []policy.Band
	used := map[string]bool{}
	if prev.Len() > 0 && r.IntN(2) == 0 {
		for _, b := range prev.Bands() {
			switch r.IntN(6) {
			case 0:
				continue
			case 1:
				b.Capacity = g.capacity(b.Capacity)
			case 2:
				b.Refill = g.refill()
			case 3:
				b.Refill.Tokens = max(diffAdd(b.Refill.Tokens, int64(r.IntN(5)-2)), 1) // the period kept
			}
			out, used[b.Name] = append(out, b), true
		}
		if r.IntN(2) == 0 {
			r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		}
	}
	for n, i := 1+r.IntN(most), 0; len(out) < n; i++ {
		name := diffBandNames[r.IntN(len(diffBandNames))]
		if most > 3 {
			name = fmt.Sprint("m", i)
		}
		if used[name] {
			continue
		}
		used[name] = true
		out = append(out, policy.Band{Name: name, Capacity: g.capacity(capacity), Refill: g.refill()})
	}
	return mustBands(out...)
}

// cutover draws ReplacePolicy's arguments into op: mostly a valid next
// policy, else a stale expected version, a version that does not increase,
// an invalid policy, or one both invalid and stale.
func (g *diffGen) cutover(op *diffOp) {
	cur := g.m.Policy()
	op.next = policy.Policy{Capacity: g.capacity(cur.Capacity)}
	op.next.TokensPerSecond, op.next.Refill = g.limitRate()
	if g.r.IntN(4) == 0 {
		op.next.Bands = cur.Bands // the same set, by reference
	} else {
		op.next.Bands = g.bandSet(cur.Bands, op.next.Capacity)
	}
	op.vDelta = 1
	switch x := g.r.IntN(20); {
	case x < 9:
		if g.r.IntN(4) == 0 {
			op.vDelta = 1 + g.r.Int64N(1000)
		}
		if g.r.IntN(3) == 0 {
			op.next.TokensPerSecond, op.next.Refill = cur.TokensPerSecond, cur.Refill // capacity moves alone
		}
	case x == 9:
		op.next = policy.Policy{Capacity: cur.Capacity, TokensPerSecond: cur.TokensPerSecond, Refill: cur.Refill, Bands: cur.Bands}
	case x == 10 && g.r.IntN(16) == 0:
		op.vAbs, op.next.Version = true, math.MaxInt64-g.r.Int64N(2) // no valid cutover is left after this
	case x < 13:
		op.eDelta = int64(2*g.r.IntN(2) - 1) // stale expected version
	case x < 15:
		op.vDelta = -g.r.Int64N(2) // not above the version in force
	case x < 18:
		switch g.r.IntN(8) {
		case 0:
			op.vAbs, op.next.Version = true, 0
		case 1:
			op.next.Capacity = 0
		case 2:
			op.next.TokensPerSecond, op.next.Refill = 0, policy.Rate{} // no rate
		case 3:
			op.next.Capacity = -1
		case 4:
			op.next.TokensPerSecond, op.next.Refill = 1+g.r.Int64N(10), policy.PerMinute(1) // both rates
		case 5:
			op.next.TokensPerSecond, op.next.Refill = 0, policy.Rate{Tokens: 0, Per: time.Second}
		case 6:
			op.next.TokensPerSecond, op.next.Refill = 0, policy.Rate{Tokens: 1, Per: -1}
		default:
			op.next.TokensPerSecond = math.MinInt64
		}
	default:
		op.vAbs, op.next.Version, op.eDelta = true, 0, -1 // invalid and stale: invalid wins
	}
	if g.r.IntN(4) == 0 {
		op.next.Overrides = cur.Overrides // the same set, by reference
	} else {
		op.next.Overrides = g.overrides(cur.Overrides, op.next.Limit())
	}
}

// overrides draws the overrides of a policy whose default is def, or nil.
// Half the time it starts from prev's: some dropped, some limits moved up
// or down, the order shuffled (which changes the first pattern a key
// meets). Then it adds exact overrides on the trace's keys and patterns cut
// from them, so across cutovers keys move from the default to an override,
// back, and from one override to another.
func (g *diffGen) overrides(prev *policy.OverrideSet, def policy.Limit) *policy.OverrideSet {
	r := g.r
	if r.IntN(5) < 2 {
		return nil
	}
	var out []policy.Override
	seen := map[string]bool{}
	add := func(o policy.Override) {
		if strings.TrimSpace(o.Match) != "" && !seen[o.Match] {
			seen[o.Match] = true
			out = append(out, o)
		}
	}
	if prev.Len() > 0 && r.IntN(2) == 0 {
		for _, o := range prev.Overrides() {
			switch r.IntN(6) {
			case 0:
				continue
			case 1:
				o.Capacity = g.capacity(o.Capacity)
			case 2:
				o.TokensPerSecond, o.Refill = g.limitRate()
			case 3:
				o.Bands = g.bandSet(o.Bands, o.Capacity)
			}
			add(o)
		}
		if r.IntN(2) == 0 {
			r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		}
	}
	for n := r.IntN(4); n > 0 || len(out) == 0; n-- {
		o := policy.Override{Match: g.match(), Capacity: g.capacity(def.Capacity)}
		o.TokensPerSecond, o.Refill = g.limitRate()
		if validRate(def) && r.IntN(3) == 0 {
			o.TokensPerSecond, o.Refill = def.TokensPerSecond, def.Refill // the capacity differs alone
		}
		if r.IntN(2) == 0 {
			o.Bands = g.bandSet(nil, o.Capacity)
		}
		if g.shapes != diffPerSecond && r.IntN(2) == 0 {
			o.Name = diffOverrideNames[r.IntN(len(diffOverrideNames))]
		}
		add(o)
	}
	// A Name belongs to one override here (overrides with different limits
	// may not share one), and never to one of its own bands.
	names := map[string]bool{}
	for i := range out {
		if n := out[i].Name; n != "" && (names[n] || out[i].Bands.Index(n) >= 0) {
			out[i].Name = ""
		}
		names[out[i].Name] = true
	}
	return mustOverrides(out...)
}

// validRate reports whether l's rate fields are valid: the default of an
// invalid cutover's policy may not be.
func validRate(l policy.Limit) bool {
	return policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: l.TokensPerSecond, Refill: l.Refill}.Validate() == nil
}

// match draws an override's Match: mostly a key of the trace, exactly or as
// a pattern with '*' at its start, in its middle, at its end or at both
// ends; sometimes a lone "*", the new keys to come, the longest valid key,
// or a pattern that matches no key of the trace.
func (g *diffGen) match() string {
	r := g.r
	_, maxKeyBytes := diffBounds(g.cfg)
	k := g.keys[r.IntN(len(g.keys))]
	switch x := r.IntN(20); {
	case x < 6:
		return k // a pattern if k has a star
	case x == 6:
		return "*"
	case x == 7:
		return []string{"n1", "n2", "n*", "*2", "n*1"}[r.IntN(5)] // the keys g.key makes fresh
	case x == 8:
		return strings.Repeat("x", maxKeyBytes)
	case x == 9:
		return []string{"zz*", "*qq", "q*q", "*z*"}[r.IntN(4)]
	case x < 12:
		return "*" + k[r.IntN(len(k)+1):]
	case x < 14:
		return k[:r.IntN(len(k)+1)] + "*"
	case x < 17:
		i := r.IntN(len(k) + 1)
		j := i + r.IntN(len(k)-i+1)
		return k[:i] + "*" + k[j:]
	}
	i := r.IntN(len(k) + 1)
	j := i + r.IntN(len(k)-i+1)
	return "*" + k[i:j] + "*"
}
