package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	mrand "math/rand" // for rand.Zipf, which math/rand/v2 does not have
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// Conservation under the real monotonic clock, and the
// command's main load: o.workers goroutines call Allow, AllowBatch and
// AllowAll over a Zipf-skewed key set while a coordinator cuts over policies
// (stale attempts included) and sweeps. An admitted AllowAll counts every
// request's cost toward its key's admitted total, as the Allows of its keys'
// summed costs would. Three invariants:
//
//	(a) no key is admitted more than any band of its policy history could
//	    have granted (the bound, band by band across cutovers, and why it
//	    is sound: conservation_bound.go);
//	(b) Band names a band of the key's own limit under the policy version
//	    the decision names, Limit is that band's capacity, and Remaining
//	    never exceeds it; the retry and reset estimates are consistent with
//	    Remaining and that band's rate; a cost is refused as invalid only
//	    above the smallest capacity of the limit's bands;
//	(c) a decision's version was attempted by the coordinator and did not
//	    fail, and is at least the version whose ReplacePolicy returned
//	    before the call started.

// Policy parameters stay at or below these: large enough to be generous for
// a while, small enough that the load runs dry and refills. (The checks are
// exact for any int64.)
const (
	consMaxCapacity = 1_000_000_000
	consMaxRate     = 1_000_000_000
)

// consUnits is units per token of a rate per second: a rate of r tokens/s
// adds r units per ns.
const consUnits = policy.UnitsPerToken

// consInitial is the policy the engine starts with: the hottest key and one
// class of keys have limits of their own.
var consInitial = policy.Policy{Version: 1, Capacity: 50, TokensPerSecond: 100, Overrides: mustOverrides(
	policy.Override{Match: consHot, Capacity: 20, TokensPerSecond: 300},
	policy.Override{Match: "A*", Capacity: 5, TokensPerSecond: 40})}

// Key names sort keys into classes that every policy the check draws gives
// one limit (consClassOf): the hottest key, "hot", alone, so overrides may
// name it exactly; the others "A1A", "B2B", ..., "E5E", "A6A", ..., one
// class per letter, which patterns select whole (consMatches).
const (
	consHot     = "hot"
	consLetters = "ABCDE"
)

// consName is the name of key i (0 is the hottest under the Zipf draw).
func consName(i int) string {
	if i == 0 {
		return consHot
	}
	c := string(consLetters[(i-1)%len(consLetters)])
	return c + strconv.Itoa(i) + c
}

// consClassOf names the class of a key: its letter for "X<n>X", else the
// key itself, a class of one.
func consClassOf(name string) string {
	if n := len(name); n >= 2 && name[0] >= 'A' && name[0] <= 'Z' && name[n-1] == name[0] {
		return name[:1]
	}
	return name
}

// consMatches are the Matches of the overrides the check draws: the hottest
// key exactly, and patterns with '*' first, inside, last and around, each of
// which matches every key of a class or none of it ("E" has no pattern of
// its own: only "*" moves it), so the keys of a class always share a limit.
var consMatches = []string{consHot, "A*", "*B", "C*C", "*D*", "A*A", "*", "zz*"}

// States of a consVersion.
const (
	consPending int32 = iota
	consInstalled
	consFailed
)

// consVersion is one policy version the coordinator attempted to install.
type consVersion struct {
	pol    policy.Policy
	shapes []policy.Shape // by key class: the limit pol gives its keys
	state  atomic.Int32
	seen   atomic.Bool // some decision named this version
}

// consRegistry is the coordinator's log of versions, readable by workers.
// A version is registered before ReplacePolicy is called (the engine may
// answer with it before the call returns) and marked failed if the call
// fails.
type consRegistry struct {
	vers    atomic.Pointer[[]*consVersion] // indexed by version; nil: never attempted
	backing []*consVersion                 // owned by the coordinator
	inForce atomic.Int64                   // version of the last ReplacePolicy that returned nil
	seq     atomic.Int64                   // odd while an attempt with a fresh version is in flight
	reps    []string                       // a key of each class, by class index; set before any register
}

