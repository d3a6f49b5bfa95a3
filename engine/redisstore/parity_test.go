package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// The parity tests feed the engine and the store (without and with
// leases) the same calls at the same instants of one Manual clock, and
// compare every answer: errors by the documented sentinels (errors.Is),
// Decisions, indexes, counts and out slices field by field, and Policy()
// after each call. The engine is the reference: engine.Admitter promises
// the same meaning from both. A leased store's Remaining, RetryAfter and
// ResetAfter are estimates (package doc, Leases), so for it those three
// fields are left out, and so are EvictFull's counts (a lease keeps a
// bucket from being full).

// paritySentinels are the errors whose classes must agree.
var paritySentinels = []error{
	engine.ErrNotInitialized, engine.ErrInvalidKey, engine.ErrInvalidCost, engine.ErrCostExceedsCapacity,
	engine.ErrClosed, engine.ErrNilContext, context.Canceled, context.DeadlineExceeded,
	engine.ErrKeyCapacity, engine.ErrStalePolicy, engine.ErrInvalidPolicy, engine.ErrInvalidConfig,
	engine.ErrAllowAllSize, engine.ErrClockRegression, redisstore.ErrUnavailable,
}

// paritySubject is one implementation under comparison.
type paritySubject struct {
	name   string
	a      engine.Admitter
	leased bool
}

// parity drives its subjects through one clock.
type parity struct {
	t    *testing.T
	clk  *clock.Manual
	subs []paritySubject // subs[0], the engine, is the reference
}

// newParity builds an engine, a store and a leased store serving p, on one
// Manual clock at 0.
func newParity(t *testing.T, p policy.Policy) *parity {
	t.Helper()
	return newParityOf(t, p, true)
}

// newParityOf is newParity, the leased store left out unless leased.
func newParityOf(t *testing.T, p policy.Policy, leased bool) *parity {
	t.Helper()
	clk := clock.NewManual(0)
	e, err := engine.New(engine.Config{Policy: p, Clock: clk})
	require.NoError(t, err, "engine.New")
	t.Cleanup(func() { _ = e.Close() })
	pr := &parity{t: t, clk: clk, subs: []paritySubject{
		{"engine", e, false},
		{"store", newStore(t, redisstore.Config{Policy: p}, clk), false},
	}}
	if leased {
		pr.subs = append(pr.subs, paritySubject{"leased store", newStore(t, redisstore.Config{Policy: p, Leases: &redisstore.Leases{}}, clk), true})
	}
	return pr
}

// outcome is what one call answered.
type outcome struct {
	D   engine.Decision
	At  int // AllowAll's index
	N   int // EvictFull's count
	Err error
	Out []engine.Result // AllowBatch's out, whole
}

func (o outcome) String() string {
	s := fmt.Sprintf("%+v", o.D)
	if o.At != 0 || o.N != 0 {
		s += fmt.Sprintf(" at %d n %d", o.At, o.N)
	}
	if o.Err != nil {
		s += fmt.Sprintf(" err %v", o.Err)
	}
	for i, r := range o.Out {
		s += fmt.Sprintf("\n\tout[%d] %+v %v", i, r.Decision, r.Err)
	}
	return s
}

// estimated leaves out a leased answer's estimated fields.
func estimated(d engine.Decision) engine.Decision {
	d.Remaining, d.RetryAfter, d.ResetAfter = 0, 0, 0
	return d
}

// sameErr requires got to be of every sentinel class want is, and no other.
func sameErr(t *testing.T, want, got error, what string) {
	t.Helper()
	require.Equal(t, want == nil, got == nil, "%s: error %v, the engine's %v", what, got, want)
	for _, s := range paritySentinels {
		require.Equal(t, errors.Is(want, s), errors.Is(got, s),
			"%s: errors.Is(err, %v): error %v, the engine's %v", what, s, got, want)
	}
}

