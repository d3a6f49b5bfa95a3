package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/enginemodel"
	"github.com/tokenshard/tokenshard/policy"
)

// The differential check replays random single-goroutine traces on a fresh
// engine (or, with -redis, a fresh Redis store: differential_redis.go) and
// on the sequential model (internal/model), compares every answer, error,
// KeyCount and Policy after each operation, and on the first mismatch
// shrinks the trace to a short reproduction, printed as Go (policies with
// overrides included, see diffPolicy). Times are absolute instants, so
// deleting operations while shrinking never moves the others.

const (
	diffOpsPerTrace   = 200
	diffShrinkReplays = 2000             // a bound on the shrinker's work...
	diffShrinkTime    = 10 * time.Second // ...and on its wall time
)

// diffKind is the kind of one trace operation.
type diffKind uint8

const (
	diffAllow      diffKind = iota
	diffBatch               // AllowBatch
	diffShortBatch          // AllowBatch with out shorter than reqs: ErrInvalidConfig, nothing decided
	diffEvict               // EvictFull
	diffCutover             // ReplacePolicy
	diffKeys                // KeyCount and Policy only
	diffAllowAll            // AllowAll: all of reqs or none
	diffPeek
	diffRefund
	diffCharge   // Charge: tokens taken without a decision, into debt
	diffSnapshot // Snapshot, then Restore into a new engine in its place
	diffNumKinds
)

// diffOp is one operation at clock reading t.
//
// A cutover's versions are relative to the version in force when it runs
// (next.Version = current + vDelta unless vAbs; expected = current +
// eDelta), so a shrunk trace that drops an earlier cutover keeps the intent
// of the later ones (valid stays valid, stale stays stale).
type diffOp struct {
	kind     diffKind
	t        int64
	key      string
	cost     int64            // Allow's cost, Refund's and Charge's tokens
	reqs     []engine.Request // AllowBatch's and AllowAll's
	next     policy.Policy
	vAbs     bool
	vDelta   int64
	eDelta   int64
	expected int64 // set by resolve
}

// resolve fixes a cutover's versions against the version in force.
func (op diffOp) resolve(cur int64) diffOp {
	if op.kind == diffCutover {
		if !op.vAbs {
			op.next.Version = diffAdd(cur, op.vDelta)
		}
		op.expected = cur + op.eDelta // wraps past math.MaxInt64: still stale, as meant
	}
	return op
}

// diffConfig is the engine configuration of one trace.
type diffConfig struct {
	policy      policy.Policy
	shards      int
	maxKeys     int // 0 = engine default
	maxKeyBytes int // 0 = engine default
	start       int64
	regress     bool // the clock may step back: a diffClock, and always one shard
	store       bool // replayed on the Redis store: maxKeys 0, regress false, one shard
}

type diffTrace struct {
	seed uint64
	cfg  diffConfig
	ops  []diffOp
}

// diffTarget is what a trace is replayed on: the engine (reading a clock the
// replay sets) or the model (handed the same instant). Tests put a planted
// fault behind it to check that the shrinker finds it.
type diffTarget interface {
	setTime(t int64) int64 // moves the clock to t and returns its reading
	allow(key string, cost int64) (engine.Decision, error)
	allowBatch(reqs []engine.Request, out []engine.Result) error
	evictFull() (int, error)
	replacePolicy(next policy.Policy, expected int64) error
	keyCount() int
	policy() policy.Policy
	close() error
	// failed returns the first failure so far that no answer shows (a
	// Redis store's fail-closed denial, or a pass it failed after a
	// cutover), or nil. A *diffUnreachable is the harness's failure, not
	// the target's: it could not be reached or could not serve, so the
	// answers given meanwhile prove nothing. Any other is a wrong answer.
	failed() error
}

// diffAllAllower is a target with AllowAll, and diffInspector one with
// Peek and Refund: the engine, the model and the Redis store. A replay on a
// target without one answers "unsupported".
type diffAllAllower interface {
	allowAll(reqs []engine.Request) (engine.Decision, int, error)
}