func (r *consRegistry) register(p policy.Policy) *consVersion {
	v := &consVersion{pol: p}
	for _, k := range r.reps {
		v.shapes = append(v.shapes, shapeOf(p, k))
	}
	for int64(len(r.backing)) <= p.Version {
		r.backing = append(r.backing, nil)
	}
	r.backing[p.Version] = v
	// Workers read only up to the length they loaded, so appending in place
	// before publishing the longer slice races with nobody.
	s := r.backing[:len(r.backing):len(r.backing)]
	r.vers.Store(&s)
	return v
}

func (r *consRegistry) lookup(version int64) *consVersion {
	vs := *r.vers.Load()
	if version < 1 || version >= int64(len(vs)) {
		return nil
	}
	return vs[version]
}

// consWorker is one load goroutine's state.
type consWorker struct {
	seg     atomic.Int64 // its admissions in segments below seg are flushed; MaxInt64 when done
	cur     int64        // segment acc belongs to
	acc     []int64      // tokens admitted per key in segment cur
	touched []int32      // keys with acc != 0
	rng     *rand.Rand
	zipf    *mrand.Zipf
	seen    int64 // r.seen as read before the call being checked
	reqs    []engine.Request
	idx     []int32
	out     []engine.Result
}

// consRun is one conservation run.
type consRun struct {
	o     options
	c     *counters
	eng   *engine.Engine
	clk   *clock.Monotonic
	names []string
	class []int // by key: its class in the ledger and in consVersion.shapes
	reg   consRegistry

	seg     atomic.Int64 // current segment, published after its boundary
	closing atomic.Bool  // set before Close: from then on ErrClosed is expected
	// seen is the highest version any call (a decision, a Policy read) has
	// reported, raised only after that call returned: a call that reads it
	// before it starts must report at least that version.
	seen atomic.Int64

	mu      sync.Mutex
	pending map[int64]map[int32]int64 // segment -> key -> tokens, flushed by workers

	workers []*consWorker
	ledger  *consLedger // coordinator only
	rng     *rand.Rand  // coordinator only
	lastBnd time.Time   // coordinator only: when the last boundary was made

	first  atomic.Pointer[Violation]
	cancel context.CancelFunc
}