// do runs call on every subject and compares each answer with the
// engine's, then every Policy().
func (p *parity) do(what string, call func(a engine.Admitter) outcome) outcome {
	p.t.Helper()
	want := call(p.subs[0].a)
	for _, s := range p.subs[1:] {
		got := call(s.a)
		where := fmt.Sprintf("at %v, %s on the %s", time.Duration(p.clk.Now()), what, s.name)
		whole := fmt.Sprintf("%s\n got %v\nwant %v", where, got, want)
		if len(want.Out) > 0 { // out[i] is compared alone: the whole of a long out costs too much to print each time
			whole = fmt.Sprintf("%s\n got %+v %v\nwant %+v %v", where, got.D, got.Err, want.D, want.Err)
		}
		sameErr(p.t, want.Err, got.Err, whole)
		require.Equal(p.t, want.At, got.At, "%s: index", whole)
		require.Equal(p.t, len(want.Out), len(got.Out), "%s: out", whole)
		for i := range want.Out {
			sameErr(p.t, want.Out[i].Err, got.Out[i].Err, fmt.Sprintf("%s: out[%d]", where, i))
		}
		if s.leased {
			require.Equal(p.t, estimated(want.D), estimated(got.D), "%s: Decision", whole)
			for i := range want.Out {
				if estimated(want.Out[i].Decision) != estimated(got.Out[i].Decision) {
					require.Equal(p.t, estimated(want.Out[i].Decision), estimated(got.Out[i].Decision), "%s: out[%d]", where, i)
				}
			}
			continue
		}
		require.Equal(p.t, want.D, got.D, "%s: Decision", whole)
		require.Equal(p.t, want.N, got.N, "%s: count", whole)
		for i := range want.Out {
			if want.Out[i].Decision != got.Out[i].Decision {
				require.Equal(p.t, want.Out[i].Decision, got.Out[i].Decision, "%s: out[%d]", where, i)
			}
		}
	}
	p.samePolicy(what)
	return want
}

// samePolicy requires every subject's Policy() to be the engine's, by
// content.
func (p *parity) samePolicy(what string) {
	p.t.Helper()
	want := p.subs[0].a.Policy()
	for _, s := range p.subs[1:] {
		got := s.a.Policy()
		where := fmt.Sprintf("after %s, Policy() of the %s", what, s.name)
		require.Equal(p.t, []int64{want.Version, want.Capacity, want.TokensPerSecond},
			[]int64{got.Version, got.Capacity, got.TokensPerSecond}, where)
		require.Equal(p.t, want.Refill, got.Refill, where)
		require.Equal(p.t, want.Bands.Bands(), got.Bands.Bands(), where)
		require.Equal(p.t, want.Overrides.Overrides(), got.Overrides.Overrides(), where)
	}
}

func (p *parity) allow(ctx context.Context, key string, cost int64) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("Allow(%s, %q, %d)", ctxName(ctx), short(key), cost), func(a engine.Admitter) outcome {
		d, err := a.Allow(ctx, key, cost)
		return outcome{D: d, Err: err}
	})
}

func (p *parity) charge(ctx context.Context, key string, tokens int64) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("Charge(%s, %q, %d)", ctxName(ctx), short(key), tokens), func(a engine.Admitter) outcome {
		d, err := a.Charge(ctx, key, tokens)
		return outcome{D: d, Err: err}
	})
}

func (p *parity) refund(ctx context.Context, key string, tokens int64) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("Refund(%s, %q, %d)", ctxName(ctx), short(key), tokens), func(a engine.Admitter) outcome {
		d, err := a.Refund(ctx, key, tokens)
		return outcome{D: d, Err: err}
	})
}

// parityPeeker is Peek, which the engine and the store both have outside
// engine.Admitter.
type parityPeeker interface {
	Peek(ctx context.Context, key string) (engine.Decision, error)
}

func (p *parity) peek(ctx context.Context, key string) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("Peek(%s, %q)", ctxName(ctx), short(key)), func(a engine.Admitter) outcome {
		d, err := a.(parityPeeker).Peek(ctx, key)
		return outcome{D: d, Err: err}
	})
}

// batch runs AllowBatch into an out of n results, each prefilled with
// garbage, and compares all n.
func (p *parity) batch(ctx context.Context, reqs []engine.Request, n int) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("AllowBatch(%s, %s, out %d)", ctxName(ctx), fmtParityReqs(reqs), n), func(a engine.Admitter) outcome {
		var out []engine.Result
		if n > 0 {
			out = make([]engine.Result, n)
			for i := range out {
				out[i] = parityGarbage
			}
		}
		err := a.AllowBatch(ctx, reqs, out)
		return outcome{Err: err, Out: out}
	})
}

// parityGarbage is what out holds before AllowBatch: a result no subject
// writes, with an error of no sentinel class.
var parityGarbage = engine.Result{
	Decision: engine.Decision{Allowed: true, Remaining: -77, RetryAfter: 1, Version: -5, Limit: -9, ResetAfter: 3},
	Err:      errors.New("parity: garbage, never written by a subject"),
}

func (p *parity) allowAll(ctx context.Context, reqs []engine.Request) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("AllowAll(%s, %s)", ctxName(ctx), fmtParityReqs(reqs)), func(a engine.Admitter) outcome {
		d, at, err := a.AllowAll(ctx, reqs)
		return outcome{D: d, At: at, Err: err}
	})
}

func (p *parity) evict(ctx context.Context) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("EvictFull(%s)", ctxName(ctx)), func(a engine.Admitter) outcome {
		n, err := a.EvictFull(ctx)
		return outcome{N: n, Err: err}
	})
}