type diffInspector interface {
	peek(key string) (engine.Decision, error)
	refund(key string, tokens int64) (engine.Decision, error)
}

// diffCharger is a target with Charge (the engine, the model and the Redis
// store), and diffSnapshotter one that can snapshot itself and carry on as
// the engine restored from it: the engine and the model (for which it
// changes nothing: a restore at the reading of the snapshot gives back
// every balance, debts included). Traces for the Redis store have no
// snapshots.
type diffCharger interface {
	charge(key string, tokens int64) (engine.Decision, error)
}

type diffSnapshotter interface {
	snapshotRestore() error
}

// diffUnreachable is a target that could not be reached or could not serve
// (Redis down, slow, loading, out of memory): the harness's trouble.
type diffUnreachable struct{ err error }

func (e *diffUnreachable) Error() string { return "unreachable: " + e.err.Error() }
func (e *diffUnreachable) Unwrap() error { return e.err }

// diffMaker builds the target under test for a configuration; c may be nil.
type diffMaker func(cfg diffConfig, c *counters) (diffTarget, error)

// diffClock is a Clock that reads whatever it was last set to, backwards
// included: the Manual clock refuses to step back.
type diffClock struct{ now atomic.Int64 }

func (c *diffClock) Now() int64 { return c.now.Load() }

// diffEngine is a real engine behind diffTarget.
type diffEngine struct {
	e      *engine.Engine
	cfg    engine.Config // what e was made with: snapshotRestore makes the next one
	manual *clock.Manual // nil when back is used
	back   *diffClock
	c      *counters
}

func diffNewEngine(cfg diffConfig, c *counters) (diffTarget, error) {
	d := &diffEngine{c: c}
	ec := engine.Config{Policy: cfg.policy, Shards: cfg.shards, MaxKeys: cfg.maxKeys, MaxKeyBytes: cfg.maxKeyBytes}
	if cfg.regress {
		d.back = &diffClock{}
		d.back.now.Store(cfg.start)
		ec.Clock = d.back
	} else {
		d.manual = clock.NewManual(cfg.start)
		ec.Clock = d.manual
	}
	e, err := engine.New(ec)
	if err != nil {
		return nil, err
	}
	d.e, d.cfg = e, ec
	return d, nil
}

func (d *diffEngine) setTime(t int64) int64 {
	if d.back != nil {
		d.back.now.Store(t)
		return t
	}
	return diffAdvance(d.manual, t)
}

// diffAdvance moves m forward to t (never back) and returns its reading.
func diffAdvance(m *clock.Manual, t int64) int64 {
	cur := m.Now()
	switch {
	case t == math.MaxInt64 && cur > 0:
		m.Advance(math.MaxInt64) // through Manual's saturation, on purpose
	case t > cur:
		m.Advance(time.Duration(t - cur))
	}
	return m.Now()
}

func (d *diffEngine) allow(key string, cost int64) (engine.Decision, error) {
	dec, err := d.e.Allow(context.Background(), key, cost)
	d.record(key, dec, err)
	return dec, err
}

func (d *diffEngine) allowBatch(reqs []engine.Request, out []engine.Result) error {
	err := d.e.AllowBatch(context.Background(), reqs, out)
	if len(out) >= len(reqs) {
		for i, r := range out[:len(reqs)] {
			d.record(reqs[i].Key, r.Decision, r.Err)
		}
	}
	return err
}

// record counts one answer, and whether it was decided under an override
// (one goroutine replays a trace: the policy read now is the one that decided).
func (d *diffEngine) record(key string, dec engine.Decision, err error) {
	diffRecord(d.c, d.e.Policy, key, dec, err)
}

// diffRecord counts one answer into c (if not nil), whether it was decided
// under an override of the policy pol returns, and its limit's shape.
func diffRecord(c *counters, pol func() policy.Policy, key string, dec engine.Decision, err error) {
	if c == nil {
		return
	}
	c.record(dec, err)
	if err != nil {
		return
	}
	p := pol()
	if overridden(p, key) {
		c.overridden.Add(1)
	}
	recordShape(c, shapeOf(p, key), dec.Band)
}