// runConservation runs the conservation load until ctx ends, then closes its
// engine and returns the first violation, if any. It leaves no goroutine.
func runConservation(ctx context.Context, o options, c *counters) error {
	clk := clock.NewMonotonic()
	eng, err := engine.New(engine.Config{Policy: consInitial, MaxKeys: o.maxKeys, Shards: o.shards, Clock: clk})
	if err != nil {
		return fmt.Errorf("conservation: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &consRun{
		o: o, c: c, eng: eng, clk: clk,
		names:   make([]string, o.keys),
		pending: map[int64]map[int32]int64{},
		rng:     rand.New(rand.NewPCG(o.seed, 0xc0)),
		cancel:  cancel,
	}
	for i := range r.names {
		r.names[i] = consName(i)
	}
	r.ledger = newConsLedger(consInitial, r.names, o.seed)
	for _, k := range r.ledger.keys {
		r.class = append(r.class, k.class)
	}
	for _, c := range r.ledger.classes {
		r.reg.reps = append(r.reg.reps, c.rep)
	}
	r.reg.register(consInitial).state.Store(consInstalled)
	r.reg.inForce.Store(consInitial.Version)

	var wg sync.WaitGroup
	for i := range o.workers {
		w := &consWorker{
			acc:  make([]int64, o.keys),
			rng:  rand.New(rand.NewPCG(o.seed, uint64(i)+1)),
			zipf: mrand.NewZipf(mrand.New(mrand.NewSource(int64(o.seed)+int64(i))), 1.1, 1, uint64(o.keys-1)),
			out:  make([]engine.Result, consMaxBatch),
		}
		r.workers = append(r.workers, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(w)
		}()
	}

	r.coordinate(ctx)
	r.closing.Store(true)
	_ = eng.Close() // in-flight calls get their answers or ErrClosed
	wg.Wait()
	if v := r.first.Load(); v != nil {
		return v
	}
	// Every worker has flushed and exited: finalize the rest.
	r.finalizeReady()
	if v := r.first.Load(); v != nil {
		return v
	}
	return nil
}

// fail records v if it is the first violation and stops the run.
func (r *consRun) fail(v *Violation) {
	v.Check, v.Seed = "conservation", r.o.seed
	r.first.CompareAndSwap(nil, v)
	r.cancel()
}

const consMaxBatch = 32

// work is one load goroutine: Allow, AllowBatch and AllowAll until the
// engine closes.
func (r *consRun) work(w *consWorker) {
	defer func() {
		r.flush(w)
		w.seg.Store(math.MaxInt64)
	}()
	// Calls do not take the run's context: they go on until Close, so Close
	// is exercised with requests in flight.
	bg := context.Background()
	for !r.closing.Load() && r.first.Load() == nil {
		if g := r.seg.Load(); g != w.cur {
			r.flush(w)
			w.cur = g
			w.seg.Store(g)
		}
		q1 := r.reg.seq.Load()
		floor := r.reg.inForce.Load()
		if v := r.checkPolicy(); v != nil {
			r.fail(v)
			return
		}
		w.seen = r.seen.Load()
		x := w.rng.IntN(20)
		if x < 3 {
			if v := r.allowAll(w, q1, floor); v != nil {
				r.fail(v)
				return
			}
			continue
		}
		if x < 14 {
			k := int32(w.zipf.Uint64())
			cost := w.cost()
			d, err := r.eng.Allow(bg, r.names[k], cost)
			r.c.record(d, err)
			certain := q1 == r.reg.seq.Load() && q1%2 == 0
			if v := r.checkResult(w, k, cost, d, err, certain, floor); v != nil {
				v.Op = fmt.Sprintf("Allow(cost %d)", cost) + v.Op
				r.fail(v)
				return
			}
			continue
		}
		n := 1 + w.rng.IntN(consMaxBatch)
		w.reqs, w.idx = w.reqs[:0], w.idx[:0]
		for i := range n {
			k := int32(w.zipf.Uint64())
			if i > 0 && w.rng.IntN(4) == 0 { // repeat a key of this batch
				k = w.idx[w.rng.IntN(i)]
			}
			w.idx = append(w.idx, k)
			w.reqs = append(w.reqs, engine.Request{Key: r.names[k], Cost: w.cost()})
		}
		err := r.eng.AllowBatch(bg, w.reqs, w.out)
		certain := q1 == r.reg.seq.Load() && q1%2 == 0
		if err != nil && !(errors.Is(err, engine.ErrClosed) && r.closing.Load()) {
			r.fail(&Violation{Key: r.names[w.idx[0]], Op: fmt.Sprintf("AllowBatch of %d", n), Want: "nil, or ErrClosed once Close has begun", Got: err.Error()})
			return
		}
		for i := range n {
			res := w.out[i]
			r.c.record(res.Decision, res.Err)
			if v := r.checkResult(w, w.idx[i], w.reqs[i].Cost, res.Decision, res.Err, certain, floor); v != nil {
				v.Op = fmt.Sprintf("AllowBatch[%d of %d](cost %d)", i, n, w.reqs[i].Cost) + v.Op
				r.fail(v)
				return
			}
		}
	}
}

// allowAll makes one AllowAll of 1 to 8 requests (keys repeat, so costs
// add up) and checks its answer: the binding request's decision is that of
// its key for the key's summed cost, and an admitted call counts every cost.
// q1 and floor are as work read them before the call.
func (r *consRun) allowAll(w *consWorker, q1, floor int64) *Violation {
	n := 1 + w.rng.IntN(8)
	w.reqs, w.idx = w.reqs[:0], w.idx[:0]
	for i := range n {
		k := int32(w.zipf.Uint64())
		if i > 0 && w.rng.IntN(3) == 0 {
			k = w.idx[w.rng.IntN(i)]
		}
		w.idx = append(w.idx, k)
		w.reqs = append(w.reqs, engine.Request{Key: r.names[k], Cost: w.cost()})
	}
	sums := map[int32]int64{}
	for i, k := range w.idx {
		sums[k] += w.reqs[i].Cost
	}
	d, at, err := r.eng.AllowAll(context.Background(), w.reqs)
	certain := q1 == r.reg.seq.Load() && q1%2 == 0
	r.c.record(d, err)
	op := fmt.Sprintf("AllowAll(%d requests over %d keys) at %d", n, len(sums), at)
	if at < 0 || at >= n {
		if err != nil && errors.Is(err, engine.ErrClosed) && r.closing.Load() && at == -1 {
			return nil
		}
		return &Violation{Key: r.names[w.idx[0]], Op: op, Want: fmt.Sprintf("an index in [0, %d)", n), Got: fmt.Sprintf("%d, %+v, %v", at, d, err)}
	}
	k := w.idx[at]
	if errors.Is(err, engine.ErrInvalidCost) && certain {
		// The first key, by its first request, whose sum is above its
		// smallest capacity under the one version in force.
		v := r.reg.lookup(floor)
		for i, j := range w.idx {
			if sums[j] > minCapacity(v.shapes[r.class[j]]) {
				if i != at {
					return &Violation{Key: r.names[j], Op: op + fmt.Sprintf(" under version %d alone", floor),
						Want: fmt.Sprintf("ErrCostExceedsCapacity at %d, the first request of the first key whose costs (%d) exceed its smallest capacity", i, sums[j]),
						Got:  err.Error()}
				}
				break
			}
		}
	}
	if v := r.checkResult(w, k, sums[k], d, err, certain, floor); v != nil {
		v.Op = op + v.Op
		return v
	}
	if err != nil {
		return nil
	}
	if !d.Allowed {
		r.c.allRefused.Add(1)
		return nil
	}
	r.c.allAdmitted.Add(1)
	for j, tokens := range sums {
		if j != k { // checkResult counted the binding key's
			r.count(w, j, tokens)
		}
	}
	return nil
}

// checkPolicy reads the engine's Policy and checks it against the versions
// calls that returned before it reported: once any call has seen a version,
// no later call, a Policy read among them, sees an older one, across keys
// and shards. A Policy read is such a call: later decisions must report at
// least its version. The window a lagging Policy (or an early publish)
// opens is short, so every worker reads it before every call.
func (r *consRun) checkPolicy() *Violation {
	seen := r.seen.Load()
	p := r.eng.Policy()
	if p.Version < seen {
		return &Violation{Key: "", Op: "Policy()", Want: fmt.Sprintf("version >= %d, which a call that returned before it started reported", seen), Got: fmt.Sprintf("version %d", p.Version)}
	}
	r.raiseSeen(p.Version)
	return nil
}

// raiseSeen raises r.seen to version, a version a call that has returned
// reported.
func (r *consRun) raiseSeen(version int64) {
	for {
		s := r.seen.Load()
		if version <= s || r.seen.CompareAndSwap(s, version) {
			return
		}
	}
}

// count adds tokens admitted on key k to w's admissions.
func (r *consRun) count(w *consWorker, k int32, tokens int64) {
	if w.acc[k] == 0 {
		w.touched = append(w.touched, k)
	}
	w.acc[k] += tokens
}

// cost draws a request cost: mostly 1, sometimes more, rarely above every
// capacity in force (ErrInvalidCost); costs between 6 and 50 are above some
// keys' own capacities and within others'.
func (w *consWorker) cost() int64 {
	switch x := w.rng.IntN(1000); {
	case x < 800:
		return 1
	case x < 950:
		return 2 + w.rng.Int64N(4)
	case x < 995:
		return 6 + w.rng.Int64N(45)
	default:
		return 51 + w.rng.Int64N(1950)
	}
}

// flush hands w's admissions of segment w.cur to the coordinator.
func (r *consRun) flush(w *consWorker) {
	if len(w.touched) == 0 {
		return
	}
	r.mu.Lock()
	m := r.pending[w.cur]
	if m == nil {
		m = make(map[int32]int64, len(w.touched))
		r.pending[w.cur] = m
	}
	for _, k := range w.touched {
		m[k] += w.acc[k]
		w.acc[k] = 0
	}
	r.mu.Unlock()
	w.touched = w.touched[:0]
}

// checkResult checks one answer for key k at cost, given whether the version
// in force was certain for the whole call (no fresh cutover attempt in
// flight) and floor, the version in force when the call started. An allowed
// decision is added to w's admissions. The violation's Op is completed by
// the caller.
func (r *consRun) checkResult(w *consWorker, k int32, cost int64, d engine.Decision, err error, certain bool, floor int64) *Violation {
	key := r.names[k]
	if err != nil {
		switch {
		case errors.Is(err, engine.ErrClosed) && r.closing.Load():
			return nil
		case errors.Is(err, engine.ErrKeyCapacity) && r.o.keys > r.o.maxKeys:
			return nil
		case errors.Is(err, engine.ErrInvalidCost):
			if v := r.reg.lookup(floor); certain && cost <= minCapacity(v.shapes[r.class[k]]) {
				return &Violation{Key: key, Op: fmt.Sprintf(" under version %d alone", floor),
					Want: fmt.Sprintf("a decision: cost %d <= the key's smallest band capacity %d under %s", cost, minCapacity(v.shapes[r.class[k]]), policyText(v.pol)), Got: err.Error()}
			}
			return nil
		}
		return &Violation{Key: key, Want: "a decision (or ErrInvalidCost above capacity, ErrClosed after Close)", Got: err.Error()}
	}
	v := r.reg.lookup(d.Version)
	if v == nil {
		return &Violation{Key: key, Want: "the version of a policy the coordinator attempted", Got: fmt.Sprintf("version %d in %+v", d.Version, d)}
	}
	v.seen.Store(true) // before reading state: see consRun.cutover
	switch {
	case v.state.Load() == consFailed:
		return &Violation{Key: key, Want: "no version whose ReplacePolicy failed", Got: fmt.Sprintf("version %d (%+v) in %+v", d.Version, v.pol, d)}
	case d.Version < floor:
		return &Violation{Key: key, Want: fmt.Sprintf("version >= %d, installed before the call started", floor), Got: fmt.Sprintf("%+v", d)}
	case certain && d.Version != floor:
		return &Violation{Key: key, Want: fmt.Sprintf("version %d, the only one in force during the call", floor), Got: fmt.Sprintf("%+v", d)}
	case d.Version < w.seen:
		return &Violation{Key: key, Want: fmt.Sprintf("version >= %d, which a call that returned before this one started reported", w.seen), Got: fmt.Sprintf("%+v", d)}
	}
	r.raiseSeen(d.Version)
	sh := v.shapes[r.class[k]]
	if s := consCheckDecision(d, cost, sh, d.Version); s != "" {
		return &Violation{Key: key, Want: s, Got: fmt.Sprintf("%+v under %s", d, policyText(v.pol))}
	}
	if sh != v.pol.Shape() {
		r.c.overridden.Add(1)
	}
	recordShape(r.c, sh, d.Band)
	if d.Allowed {
		r.count(w, k, cost)
	}
	return nil
}

// consCheckDecision checks d, the answer to a request of cost decided under
// sh, the key's own limit in policy version, for what can be known without
// the bucket's exact balance: d.Band names the binding band, whose balance
// lies in [Remaining, Remaining+1) tokens, a whole number of its units (1/Per
// tokens), so each estimate lies between the two ceilings it gives. It
// returns what was wanted, or "".
func consCheckDecision(d engine.Decision, cost int64, sh policy.Shape, version int64) string {
	at := -1
	for i := range sh.Len() {
		if sh.BandName(i) == d.Band {
			at = i
			break
		}
	}
	if at < 0 {
		return fmt.Sprintf("Band one of %q, the key's bands in version %d", consShapeNames(sh), version)
	}
	lim := sh.Band(at)
	rem, capacity := d.Remaining, lim.Capacity
	switch {
	case d.Limit != capacity:
		return fmt.Sprintf("Limit %d, the capacity of band %q of the key in version %d", capacity, d.Band, version)
	case rem < 0 || rem > d.Limit:
		return fmt.Sprintf("0 <= Remaining <= Limit %d", d.Limit)
	case cost > minCapacity(sh):
		return fmt.Sprintf("ErrInvalidCost: cost %d is above the smallest band capacity %d", cost, minCapacity(sh))
	case d.Allowed && d.RetryAfter != 0:
		return "RetryAfter 0 when allowed"
	case d.Allowed && rem > capacity-cost:
		return fmt.Sprintf("Remaining <= %d after admitting %d of %d", capacity-cost, cost, capacity)
	case !d.Allowed && rem >= cost:
		return fmt.Sprintf("Remaining < cost %d when denied", cost)
	}
	rate := lim.Rate()
	if !d.Allowed {
		if lo, hi := consWait(cost-rem, rate); int64(d.RetryAfter) < lo || int64(d.RetryAfter) > hi {
			return fmt.Sprintf("RetryAfter in [%d, %d] ns for %d missing tokens at %s", lo, hi, cost-rem, rateText(rate))
		}
	}
	if rem == capacity {
		if d.ResetAfter != 0 {
			return "ResetAfter 0 when full"
		}
		return ""
	}
	if lo, hi := consWait(capacity-rem, rate); int64(d.ResetAfter) < lo || int64(d.ResetAfter) > hi {
		return fmt.Sprintf("ResetAfter in [%d, %d] ns", lo, hi)
	}
	return ""
}

// consWait is the range of the wait, in ns, until a balance of floor b
// reaches b+missing whole tokens at r: the balance is short by more than
// missing-1 and at most missing tokens, that is between (missing-1) x Per + 1
// and missing x Per units, each earned at Tokens units a nanosecond; rounded
// up and saturated at math.MaxInt64, as the engine's waits are.
func consWait(missing int64, r policy.Rate) (lo, hi int64) {
	per, n := big.NewInt(int64(r.Per)), big.NewInt(r.Tokens)
	wait := func(units *big.Int) int64 {
		q, m := new(big.Int).QuoRem(units, n, new(big.Int))
		if m.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if !q.IsInt64() {
			return math.MaxInt64
		}
		return q.Int64()
	}
	short := new(big.Int).Mul(big.NewInt(missing-1), per)
	return wait(short.Add(short, big.NewInt(1))), wait(new(big.Int).Mul(big.NewInt(missing), per))
}

// consShapeNames lists sh's band names, the primary first.
func consShapeNames(sh policy.Shape) []string {
	names := make([]string, sh.Len())
	for i := range names {
		names[i] = sh.BandName(i)
	}
	return names
}

// consCeil is ceil(n/d) for n >= 0, d >= 1 and n+d within int64.
func consCeil(n, d int64) int64 { return (n + d - 1) / d }

// coordinate cuts over, sweeps, samples the key count and finalizes
// segments until ctx ends.
func (r *consRun) coordinate(ctx context.Context) {
	cut := time.NewTicker(r.o.cutoverEvery)
	defer cut.Stop()
	sweep := time.NewTicker(r.o.sweepEvery)
	defer sweep.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var v *Violation
		select {
		case <-ctx.Done():
			return
		case <-cut.C:
			v = r.cutover(ctx)
		case <-sweep.C:
			v = r.sweep(ctx)
		case <-tick.C:
			n := r.eng.KeyCount()
			r.c.keys.Store(int64(n))
			if n > r.o.maxKeys {
				v = &Violation{Op: "KeyCount", Want: fmt.Sprintf("<= MaxKeys %d", r.o.maxKeys), Got: strconv.Itoa(n)}
			}
		}
		if v != nil {
			r.fail(v)
			return
		}
		r.boundary()
		r.finalizeReady()
	}
}