func (p *parity) replace(ctx context.Context, next policy.Policy, expected int64) outcome {
	p.t.Helper()
	return p.do(fmt.Sprintf("ReplacePolicy(%s, %+v, %d)", ctxName(ctx), next, expected), func(a engine.Admitter) outcome {
		return outcome{Err: a.ReplacePolicy(ctx, next, expected)}
	})
}

func (p *parity) close() outcome {
	p.t.Helper()
	return p.do("Close()", func(a engine.Admitter) outcome { return outcome{Err: a.Close()} })
}

// Contexts, each named in the failure messages.
var (
	parityNilCtx context.Context
	ctxNames     = map[context.Context]string{}
)

func ctxName(ctx context.Context) string {
	if ctx == nil {
		return "nil ctx"
	}
	if n, ok := ctxNames[ctx]; ok {
		return n
	}
	return "ctx"
}

// parityContexts returns a live context and the ones every call must
// refuse: nil, canceled, past its deadline.
func parityContexts(t *testing.T) (live context.Context, bad []context.Context) {
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	past, cancelPast := context.WithDeadline(t.Context(), time.Unix(0, 0))
	t.Cleanup(cancelPast)
	ctxNames[canceled], ctxNames[past] = "canceled ctx", "ctx past its deadline"
	return t.Context(), []context.Context{parityNilCtx, canceled, past}
}

func short(key string) string {
	if len(key) > 24 {
		return fmt.Sprintf("%s...(%d bytes)", key[:8], len(key))
	}
	return key
}