func (d *diffEngine) allowAll(reqs []engine.Request) (engine.Decision, int, error) {
	dec, at, err := d.e.AllowAll(context.Background(), reqs)
	key := ""
	if at >= 0 && at < len(reqs) {
		key = reqs[at].Key
	}
	d.record(key, dec, err)
	return dec, at, err
}

func (d *diffEngine) peek(key string) (engine.Decision, error) {
	return d.e.Peek(context.Background(), key)
}

func (d *diffEngine) refund(key string, tokens int64) (engine.Decision, error) {
	return d.e.Refund(context.Background(), key, tokens)
}

func (d *diffEngine) charge(key string, tokens int64) (engine.Decision, error) {
	dec, err := d.e.Charge(context.Background(), key, tokens)
	if d.c != nil && err == nil {
		d.c.charges.Add(1)
		if dec.Remaining < 0 {
			d.c.debts.Add(1)
		}
	}
	return dec, err
}

// snapshotRestore snapshots the engine, closes it, and restores the
// snapshot into a new engine of the same configuration and policy, on the
// same clock, which replaces it. A trace has it only on a clock that never
// steps back (see diffGen.op).
func (d *diffEngine) snapshotRestore() error {
	var buf bytes.Buffer
	if err := d.e.Snapshot(context.Background(), &buf); err != nil {
		return err
	}
	cfg := d.cfg
	cfg.Policy = d.e.Policy()
	if err := d.e.Close(); err != nil {
		return err
	}
	e, _, err := engine.Restore(cfg, &buf, engine.RestoreOptions{})
	if err != nil {
		return err
	}
	d.e = e
	if d.c != nil {
		d.c.restores.Add(1)
	}
	return nil
}

func (d *diffEngine) evictFull() (int, error) { return d.e.EvictFull(context.Background()) }
func (d *diffEngine) replacePolicy(next policy.Policy, expected int64) error {
	err := d.e.ReplacePolicy(context.Background(), next, expected)
	diffCountCutover(d.c, err)
	return err
}

func (d *diffEngine) keyCount() int         { return d.e.KeyCount() }
func (d *diffEngine) policy() policy.Policy { return d.e.Policy() }
func (d *diffEngine) close() error          { return d.e.Close() }
func (d *diffEngine) failed() error         { return nil }

// diffCountCutover counts a target's ReplacePolicy for the report: a
// success, or a refusal as stale.
func diffCountCutover(c *counters, err error) {
	switch {
	case c == nil:
	case err == nil:
		c.cutovers.Add(1)
	case errors.Is(err, engine.ErrStalePolicy):
		c.stale.Add(1)
	}
}

// diffModel is the specification behind diffTarget.
type diffModel struct {
	m   *enginemodel.Model
	now int64
}

func (d *diffModel) setTime(t int64) int64 { d.now = t; return t }
func (d *diffModel) allow(key string, cost int64) (engine.Decision, error) {
	return d.m.Allow(d.now, key, cost)
}
func (d *diffModel) allowBatch(reqs []engine.Request, out []engine.Result) error {
	if len(out) < len(reqs) {
		return engine.ErrInvalidConfig // an out shorter than reqs: nothing is decided
	}
	copy(out, d.m.AllowBatch(d.now, reqs))
	return nil
}
func (d *diffModel) allowAll(reqs []engine.Request) (engine.Decision, int, error) {
	return d.m.AllowAll(d.now, reqs)
}
func (d *diffModel) peek(key string) (engine.Decision, error) { return d.m.Peek(d.now, key) }
func (d *diffModel) refund(key string, tokens int64) (engine.Decision, error) {
	return d.m.Refund(d.now, key, tokens)
}
func (d *diffModel) charge(key string, tokens int64) (engine.Decision, error) {
	return d.m.Charge(d.now, key, tokens)
}
func (d *diffModel) snapshotRestore() error  { return nil }
func (d *diffModel) evictFull() (int, error) { return d.m.EvictFull(d.now) }
func (d *diffModel) replacePolicy(next policy.Policy, expected int64) error {
	return d.m.ReplacePolicy(d.now, next, expected)
}
func (d *diffModel) keyCount() int         { return d.m.KeyCount() }
func (d *diffModel) policy() policy.Policy { return d.m.Policy() }
func (d *diffModel) close() error          { return nil }
func (d *diffModel) failed() error         { return nil }