// boundary starts a new segment, a new candidate window start, unless the
// last one is too recent: the check costs O(keys touched) per segment.
func (r *consRun) boundary() {
	if gap := time.Duration(len(r.names)) * 100 * time.Nanosecond; time.Since(r.lastBnd) < gap {
		return
	}
	r.lastBnd = time.Now()
	r.seg.Store(int64(r.ledger.boundary(r.clk.Now())))
}

// finalizeReady finalizes every segment all workers have moved past.
func (r *consRun) finalizeReady() {
	ready := int64(math.MaxInt64)
	for _, w := range r.workers {
		ready = min(ready, w.seg.Load())
	}
	if int64(r.ledger.done) >= ready {
		return
	}
	T := r.clk.Now() // after the loads: every counted admission happened before it
	for int64(r.ledger.done) < ready && r.ledger.done < r.ledger.segments() {
		g := r.ledger.done
		r.mu.Lock()
		m := r.pending[int64(g)]
		delete(r.pending, int64(g))
		r.mu.Unlock()
		adm := make([]consAdmission, 0, len(m))
		for k, t := range m {
			adm = append(adm, consAdmission{key: k, tokens: t})
		}
		if v := r.ledger.finalize(g, adm, T); v != nil {
			r.fail(v)
			return
		}
	}
}