func fmtParityReqs(rs []engine.Request) string {
	if len(rs) > 6 {
		return fmt.Sprintf("%d requests, %s...", len(rs), fmtParityReqs(rs[:3]))
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("{%q %d}", short(r.Key), r.Cost)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Edge keys: blank, at and over the 256-byte bound (in ASCII and in
// two-byte runes), invalid UTF-8, a NUL, a hash tag, glob bytes, and keys
// the overrides of parityPolicies match.
var (
	parityKeyMax  = strings.Repeat("k", engine.DefaultMaxKeyBytes)
	parityKeyOver = strings.Repeat("k", engine.DefaultMaxKeyBytes+1)
	parityKeys    = []string{
		"", " ", "\t\n\u00a0\u3000", parityKeyMax, parityKeyOver,
		strings.Repeat("é", engine.DefaultMaxKeyBytes/2), strings.Repeat("é", engine.DefaultMaxKeyBytes/2+1),
		"\xff\xfe", "\xa0", " \xff ", "a\x00b", "{t}x", "*?[", "plain", "vip:1", "vip:\xff", "tenant:acme",
	}
)

// parityPolicies are a plain policy, one with bands of several periods,
// and one whose overrides have rates of other periods, bands and names.
func parityPolicies(t *testing.T) map[string]policy.Policy {
	daily, err := policy.NewBands(policy.Band{Name: "minute", Capacity: 8, Refill: policy.PerMinute(8)},
		policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})
	require.NoError(t, err)
	vipBands, err := policy.NewBands(policy.Band{Name: "hourly", Capacity: 30, Refill: policy.PerHour(30)})
	require.NoError(t, err)
	set, err := policy.NewOverrideSet(
		policy.Override{Match: "tenant:acme", Capacity: 100, TokensPerSecond: 10},
		policy.Override{Match: "vip:*", Name: "vip", Capacity: 50, Refill: policy.PerMinute(60), Bands: vipBands},
		policy.Override{Match: "vip:\xff", Capacity: 3, TokensPerSecond: 1},
		policy.Override{Match: "{t}*", Capacity: math.MaxInt64, TokensPerSecond: math.MaxInt64},
	)
	require.NoError(t, err)
	return map[string]policy.Policy{
		"plain":     {Version: 1, Capacity: 10, TokensPerSecond: 2},
		"bands":     {Version: 1, Capacity: 5, TokensPerSecond: 5, Bands: daily},
		"overrides": {Version: 1, Capacity: 10, Refill: policy.PerMinute(90), Overrides: set},
	}
}

// capOf is the least capacity of key's bands under p.
func capOf(p policy.Policy, key string) int64 {
	sh := p.ShapeAt(p.Overrides.Resolve(key))
	c := sh.Primary.Capacity
	for i := range sh.Bands.Len() {
		c = min(c, sh.Bands.At(i).Capacity)
	}
	return c
}

// parityCosts are the edge costs for key under p.
func parityCosts(p policy.Policy, key string) []int64 {
	c := capOf(p, key)
	costs := []int64{0, -1, math.MinInt64, 1, c, math.MaxInt64}
	if c < math.MaxInt64 {
		costs = append(costs, c+1)
	}
	return costs
}

// TestParitySingle: Allow, Charge, Refund and Peek of every edge key and
// cost, under every context, on a plain policy, bands and overrides, with
// the clock moving between rounds.
func TestParitySingle(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	for name, p := range parityPolicies(t) {
		t.Run(name, func(t *testing.T) {
			pr := newParity(t, p)
			live, bad := parityContexts(t)
			for round := range 3 {
				for _, key := range parityKeys {
					for _, cost := range parityCosts(p, key) {
						pr.allow(live, key, cost)
						pr.refund(live, key, cost)
						pr.peek(live, key)
					}
					for _, ctx := range bad {
						pr.allow(ctx, key, 1)
						pr.charge(ctx, key, 1)
						pr.refund(ctx, key, 1)
						pr.peek(ctx, key)
					}
				}
				pr.clk.Advance(time.Duration(round+1) * 700 * time.Millisecond)
				for _, key := range parityKeys {
					for _, cost := range parityCosts(p, key) {
						pr.charge(live, key, cost)
						pr.allow(live, key, 1)
					}
				}
				pr.clk.Advance(time.Duration(round+1) * 1300 * time.Millisecond)
				for _, ctx := range bad {
					pr.evict(ctx)
				}
				pr.evict(live)
			}
		})
	}
}

// TestParityBatch: AllowBatch of no requests, into an out too short, as
// long and longer, with every edge key and cost mixed among valid
// requests and repeated keys, under every context.
func TestParityBatch(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	for name, p := range parityPolicies(t) {
		t.Run(name, func(t *testing.T) {
			pr := newParity(t, p)
			live, bad := parityContexts(t)
			var mixed []engine.Request
			for i, key := range parityKeys {
				costs := parityCosts(p, key)
				mixed = append(mixed, engine.Request{Key: key, Cost: costs[i%len(costs)]},
					engine.Request{Key: "plain", Cost: 1}, engine.Request{Key: key, Cost: 1})
			}
			for _, ctx := range append([]context.Context{live}, bad...) {
				pr.batch(ctx, nil, 0)
				pr.batch(ctx, nil, 2)
				pr.batch(ctx, []engine.Request{}, 1)
				pr.batch(ctx, []engine.Request{{Key: "", Cost: 0}}, 1)
				for _, n := range []int{0, 1, len(mixed) - 1, len(mixed), len(mixed) + 2} {
					pr.batch(ctx, mixed, n)
				}
				pr.clk.Advance(900 * time.Millisecond)
			}
			// Past ChunkSize: a key repeated more often than that is decided
			// over further rounds, at the same instant.
			var big []engine.Request
			for i := range 3*redisstore.ChunkSize + 7 {
				key := parityKeys[i%len(parityKeys)]
				if i%3 != 0 {
					key = "hot"
				}
				big = append(big, engine.Request{Key: key, Cost: int64(1 + i%4)})
			}
			pr.batch(live, big, len(big))
			pr.clk.Advance(3 * time.Second)
			pr.batch(live, big, len(big)+1)
			for _, key := range append(parityKeys, "hot") {
				pr.peek(live, key)
			}
		})
	}
}

// TestParityAllowAll: AllowAll of 0, MaxAllowAll and MaxAllowAll+1
// requests, repeated keys, one bad request among good ones (which error
// wins, and whether anything is taken: the Peeks after say), under every
// context.
func TestParityAllowAll(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	for name, p := range parityPolicies(t) {
		t.Run(name, func(t *testing.T) {
			pr := newParity(t, p)
			live, bad := parityContexts(t)
			good := []engine.Request{{Key: "plain", Cost: 2}, {Key: "vip:1", Cost: 1}, {Key: "plain", Cost: 1}, {Key: "tenant:acme", Cost: 3}}
			probe := func() {
				for _, r := range good {
					pr.peek(live, r.Key)
				}
			}
			most := make([]engine.Request, engine.MaxAllowAll)
			for i := range most {
				most[i] = engine.Request{Key: fmt.Sprint("n", i%40), Cost: 1}
			}
			for _, ctx := range append([]context.Context{live}, bad...) {
				pr.allowAll(ctx, nil)
				pr.allowAll(ctx, []engine.Request{})
				pr.allowAll(ctx, append(most, engine.Request{Key: "n0", Cost: 1}))
				pr.allowAll(ctx, append(most[:engine.MaxAllowAll:engine.MaxAllowAll], engine.Request{Key: "", Cost: 0}))
				pr.allowAll(ctx, most)
				pr.allowAll(ctx, good)
				probe()
				for _, key := range parityKeys {
					for _, cost := range parityCosts(p, key) {
						for at := range len(good) + 1 {
							reqs := append(append(append([]engine.Request(nil), good[:at]...), engine.Request{Key: key, Cost: cost}), good[at:]...)
							pr.allowAll(ctx, reqs)
						}
						pr.allowAll(ctx, []engine.Request{{Key: key, Cost: cost}, {Key: key, Cost: cost}})
					}
				}
				probe()
				pr.clk.Advance(1100 * time.Millisecond)
			}
		})
	}
}

// TestParityDebt: Charge and Refund of 0, below 0 and math.MaxInt64, on
// unknown keys, into debt to the floor and back by Refund and refill.
func TestParityDebt(t *testing.T) {
	exactBalances(t)
	for name, p := range parityPolicies(t) {
		t.Run(name, func(t *testing.T) {
			pr := newParity(t, p)
			live, _ := parityContexts(t)
			keys := []string{"plain", "vip:1", "vip:\xff", "tenant:acme", "{t}x"}
			for _, key := range keys {
				for _, n := range []int64{0, -1, math.MinInt64} {
					pr.charge(live, key, n)
					pr.refund(live, key, n)
				}
				pr.refund(live, key, 1) // unknown: nothing created
				pr.refund(live, key, math.MaxInt64)
				pr.evict(live)
				pr.charge(live, key, 1)
				pr.refund(live, key, math.MaxInt64) // back to full, not past it
				pr.charge(live, key, capOf(p, key))
				pr.charge(live, key, capOf(p, key)/2+1)
				pr.allow(live, key, 1)
				pr.refund(live, key, 1)
				pr.charge(live, key, math.MaxInt64) // to the floor
				pr.allow(live, key, 1)
				pr.charge(live, key, math.MaxInt64)
				pr.refund(live, key, capOf(p, key)/3+1)
				pr.allow(live, key, 1)
			}
			for _, step := range []time.Duration{time.Nanosecond, time.Second, time.Minute, time.Hour, 24 * time.Hour, 48 * time.Hour} {
				pr.clk.Advance(step)
				for _, key := range keys {
					pr.peek(live, key)
					pr.allow(live, key, 1)
				}
				pr.evict(live)
			}
			for _, key := range keys {
				pr.refund(live, key, math.MaxInt64)
				pr.charge(live, key, math.MaxInt64)
				pr.refund(live, key, math.MaxInt64)
				pr.allow(live, key, capOf(p, key))
			}
		})
	}
}

// TestParityCutover: ReplacePolicy with stale, equal and older versions,
// invalid policies, under every context, and cutovers between plain
// policies, bands and overrides (with Policy() compared after each), the
// keys probed around them.
func TestParityCutover(t *testing.T) {
	exactBalances(t)
	pols := parityPolicies(t)
	order := []string{"plain", "bands", "overrides", "plain", "overrides", "bands"}
	pr := newParity(t, pols[order[0]])
	live, bad := parityContexts(t)
	keys := []string{"plain", "vip:1", "vip:\xff", "tenant:acme", "{t}x"}
	play := func() {
		for i, key := range keys {
			pr.allow(live, key, int64(1+i%3))
			if i%2 == 0 {
				pr.charge(live, key, 7)
			}
		}
		pr.clk.Advance(1234567891 * time.Nanosecond)
	}
	play()
	for i, name := range order[1:] {
		cur := pr.subs[0].a.Policy()
		next := pols[name]
		next.Version = cur.Version + 1 + int64(i%2)
		invalid := []policy.Policy{{}, {Version: next.Version, Capacity: 1}, {Version: next.Version, Capacity: 1, TokensPerSecond: 1, Refill: policy.PerMinute(1)},
			{Version: next.Version, Capacity: 1, Refill: policy.Rate{Tokens: 1}}, {Version: 0, Capacity: 1, TokensPerSecond: 1}, {Version: -1, Capacity: 1, TokensPerSecond: 1}}
		for _, inv := range invalid {
			pr.replace(live, inv, cur.Version)
			pr.replace(live, inv, cur.Version+7)
		}
		for _, expected := range []int64{cur.Version - 1, cur.Version + 1, 0, -1, math.MaxInt64} {
			pr.replace(live, next, expected)
		}
		same := next
		same.Version = cur.Version
		pr.replace(live, same, cur.Version)
		older := next
		older.Version = cur.Version - 1
		pr.replace(live, older, cur.Version)
		for _, ctx := range bad {
			pr.replace(ctx, next, cur.Version)
			pr.replace(ctx, next, cur.Version-1)
			pr.replace(ctx, policy.Policy{}, cur.Version)
		}
		play()
		pr.replace(live, next, cur.Version)
		pr.replace(live, next, cur.Version) // again: now stale
		play()
	}
	top := pols["overrides"]
	top.Version = math.MaxInt64
	pr.replace(live, top, pr.subs[0].a.Policy().Version)
	play()
	pr.replace(live, top, math.MaxInt64)
	for _, key := range keys {
		pr.peek(live, key)
	}
}

// TestParityClosed: every call after Close, under every context, and
// Close again.
func TestParityClosed(t *testing.T) {
	exactBalances(t)
	p := parityPolicies(t)["overrides"]
	pr := newParity(t, p)
	live, bad := parityContexts(t)
	pr.allow(live, "plain", 3)
	pr.charge(live, "vip:1", 100)
	pr.close()
	pr.close()
	for _, ctx := range append([]context.Context{live}, bad...) {
		for _, key := range []string{"plain", "vip:1", "new", "", parityKeyOver, "\xff"} {
			for _, cost := range append(parityCosts(p, key), 1000) {
				pr.allow(ctx, key, cost)
				pr.charge(ctx, key, cost)
				pr.refund(ctx, key, cost)
			}
			pr.peek(ctx, key)
		}
		reqs := []engine.Request{{Key: "plain", Cost: 1}, {Key: "", Cost: 1}, {Key: "new", Cost: 0}, {Key: "vip:1", Cost: 1000}}
		pr.batch(ctx, nil, 0)
		pr.batch(ctx, reqs, len(reqs))
		pr.batch(ctx, reqs, 2)
		pr.allowAll(ctx, nil)
		pr.allowAll(ctx, reqs)
		pr.allowAll(ctx, reqs[:1])
		pr.allowAll(ctx, reqs[3:])
		pr.evict(ctx)
		pr.replace(ctx, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 1)
		pr.replace(ctx, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 7)
		pr.replace(ctx, policy.Policy{}, 1)
	}
	pr.close()
}

// parityRates are the periods the random policies draw from: per
// nanosecond-odd periods as well as the named ones.
var parityRates = []time.Duration{time.Nanosecond, 7 * time.Nanosecond, time.Millisecond, time.Second, 3 * time.Second,
	time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

func parityMagnitude(r *rand.Rand) int64 {
	switch r.IntN(7) {
	case 0, 1, 2:
		return 1 + r.Int64N(12)
	case 3, 4:
		return 1 + r.Int64N(1000)
	case 5:
		return 1 + r.Int64N(math.MaxInt64)
	default:
		return math.MaxInt64 - r.Int64N(2)
	}
}

// parityLimit draws a capacity and one rate, per second or per period.
func parityLimit(r *rand.Rand) (capacity, tps int64, refill policy.Rate) {
	capacity = parityMagnitude(r)
	if r.IntN(3) == 0 {
		return capacity, parityMagnitude(r), policy.Rate{}
	}
	return capacity, 0, policy.Rate{Tokens: parityMagnitude(r), Per: parityRates[r.IntN(len(parityRates))]}
}

func parityBands(t *testing.T, r *rand.Rand) *policy.BandSet {
	n := r.IntN(4) - 1
	if n <= 0 {
		return nil
	}
	bs := make([]policy.Band, n)
	for i := range bs {
		c, tps, refill := parityLimit(r)
		if tps != 0 {
			refill = policy.PerSecond(tps)
		}
		bs[i] = policy.Band{Name: []string{"minute", "hour", "day", "b"}[(i+r.IntN(2))%4], Capacity: c, Refill: refill}
	}
	set, err := policy.NewBands(bs...)
	if err != nil { // a repeated name: one band fewer
		set, err = policy.NewBands(bs[0])
	}
	require.NoError(t, err)
	return set
}

// parityRandomKeys are the random runs' keys: plain ones, ones the
// overrides match exactly or by pattern, invalid UTF-8, one of the bound,
// and a bad one.
var parityRandomKeys = []string{"a", "b", "vip:1", "vip:\xff", "tenant:acme", "{t}x", parityKeyMax, " "}

var parityMatches = []string{"a", "vip:*", "vip:\xff", "tenant:acme", "{t}*", "*"}

func parityPolicy(t *testing.T, r *rand.Rand, version int64) policy.Policy {
	p := policy.Policy{Version: version, Bands: parityBands(t, r)}
	p.Capacity, p.TokensPerSecond, p.Refill = parityLimit(r)
	if r.IntN(3) != 0 {
		var os []policy.Override
		for k, i := range r.Perm(len(parityMatches)) {
			if r.IntN(2) == 0 {
				continue
			}
			o := policy.Override{Match: parityMatches[i], Bands: parityBands(t, r)}
			o.Capacity, o.TokensPerSecond, o.Refill = parityLimit(r)
			if r.IntN(2) == 0 {
				o.Name = fmt.Sprint("tier", k)
			}
			os = append(os, o)
		}
		set, err := policy.NewOverrideSet(os...)
		require.NoError(t, err)
		p.Overrides = set
	}
	return p
}

func parityCost(r *rand.Rand, p policy.Policy, key string) int64 {
	c := capOf(p, key)
	switch r.IntN(12) {
	case 0, 1, 2:
		return 1
	case 3, 4, 5:
		return 1 + r.Int64N(c)
	case 6:
		return c
	case 7:
		return c/2 + 1
	case 8:
		return []int64{0, -1, math.MinInt64}[r.IntN(3)]
	case 9:
		if c < math.MaxInt64 {
			return c + 1
		}
	}
	return math.MaxInt64
}

func parityStep(r *rand.Rand) time.Duration {
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return time.Duration(1 + r.Int64N(10))
	case 2, 3:
		return time.Duration(r.Int64N(2e9))
	case 4, 5:
		return time.Duration(r.Int64N(1e12))
	case 6:
		return time.Duration(r.Int64N(1e14))
	default:
		return time.Duration(r.Int64N(1e16))
	}
}

// TestParityRandom plays seeded random sequences of every call, Charge,
// Refund and Peek among them, over random policies with bands, overrides
// of every period and cutovers between them.
func TestParityRandom(t *testing.T) {
	skipUnderRace(t)
	exactBalances(t)
	for seed := range uint64(parityRandomSeeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0x9a41e7))
			// Without the leased store: the band that binds a key of
			// several bands moves as they refill, and its leased answers
			// name the band of the bucket's last answer (package doc,
			// Leases).
			pr := newParityOf(t, parityPolicy(t, r, 1), false)
			live, _ := parityContexts(t)
			key := func() string { return parityRandomKeys[r.IntN(len(parityRandomKeys))] }
			reqs := func(n int) []engine.Request {
				rs := make([]engine.Request, n)
				for i := range rs {
					k := key()
					rs[i] = engine.Request{Key: k, Cost: parityCost(r, pr.subs[0].a.Policy(), k)}
					if r.IntN(2) == 0 {
						rs[i].Cost = 1 + r.Int64N(3)
					}
				}
				return rs
			}
			for range parityRandomOps {
				p := pr.subs[0].a.Policy()
				switch op := r.IntN(100); {
				case op < 20:
					pr.clk.Advance(parityStep(r))
				case op < 40:
					k := key()
					pr.allow(live, k, parityCost(r, p, k))
				case op < 50:
					k := key()
					pr.charge(live, k, parityCost(r, p, k))
				case op < 60:
					k := key()
					pr.refund(live, k, parityCost(r, p, k))
				case op < 65:
					pr.peek(live, key())
				case op < 75:
					n := r.IntN(8)
					pr.batch(live, reqs(n), n+r.IntN(2))
				case op < 87:
					pr.allowAll(live, reqs(1+r.IntN(5)))
				case op < 92:
					pr.evict(live)
				default:
					pr.replace(live, parityPolicy(t, r, p.Version+1+r.Int64N(2)), p.Version)
				}
			}
			for _, k := range parityRandomKeys {
				pr.peek(live, k)
			}
		})
	}
}