// diffSentinels name the errors an answer may carry; errors are compared by
// which of these they match (wrapped or not), never by their text.
var diffSentinels = []struct {
	name string
	err  error
}{
	{"ErrInvalidKey", engine.ErrInvalidKey},
	{"ErrCostExceedsCapacity", engine.ErrCostExceedsCapacity}, // before ErrInvalidCost, which it wraps
	{"ErrInvalidCost", engine.ErrInvalidCost},
	{"ErrKeyCapacity", engine.ErrKeyCapacity},
	{"ErrStalePolicy", engine.ErrStalePolicy},
	{"ErrClockRegression", engine.ErrClockRegression},
	{"ErrClosed", engine.ErrClosed},
	{"ErrInvalidConfig", engine.ErrInvalidConfig},
	{"ErrInvalidPolicy", engine.ErrInvalidPolicy},
	{"ErrAllowAllSize", engine.ErrAllowAllSize},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
}

func diffErr(err error) string {
	if err == nil {
		return "nil"
	}
	for _, s := range diffSentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return fmt.Sprintf("unexpected error %q", err.Error())
}

// diffDecision renders one answer; an error must come with the zero
// Decision. Band is shown when it is not "", the policy's own primary band.
func diffDecision(d engine.Decision, err error) string {
	band := ""
	if d.Band != "" {
		band = fmt.Sprintf(" Band:%q", d.Band)
	}
	s := fmt.Sprintf("{Allowed:%t Remaining:%d RetryAfter:%d Version:%d Limit:%d ResetAfter:%d%s}",
		d.Allowed, d.Remaining, int64(d.RetryAfter), d.Version, d.Limit, int64(d.ResetAfter), band)
	switch {
	case err == nil:
		return s
	case d == engine.Decision{}:
		return diffErr(err)
	}
	return diffErr(err) + " with decision " + s
}

// diffUntouched pre-fills batch results, so a result nobody wrote shows.
var diffUntouched = engine.Result{Decision: engine.Decision{Remaining: -1, Version: -1}}

// diffAnswer is one operation's answer, rendered for comparison: items are a
// batch's per-request results, result the call's own return, at the index
// AllowAll returned (rendered, and compared, only for AllowAll), state
// KeyCount and Policy afterwards.
type diffAnswer struct {
	items  []string
	result string
	at     int
	all    bool // an AllowAll's answer: at counts
	state  string
}

func (a diffAnswer) String() string {
	s := a.result
	if a.items != nil {
		s = "[" + strings.Join(a.items, ", ") + "] " + a.result
	}
	if a.all {
		s += fmt.Sprintf(" at %d", a.at)
	}
	return s + "; " + a.state
}

func diffApply(tg diffTarget, op diffOp) diffAnswer {
	var a diffAnswer
	switch op.kind {
	case diffAllow:
		a.result = diffDecision(tg.allow(op.key, op.cost))
	case diffBatch, diffShortBatch:
		out := make([]engine.Result, len(op.reqs))
		if op.kind == diffShortBatch {
			out = out[:len(out)-1]
		}
		for i := range out {
			out[i] = diffUntouched
		}
		err := tg.allowBatch(op.reqs, out)
		a.items = make([]string, len(out))
		for i, r := range out {
			a.items[i] = diffDecision(r.Decision, r.Err)
		}
		a.result = diffErr(err)
	case diffEvict:
		n, err := tg.evictFull()
		a.result = fmt.Sprintf("%d, %s", n, diffErr(err))
	case diffCutover:
		a.result = diffErr(tg.replacePolicy(op.next, op.expected))
	case diffKeys:
		a.result = "ok"
	case diffAllowAll:
		a.all = true
		if t, ok := tg.(diffAllAllower); ok {
			d, at, err := t.allowAll(op.reqs)
			a.result, a.at = diffDecision(d, err), at
		} else {
			a.result = "unsupported"
		}
	case diffPeek, diffRefund:
		t, ok := tg.(diffInspector)
		switch {
		case !ok:
			a.result = "unsupported"
		case op.kind == diffPeek:
			a.result = diffDecision(t.peek(op.key))
		default:
			a.result = diffDecision(t.refund(op.key, op.cost))
		}
	case diffCharge:
		if t, ok := tg.(diffCharger); ok {
			a.result = diffDecision(t.charge(op.key, op.cost))
		} else {
			a.result = "unsupported"
		}
	case diffSnapshot:
		if t, ok := tg.(diffSnapshotter); ok {
			a.result = diffErr(t.snapshotRestore())
		} else {
			a.result = "unsupported"
		}
	}
	// Policy as it was given: a TokensPerSecond policy never comes back
	// as its Refill, nor the other way round.
	a.state = fmt.Sprintf("keys=%d policy={%s}", tg.keyCount(), policyText(tg.policy()))
	return a
}