// sweep runs EvictFull once.
func (r *consRun) sweep(ctx context.Context) *Violation {
	n, err := r.eng.EvictFull(ctx)
	r.c.evictions.Add(int64(n))
	if err != nil && ctx.Err() == nil {
		return &Violation{Op: "EvictFull", Want: "nil", Got: err.Error()}
	}
	return nil
}

// cutover makes one ReplacePolicy attempt: mostly a valid one with a fresh
// version, sometimes a stale one (wrong expected version, or a version that
// does not increase), which must be refused.
func (r *consRun) cutover(ctx context.Context) *Violation {
	cur := r.ledger.pol
	next := consRandomPolicy(r.rng, cur.Version+1+r.rng.Int64N(3))
	expected := cur.Version
	stale := ""
	switch x := r.rng.IntN(8); {
	case x == 0:
		stale = "wrong expected version"
		if expected = cur.Version - 1 - r.rng.Int64N(3); r.rng.IntN(2) == 0 {
			expected = cur.Version + 1 + r.rng.Int64N(3)
		}
	case x == 1:
		stale = "version not above the one in force"
		next.Version = cur.Version - r.rng.Int64N(min(cur.Version, 3))
	}

	// A fresh version is registered before the call: publish precedes the
	// return, so a worker may see it first. A stale attempt whose version
	// exists already is not registered: were it installed, decisions would
	// name that version with the wrong capacity (or the call's nil return
	// would be caught below).
	var v *consVersion
	if next.Version > cur.Version {
		v = r.reg.register(next)
		r.reg.seq.Add(1)
		defer r.reg.seq.Add(1)
	}
	before := r.clk.Now()
	err := r.eng.ReplacePolicy(ctx, next, expected)
	after := r.clk.Now()

	if err == nil && stale == "" {
		r.ledger.cutover(before, after, next)
		v.state.Store(consInstalled)
		r.reg.inForce.Store(next.Version)
		r.c.cutovers.Add(1)
		return nil
	}
	if v != nil {
		v.state.Store(consFailed)
		if v.seen.Load() { // workers store seen before they load state
			return &Violation{Op: fmt.Sprintf("ReplacePolicy(%+v, expected %d)", next, expected),
				Want: "no decision under a version whose ReplacePolicy failed", Got: fmt.Sprintf("a decision under version %d; the call returned %v", next.Version, err)}
		}
	}
	op := fmt.Sprintf("ReplacePolicy(%+v, expected %d) with version %d in force", next, expected, cur.Version)
	switch {
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return nil // the run is ending; the attempt was aborted everywhere
	case stale != "" && errors.Is(err, engine.ErrStalePolicy):
		r.c.stale.Add(1)
		return nil
	case stale != "":
		return &Violation{Op: op + " (" + stale + ")", Want: "ErrStalePolicy", Got: fmt.Sprint(err)}
	}
	return &Violation{Op: op, Want: "nil", Got: err.Error()}
}