// TestParityRandom's seeds, and operations per seed: 16 x 300 take about
// 7 s under -race, within CI's budget.
const (
	parityRandomSeeds = 16
	parityRandomOps   = 300
)

// TestParityZero: a zero Engine, a nil *Engine, a zero Store and a nil
// *Store answer every call alike, whatever the inputs and context.
func TestParityZero(t *testing.T) {
	var nilEngine *engine.Engine
	var nilStore *redisstore.Store
	pr := &parity{t: t, clk: clock.NewManual(0), subs: []paritySubject{
		{"zero engine", &engine.Engine{}, false}, {"nil engine", nilEngine, false},
		{"zero store", &redisstore.Store{}, false}, {"nil store", nilStore, false},
	}}
	live, bad := parityContexts(t)
	for _, ctx := range append([]context.Context{live}, bad...) {
		for _, key := range []string{"k", "", parityKeyOver} {
			for _, cost := range []int64{1, 0, -1, math.MaxInt64} {
				pr.allow(ctx, key, cost)
				pr.charge(ctx, key, cost)
				pr.refund(ctx, key, cost)
			}
			pr.peek(ctx, key)
		}
		reqs := []engine.Request{{Key: "k", Cost: 1}, {Key: "", Cost: 1}, {Key: "k", Cost: 0}}
		for n := range len(reqs) + 2 {
			pr.batch(ctx, reqs, n)
			pr.batch(ctx, nil, n)
		}
		pr.allowAll(ctx, nil)
		pr.allowAll(ctx, reqs)
		pr.allowAll(ctx, make([]engine.Request, engine.MaxAllowAll+1))
		pr.evict(ctx)
		pr.replace(ctx, policy.Policy{Version: 2, Capacity: 1, TokensPerSecond: 1}, 1)
		pr.replace(ctx, policy.Policy{}, 1)
		pr.close()
	}
}