func diffQuote(k string) string {
	if len(k) > 12 && strings.Count(k, k[:1]) == len(k) {
		return fmt.Sprintf("strings.Repeat(%q, %d)", k[:1], len(k))
	}
	return fmt.Sprintf("%q", k)
}

// diffPolicy prints p as the Go expression that builds it; overrides are
// built with mustOverrides, policy.NewOverrideSet with its error checked,
// and bands with mustBands, policy.NewBands likewise. A rate is printed as
// it was given, TokensPerSecond or Refill.
func diffPolicy(p policy.Policy) string {
	s := fmt.Sprintf("policy.Policy{Version: %d, Capacity: %d, %s", p.Version, p.Capacity, goLimitRate(p.TokensPerSecond, p.Refill))
	if p.Bands.Len() > 0 {
		s += ", Bands: " + goBands(p.Bands)
	}
	if p.Overrides.Len() > 0 {
		os := p.Overrides.Overrides()
		parts := make([]string, len(os))
		for i, o := range os {
			parts[i] = fmt.Sprintf("policy.Override{Match: %s, Capacity: %d, %s", diffQuote(o.Match), o.Capacity, goLimitRate(o.TokensPerSecond, o.Refill))
			if o.Bands.Len() > 0 {
				parts[i] += ", Bands: " + goBands(o.Bands)
			}
			if o.Name != "" {
				parts[i] += fmt.Sprintf(", Name: %q", o.Name)
			}
			parts[i] += "}"
		}
		s += ", Overrides: mustOverrides(" + strings.Join(parts, ", ") + ")"
	}
	return s + "}"
}

func (op diffOp) String() string {
	switch op.kind {
	case diffAllow:
		return fmt.Sprintf("Allow(%s, %d)", diffQuote(op.key), op.cost)
	case diffBatch, diffShortBatch:
		reqs := make([]string, len(op.reqs))
		for i, r := range op.reqs {
			reqs[i] = fmt.Sprintf("{%s, %d}", diffQuote(r.Key), r.Cost)
		}
		s := "AllowBatch([" + strings.Join(reqs, " ") + "]"
		if op.kind == diffShortBatch {
			s += fmt.Sprintf(", out of len %d", len(op.reqs)-1)
		}
		return s + ")"
	case diffAllowAll:
		reqs := make([]string, len(op.reqs))
		for i, r := range op.reqs {
			reqs[i] = fmt.Sprintf("{%s, %d}", diffQuote(r.Key), r.Cost)
		}
		if len(op.reqs) > 8 && slices.IndexFunc(op.reqs, func(r engine.Request) bool { return r != op.reqs[0] }) < 0 {
			return fmt.Sprintf("AllowAll(%d x %s)", len(op.reqs), reqs[0])
		}
		return "AllowAll([" + strings.Join(reqs, " ") + "])"
	case diffPeek:
		return fmt.Sprintf("Peek(%s)", diffQuote(op.key))
	case diffRefund:
		return fmt.Sprintf("Refund(%s, %d)", diffQuote(op.key), op.cost)
	case diffCharge:
		return fmt.Sprintf("Charge(%s, %d)", diffQuote(op.key), op.cost)
	case diffSnapshot:
		return "Snapshot(), then Restore() into a new engine"
	case diffEvict:
		return "EvictFull()"
	case diffCutover:
		return fmt.Sprintf("ReplacePolicy(%s, %d)", diffPolicy(op.next), op.expected)
	}
	return "KeyCount(), Policy()"
}