// consRandomPolicy draws a policy: mostly modest, sometimes large, within
// consMaxCapacity and consMaxRate; a third of the limits with a Refill rate
// of another period, half the policies with one to three bands; and with
// overrides from consMatches two times in three, each with a limit drawn
// the same way and now and then a Name.
func consRandomPolicy(r *rand.Rand, version int64) policy.Policy {
	draw := func(max int64) int64 {
		switch x := r.IntN(100); {
		case x < 60:
			return 1 + r.Int64N(100)
		case x < 90:
			return 100 + r.Int64N(900)
		case x < 98:
			return 1000 + r.Int64N(999_000)
		default:
			return max - r.Int64N(1000)
		}
	}
	refill := func() policy.Rate {
		return policy.Rate{Tokens: draw(consMaxRate), Per: consPeriods[r.IntN(len(consPeriods))]}
	}
	rate := func() (int64, policy.Rate) {
		if r.IntN(3) != 0 {
			return draw(consMaxRate), policy.Rate{}
		}
		return 0, refill()
	}
	bands := func() *policy.BandSet {
		if r.IntN(2) == 0 {
			return nil
		}
		var bs []policy.Band
		for _, i := range r.Perm(len(consBandNames))[:1+r.IntN(len(consBandNames))] {
			// Mostly small, so bands bind: a burst or a daily quota below
			// the primary's.
			bs = append(bs, policy.Band{Name: consBandNames[i], Capacity: 1 + r.Int64N(min(draw(consMaxCapacity), 200)), Refill: refill()})
		}
		return mustBands(bs...)
	}
	p := policy.Policy{Version: version, Capacity: draw(consMaxCapacity), Bands: bands()}
	p.TokensPerSecond, p.Refill = rate()
	if r.IntN(3) == 0 {
		return p
	}
	var os []policy.Override
	for _, i := range r.Perm(len(consMatches))[:1+r.IntN(4)] {
		o := policy.Override{Match: consMatches[i], Capacity: draw(consMaxCapacity), Bands: bands()}
		o.TokensPerSecond, o.Refill = rate()
		if r.IntN(3) == 0 {
			o.Name = []string{"gold", "daily"}[r.IntN(2)]
		}
		os = append(os, o)
	}
	p.Overrides = namedOverrides(os)
	return p
}

// consPeriods are the periods Refill rates draw: uneven against the
// millisecond, slow and fast, and just past the 32-bit fraction.
var consPeriods = []time.Duration{3 * time.Second, time.Minute, time.Hour, 24 * time.Hour, 7, 250 * time.Millisecond, 1<<32 + 1}

// consBandNames are the names bands draw from: few, so cutovers keep,
// reshape, drop and add bands by name; "daily" is an override name too.
var consBandNames = []string{"daily", "burst", "b"}