// TestParityLeasedPeek: a Peek or Refund of a key whose lease holds
// tokens counts them: Allowed (a request of one token would pass, as the
// Allow that follows shows) and Remaining, even where the bucket in Redis
// is empty (an AllowAll, which goes to Redis without the lease's tokens,
// emptied it). The clock stands still, so the lease's tokens are exactly
// what Redis's answer lacks.
func TestParityLeasedPeek(t *testing.T) {
	exactBalances(t)
	p := policy.Policy{Version: 1, Capacity: 32, TokensPerSecond: 1}
	pr := newParity(t, p)
	e, leased := pr.subs[0].a, pr.subs[2].a.(*redisstore.Store)
	pr.subs = slices.Delete(pr.subs, 1, 2) // the engine and the leased store
	live, _ := parityContexts(t)
	sameBalance := func(what string, want, got outcome) {
		t.Helper()
		require.Equal(t, want.D.Remaining, got.D.Remaining, "%s: Remaining of the leased store", what)
		require.Equal(t, want.D.RetryAfter, got.D.RetryAfter, "%s: RetryAfter of the leased store", what)
	}
	peek := func(what string) {
		t.Helper()
		want := pr.peek(live, "k")
		d, err := leased.Peek(live, "k")
		sameBalance("Peek "+what, want, outcome{D: d, Err: err})
	}
	pr.allow(live, "k", 2) // Redis: 30 left, and 2 of demand
	pr.allow(live, "k", 2) // Redis: 28 left, and a lease of 2 asked for in the same call: 26
	peek("with a lease")
	require.Equal(t, uint64(2), leased.Stats().LeasedTokens, "the setup: a lease of 2 tokens")
	pr.allowAll(live, []engine.Request{{Key: "k", Cost: 26}}) // Redis: 0 left; the lease keeps its 2
	peek("of an empty bucket, the lease holding 2")
	de, errE := e.Refund(live, "k", 1)
	dl, errL := leased.Refund(live, "k", 1)
	require.NoError(t, errE)
	require.NoError(t, errL)
	require.Equal(t, estimated(de), estimated(dl), "Refund of 1 to an empty bucket, the lease holding 2")
	sameBalance("Refund of 1 to an empty bucket, the lease holding 2", outcome{D: de}, outcome{D: dl})
	pr.allow(live, "k", 1)
	peek("the lease holding 1")
	pr.allow(live, "k", 2) // the lease's 1 and the bucket's 1
	pr.allow(live, "k", 1)
	peek("of an empty bucket, and no lease")
}