func (cfg diffConfig) String() string {
	if cfg.store {
		return fmt.Sprintf("redisstore.New(ctx, redisstore.Config{Client: c, Prefix: fresh, Policy: %s, MaxKeyBytes: %d, Clock: clock.NewManual(%d)})",
			diffPolicy(cfg.policy), cfg.maxKeyBytes, cfg.start)
	}
	clk := fmt.Sprintf("clock.NewManual(%d)", cfg.start)
	if cfg.regress {
		clk = "a Clock that may step back, set to each t below"
	}
	return fmt.Sprintf("engine.New(engine.Config{Policy: %s, Shards: %d, MaxKeys: %d, MaxKeyBytes: %d, Clock: %s})",
		diffPolicy(cfg.policy), cfg.shards, cfg.maxKeys, cfg.maxKeyBytes, clk)
}

// overridesNote is a comment for the configuration line of a trace whose
// policies carry overrides or bands: where mustOverrides and mustBands come
// from.
func (tr diffTrace) overridesNote() string {
	overrides, bands := false, false
	for _, p := range tr.policies() {
		overrides = overrides || p.Overrides.Len() > 0
		bands = bands || p.Bands.Len() > 0
		for _, o := range p.Overrides.Overrides() {
			bands = bands || o.Bands.Len() > 0
		}
	}
	var notes []string
	if overrides {
		notes = append(notes, "mustOverrides: policy.NewOverrideSet, its error checked (stress/overrides.go)")
	}
	if bands {
		notes = append(notes, "mustBands: policy.NewBands, its error checked (stress/bands.go)")
	}
	if len(notes) == 0 {
		return ""
	}
	return " // " + strings.Join(notes, "; ")
}

// policies returns the trace's first policy and every cutover's next.
func (tr diffTrace) policies() []policy.Policy {
	ps := []policy.Policy{tr.cfg.policy}
	for _, op := range tr.ops {
		if op.kind == diffCutover {
			ps = append(ps, op.next)
		}
	}
	return ps
}

// diffAmbiguous reports whether a batch could hit the key bound on more than
// one shard: which of a batch's new keys on different shards meet the key
// bound first is not specified, so such a batch has no single right answer
// to compare with.
func diffAmbiguous(m *enginemodel.Model, cfg diffConfig, reqs []engine.Request) bool {
	if cfg.shards == 1 {
		return false
	}
	maxKeys, maxKeyBytes := diffBounds(cfg)
	seen := map[string]bool{}
	for _, r := range reqs {
		if diffValidKey(r.Key, maxKeyBytes) && !seen[r.Key] {
			if _, ok := m.Bucket(r.Key); !ok {
				seen[r.Key] = true
			}
		}
	}
	return m.KeyCount()+len(seen) > maxKeys
}

// diffAllAnyNewKey returns, for an AllowAll on an engine of several
// shards, the indexes of reqs that are the first request of a key m does
// not track (else nil). Such an engine reserves room for new keys shard by
// shard, in the order of their numbers, which the model does not know: when
// there is no room for them all, ErrKeyCapacity at any of those is right.
func diffAllAnyNewKey(m *enginemodel.Model, cfg diffConfig, op diffOp) map[int]bool {
	if op.kind != diffAllowAll || cfg.shards == 1 {
		return nil
	}
	_, maxKeyBytes := diffBounds(cfg)
	first := map[int]bool{}
	seen := map[string]bool{}
	for i, r := range op.reqs {
		if _, ok := m.Bucket(r.Key); !ok && !seen[r.Key] && diffValidKey(r.Key, maxKeyBytes) {
			first[i] = true
		}
		seen[r.Key] = true
	}
	return first
}