// TestParityLeasedBand: a leased answer's Band and Limit are those of the
// bucket's last answer from Redis (package doc, Leases). A key of two
// bands, the primary (40, refilled in 10 ms) and "slow" (41, one a
// second): after two requests of 2 the primary binds (36 against 37) and
// a lease of 2 is granted; 10 ms later the primary is full again, so the
// engine's next request binds at "slow" (36 against 39), while the lease
// decides it as the primary last bound.
func TestParityLeasedBand(t *testing.T) {
	exactBalances(t)
	slow, err := policy.NewBands(policy.Band{Name: "slow", Capacity: 41, Refill: policy.PerSecond(1)})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 40, Refill: policy.Rate{Tokens: 40, Per: 10 * time.Millisecond}, Bands: slow}
	pr := newParity(t, p)
	e, leased := pr.subs[0].a, pr.subs[2].a.(*redisstore.Store)
	pr.subs = slices.Delete(pr.subs, 1, 2) // the engine and the leased store
	live, _ := parityContexts(t)
	pr.allow(live, "k", 2)
	require.Equal(t, "", pr.allow(live, "k", 2).D.Band, "the primary binds at 36, against slow's 37")
	pr.peek(live, "k") // settles the grant
	require.Equal(t, uint64(2), leased.Stats().LeasedTokens, "the setup: a lease of 2 tokens")
	pr.clk.Advance(10 * time.Millisecond)
	de, err := e.Allow(live, "k", 1)
	require.NoError(t, err)
	dl, err := leased.Allow(live, "k", 1)
	require.NoError(t, err)
	require.Equal(t, uint64(1), leased.Stats().Local, "the lease decided")
	require.Equal(t, []any{true, int64(1), "slow", int64(41)}, []any{de.Allowed, de.Version, de.Band, de.Limit}, "the engine")
	require.Equal(t, []any{true, int64(1), "", int64(40)}, []any{dl.Allowed, dl.Version, dl.Band, dl.Limit},
		"the leased store: the band of the bucket's last answer")
}