func diffBounds(cfg diffConfig) (maxKeys, maxKeyBytes int) {
	maxKeys, maxKeyBytes = cfg.maxKeys, cfg.maxKeyBytes
	if maxKeys == 0 {
		maxKeys = engine.DefaultMaxKeys
	}
	if maxKeyBytes == 0 {
		maxKeyBytes = engine.DefaultMaxKeyBytes
	}
	return maxKeys, maxKeyBytes
}

func diffValidKey(k string, maxKeyBytes int) bool {
	return strings.TrimSpace(k) != "" && len(k) <= maxKeyBytes
}

// diffFailure is the first mismatch of a replay.
type diffFailure struct {
	index     int // of the failing op
	op        diffOp
	key       string
	want, got string
}

// diffOutcome is one replay: fail is nil if engine and model agreed on every
// op; valid is false if the trace left what the contract specifies (then it
// proves nothing either way); lines render the ops replayed, when asked.
type diffOutcome struct {
	fail  *diffFailure
	valid bool
	lines []string
}

// diffReplay runs tr on a fresh model and a fresh target from mk, comparing
// after every op and stopping at the first mismatch. The error is the
// harness's own (the target could not be built, answer or be closed).
func diffReplay(tr diffTrace, mk diffMaker, c *counters, render bool) (out diffOutcome, err error) {
	tg, err := mk(tr.cfg, c)
	if err != nil {
		return out, err
	}
	defer func() {
		if cerr := tg.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	ref := &diffModel{m: enginemodel.New(tr.cfg.policy, tr.cfg.maxKeys, tr.cfg.maxKeyBytes), now: tr.cfg.start}
	for i, op := range tr.ops {
		if op.kind == diffBatch && diffAmbiguous(ref.m, tr.cfg, op.reqs) {
			return diffOutcome{lines: out.lines}, nil
		}
		op = op.resolve(ref.m.Policy().Version)
		ref.setTime(op.t)
		if got := tg.setTime(op.t); got != op.t {
			out.fail = &diffFailure{index: i, op: op, key: op.key, want: fmt.Sprintf("clock reads %d", op.t), got: fmt.Sprintf("clock reads %d", got)}
			if render {
				out.lines = append(out.lines, fmt.Sprintf("t=%d %s\n    want %s\n    got  %s", op.t, op, out.fail.want, out.fail.got))
			}
			break
		}
		anyNew := diffAllAnyNewKey(ref.m, tr.cfg, op)
		want, got := diffApply(ref, op), diffApply(tg, op)
		if anyNew != nil && want.result == "ErrKeyCapacity" && got.result == want.result && anyNew[got.at] {
			got.at = want.at // either is right: see diffAllAnyNewKey
		}
		if err := tg.failed(); errors.As(err, new(*diffUnreachable)) {
			return diffOutcome{lines: out.lines}, fmt.Errorf("differential: seed %d, op %d (t=%d %s): %w", tr.seed, i, op.t, op, err)
		} else if err != nil {
			got.result += ", but failed: " + err.Error()
		}
		if f := diffCompare(i, op, want, got); f != nil {
			out.fail = f
			if render {
				out.lines = append(out.lines, fmt.Sprintf("t=%d %s\n    want %s\n    got  %s", op.t, op, want, got))
			}
			break
		}
		if render {
			out.lines = append(out.lines, fmt.Sprintf("t=%d %s -> %s", op.t, op, want))
		}
	}
	out.valid = true
	return out, nil
}

// diffCompare returns the mismatch between two answers, naming the first
// differing request of a batch, or nil.
func diffCompare(i int, op diffOp, want, got diffAnswer) *diffFailure {
	f := &diffFailure{index: i, op: op, key: op.key}
	if want.all && len(op.reqs) > 0 {
		f.key = op.reqs[max(want.at, 0)].Key // the binding request's, or the one at fault
	}
	for j := range max(len(want.items), len(got.items)) {
		if j >= len(want.items) || j >= len(got.items) || want.items[j] != got.items[j] {
			f.key = op.reqs[j].Key
			f.want, f.got = fmt.Sprintf("reqs[%d]: %s", j, diffItem(want.items, j)), fmt.Sprintf("reqs[%d]: %s", j, diffItem(got.items, j))
			return f
		}
	}
	switch {
	case want.result != got.result || want.at != got.at:
		f.want, f.got = want.result, got.result
		if want.all {
			f.want, f.got = fmt.Sprintf("%s at %d", want.result, want.at), fmt.Sprintf("%s at %d", got.result, got.at)
		}
	case want.state != got.state:
		f.want, f.got = "afterwards "+want.state, "afterwards "+got.state
	default:
		return nil
	}
	return f
}

func diffItem(items []string, j int) string {
	if j < len(items) {
		return items[j]
	}
	return "no result"
}

// diffCheck replays tr and, on a mismatch, shrinks it and explains it.
func diffCheck(tr diffTrace, mk diffMaker, c *counters) error {
	return diffCheckAs(tr, mk, c, "")
}

// diffCheckAs is diffCheck for a target the command selects with flags
// (such as "-redis 127.0.0.1:6379"), which the reproduction line repeats.
func diffCheckAs(tr diffTrace, mk diffMaker, c *counters, flags string) error {
	out, err := diffReplay(tr, mk, c, false)
	switch {
	case err != nil:
		return err
	case !out.valid:
		return fmt.Errorf("differential: seed %d made a batch that may hit the key bound on several shards, where which new keys get the last slots is not specified", tr.seed)
	case out.fail == nil:
		return nil
	}
	small, replays := diffShrink(tr, mk)
	rep, err := diffReplay(small, mk, nil, true)
	if err != nil {
		return err
	}
	note := ""
	if !rep.valid || rep.fail == nil { // a flaky failure: report the unshrunk one
		note = " (the shrunk trace did not fail again; this is the original)"
		small = tr
		if rep, err = diffReplay(tr, mk, nil, true); err != nil {
			return err
		}
		if rep.fail == nil {
			rep.fail = out.fail
		}
	}
	f := rep.fail
	var b strings.Builder
	if flags == "" {
		fmt.Fprintf(&b, "reproduce: go run ./stress -check differential -seed %d (its first trace; same -shards)\n", tr.seed)
	} else {
		fmt.Fprintf(&b, "reproduce: go run ./stress -check differential %s -seed %d (its first trace)\n", flags, tr.seed)
	}
	fmt.Fprintf(&b, "shrunk from %d ops (failing at op %d) to %d in %d replays%s:\n", len(tr.ops), out.fail.index, len(small.ops), replays, note)
	fmt.Fprintf(&b, "  %s%s\n", small.cfg, small.overridesNote())
	for _, l := range rep.lines {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return &Violation{
		Check:  "differential",
		Key:    f.key,
		Op:     fmt.Sprintf("t=%d %s", f.op.t, f.op),
		Want:   f.want,
		Got:    f.got,
		Seed:   tr.seed,
		Detail: strings.TrimRight(b.String(), "\n"),
	}
}

// runDifferential replays traces seeded o.seed, o.seed+1, ... on fresh
// engines (or, with -redis, fresh Redis stores: runDifferentialRedis) until
// ctx ends or one disagrees with the model. ctx is checked between traces
// (each takes milliseconds); a failing trace is shrunk even if ctx ends
// meanwhile, within diffShrinkTime, because a violation without its
// reproduction is worth much less.
func runDifferential(ctx context.Context, o options, c *counters) error {
	if o.redis != "" || o.redisCluster != "" {
		return runDifferentialRedis(ctx, o, c)
	}
	shards := []int{1, 2, 16}
	if o.shards > 0 && !slices.Contains(shards, o.shards) {
		shards = append(shards, o.shards)
	}
	for i := uint64(0); ctx.Err() == nil; i++ {
		tr := diffGenerate(o.seed+i, shards, diffOpsPerTrace)
		if err := diffCheck(tr, diffNewEngine, c); err != nil {
			return err
		}
		c.traces.Add(1)
	}
	return nil
}
