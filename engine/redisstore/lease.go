package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/policy"
)

// Leases turns leasing on (Config.Leases): the store takes whole tokens of
// a key's global bucket in advance, as a lease, and spends them in the
// process, so that a request the lease covers is decided without Redis.
// The package doc's Leases section gives the protocol and its bounds. Every
// zero field takes its default.
type Leases struct {
	// Divisor bounds one process's lease on a key to the key's smallest
	// band capacity divided by Divisor, in whole tokens. A key whose bound
	// is below 2 (a capacity below 2*Divisor: 32 by default) is never
	// leased. 0 means DefaultLeaseDivisor.
	Divisor int64
	// Horizon is how much of a key's demand in this process one lease is
	// sized to cover: the tokens the process admitted on the key over the
	// last Horizon. 0 means DefaultLeaseHorizon.
	Horizon time.Duration
	// MaxAge is how long a lease is kept without a grant: then its unspent
	// tokens go back to the global bucket, as they do once its key has had
	// no request for two Horizons (or MaxAge, if shorter). It bounds how
	// long a lease taken before another process's cutover may still be
	// spent here, and how long a denial from the global bucket is kept in
	// the process (see the package doc). 0 means DefaultLeaseMaxAge.
	MaxAge time.Duration
}

// The defaults of Leases' fields.
const (
	DefaultLeaseDivisor = 16
	DefaultLeaseHorizon = 100 * time.Millisecond
	DefaultLeaseMaxAge  = time.Second
)

// errRemote is a lease shard's answer to a request it cannot decide: the
// caller asks Redis (see lreq).
var errRemote = errors.New("redisstore: for redis")

// What a caller asks of a key's lease shard, named by the decide script's
// mode of the call it comes from; or of a whole shard, opFlush.
const (
	opAllow  = "a"        // decide cost from the lease, or send the caller to Redis
	opPeek   = "p"        // report the tokens the lease holds
	opRefund = "r"        // the balance grows: forget a denial kept for the key
	opCharge = modeCharge // hand the lease over, to give back before a charge
	opFlush  = "flush"    // hand every lease of the shard over (see leaser.flush)
)

// lreq is one request to a lease shard: the caller fills op, key and cost,
// pushes it and waits; the shard writes the reply and finishes it.
type lreq struct {
	op   string
	key  string
	cost int64
	lreply

	next  *lreq         // link in the shard's queue
	stage atomic.Uint32 // reqPending, reqDone or reqParked
	done  chan struct{} // one-slot buffer, made once per pooled request
}

// lreply is a lease shard's answer to an lreq. With err errRemote, held is
// what the lease held, taken for the request (opAllow: Redis is asked for
// the rest of its cost; opPeek and opRefund: the tokens, which the lease
// keeps), ver the version it was taken under, and want the lease to ask
// for with the request (0 for none). The caller first gives gifts back,
// so that Redis decides with them: for opFlush every lease the shard held,
// else the key's lease, if a cutover of the key ended it, it expired, or
// the request is an opCharge.
type lreply struct {
	d          engine.Decision
	err        error
	held, want int64
	ver        int64
	gifts      []gift
}

// The stages of an lreq's answer: the caller and the shard each move it
// with one atomic step, so the shard wakes a caller only if it parked.
const (
	reqPending uint32 = iota
	reqDone
	reqParked
)

// finish publishes the answer; the shard must not touch r after it.
func (r *lreq) finish() {
	if r.stage.Swap(reqDone) == reqParked {
		r.done <- struct{}{}
	}
}

// wait returns once the shard has finished r, yielding the processor up to
// yields times before it parks (a yield is cheaper than a park and a wake,
// and the shard usually answers within one or two).
func (r *lreq) wait(yields int) {
	for range yields {
		yield.Local()
		if r.stage.Load() == reqDone {
			return
		}
	}
	if r.stage.CompareAndSwap(reqPending, reqParked) {
		<-r.done
	}
}

// closedLeases heads a closed lease shard's queue.
var closedLeases = new(lreq)

// leaser is the store's lease layer: the keys' leases, spread over
// goroutine-owned shards like the engine's, each with a fetcher goroutine
// that takes the shard's calls to Redis off its path.
type leaser struct {
	s               *Store
	clk             clock.Clock
	divisor         int64
	horizon, maxAge int64
	idle            int64 // a lease whose key had no request for this long goes back: 2 Horizons, at most MaxAge
	yields          int
	seed            maphash.Seed
	shards          []*leaseShard
	pool            sync.Pool
	quit            chan struct{}
	wg              sync.WaitGroup
	closing         sync.Once

	granted, returned, forfeited tokenCount // see Stats
}

// tokenCount counts tokens up to math.MaxUint64, where it stops: a lease
// may be most of a capacity near math.MaxInt64, so a few would wrap it.
type tokenCount struct{ n atomic.Uint64 }

func (c *tokenCount) add(n int64) {
	for {
		old := c.n.Load()
		if c.n.CompareAndSwap(old, old+min(uint64(n), math.MaxUint64-old)) {
			return
		}
	}
}

func (c *tokenCount) load() uint64 { return c.n.Load() }

// leaseShard owns the leases of its keys: only its goroutine (run) reads
// or writes keys. Requests (flushes too) reach it on a lock-free take-all
// queue, as they reach an engine shard; Redis's answers about its keys on
// posts.
type leaseShard struct {
	l        *leaser
	head     atomic.Pointer[lreq]
	sleeping atomic.Bool
	wake     chan struct{} // one-slot buffer
	posts    chan post     // every post is owed (see pending): stop takes them all
	jobs     chan job      // to the fetcher
	fetching atomic.Int64  // jobs sent to the fetcher whose posts it has not yet sent (read by tests)

	keys    map[string]*lease
	sweepAt int64
	pending int // posts owed to this shard: callers sent to Redis, leases asked of the fetcher

	allowed, denied atomic.Uint64 // requests decided here (written by run only)
}

// lease is what one process holds of one key's global bucket, and what it
// last heard of it.
type lease struct {
	ver     int64 // the version the lease was taken under
	cap     int64 // the smallest band capacity: no cost above it is admissible
	max     int64 // the most tokens a lease may hold
	reserve int64 // a lease is asked for only while the bucket keeps this much
	left    int64 // unspent tokens
	out     int64 // tokens taken from left by requests Redis is deciding: they may come back
	back    int64 // tokens given back and not yet credited: out of the bucket still
	target  int64 // the tokens the next lease should hold; 0 until demand asks
	used    int64 // tokens admitted on the key since from
	from    int64 // clock reading where used began counting
	got     int64 // reading of the last grant
	seen    int64 // reading of the last request
	fetch   bool  // a lease is being asked for
	doubt   bool  // a call on the key went unanswered: no lease is asked for until Redis answers one (see unheard)

	remaining  int64 // the global bucket's whole tokens at its last answer
	resetAt    int64 // reading at which it would be full, by that answer
	limit      int64
	band       string
	deniedCost int64 // a denial by the global bucket holds for requests of this cost (0: none holds),
	deniedAt   int64 // and is kept at most MaxAge from this reading, where Redis gave it (see denied)
	// The denial itself, Redis's answer, which a denial kept answers from
	// (its RetryAfter and ResetAfter count from deniedAt): Redis's answers
	// reach the shard in any order, so an admission decided before the
	// denial may be learned after it.
	denial engine.Decision
}

// post is what Redis answered about a key: a caller's request of cost
// (0 for none), of which the lease held held, and a lease of asked tokens
// (0 for none), sent under version ver at clock reading at (no later than
// Redis decided: its RetryAfter and ResetAfter count from then). A post
// with back says instead that those gifts, each owed a post of its own,
// are back (credited or given up).
type post struct {
	key               string
	ver               int64
	at                int64
	cost, held, asked int64
	d, leaseD         engine.Decision
	dErr, lseErr      error
	back              []gift
}

// gift is a lease taken back from a shard, to return to Redis: n tokens
// of key taken under version ver.
type gift struct {
	key    string
	n, ver int64
}

// job is the fetcher's work: if give, a gift to give back (owed a post
// if owed), else a lease of n tokens of key to ask for under version ver.
type job struct {
	gift
	give, owed bool
}

func newLeaser(s *Store, cfg *Leases, clk clock.Clock) *leaser {
	l := &leaser{
		s:       s,
		clk:     clk,
		divisor: cmp.Or(cfg.Divisor, DefaultLeaseDivisor), // New refuses a negative field
		horizon: int64(cmp.Or(cfg.Horizon, DefaultLeaseHorizon)),
		maxAge:  int64(cmp.Or(cfg.MaxAge, DefaultLeaseMaxAge)),
		yields:  2,
		seed:    maphash.MakeSeed(),
		quit:    make(chan struct{}),
	}
	l.idle = min(satAdd(l.horizon, l.horizon), l.maxAge)
	if runtime.GOMAXPROCS(0) > 1 {
		l.yields = 5 // the engine's choice for a caller waiting on a shard on another processor
	}
	l.pool.New = func() any { return &lreq{done: make(chan struct{}, 1)} }
	l.shards = make([]*leaseShard, runtime.GOMAXPROCS(0))
	for i := range l.shards {
		q := &leaseShard{
			l:     l,
			wake:  make(chan struct{}, 1),
			posts: make(chan post, 256),
			jobs:  make(chan job, 1024),
			keys:  map[string]*lease{},
		}
		l.shards[i] = q
		l.wg.Go(q.run)
		l.wg.Go(q.fetcher)
	}
	return l
}

func (l *leaser) shardOf(key string) *leaseShard {
	return l.shards[maphash.String(l.seed, key)%uint64(len(l.shards))]
}

// ask hands one request to q, its key's shard, and waits for the reply,
// whose err is engine.ErrClosed if the shard is closed.
func (l *leaser) ask(q *leaseShard, op, key string, cost int64) lreply {
	r := l.pool.Get().(*lreq)
	r.op, r.key, r.cost, r.lreply = op, key, cost, lreply{}
	r.stage.Store(reqPending)
	if !q.push(r) {
		l.pool.Put(r)
		return lreply{err: engine.ErrClosed}
	}
	r.wait(l.yields)
	a := r.lreply
	r.key, r.gifts = "", nil
	l.pool.Put(r)
	return a
}

// decide is Allow in lease mode, counted, for a request checked, whose
// call ends by dl (see Store.deadline): decided by the key's lease if it
// covers cost or a denial of Redis still holds, else by Redis, which may
// grant the next lease in the same call. A request that takes what the
// lease holds is decided only under the lease's version: one that meets a
// cutover on its way puts the tokens back and is asked again, so that the
// lease ends (see leaseShard.decide) and no answer under the new version
// spends tokens taken under the old. Every exchange with Redis it makes
// shares that deadline (a lease given back first, then the decision), and
// one that passes on the way is answered by the failure rule, as Allow's
// is. A request its lease decides makes none, and allocates nothing.
func (l *leaser) decide(ctx context.Context, dl time.Time, key string, cost int64) (engine.Decision, error) {
	s := l.s
	var cancel context.CancelFunc // set once ctx is bounded by dl
	for try := 1; ; try++ {
		a := l.ask(l.shardOf(key), opAllow, key, cost)
		if cancel == nil && (a.gifts != nil || a.err == errRemote) {
			ctx, cancel = context.WithDeadline(ctx, dl)
			defer cancel()
		}
		l.giveBackOwed(ctx, a.gifts)
		if a.err != nil && a.err != errRemote {
			s.errs[kindOf(a.err)].Add(1)
		}
		if a.err != errRemote {
			return a.d, a.err
		}
		p := post{key: key, ver: a.ver, at: l.clk.Now(), cost: cost, held: a.held, asked: a.want}
		var pin int64 // each cutover met ends the lease, so a last try holds nothing, but for one more cutover
		if a.held > 0 && try < maxAttempts {
			pin = a.ver
		}
		if a.want == 0 {
			p.d, p.dErr = s.decideOne(ctx, key, cost-a.held, pin)
		} else {
			var out [2]engine.Result
			items := []item{{out: &out[0], key: key, cost: cost - a.held, pin: pin}, {out: &out[1], key: key, cost: a.want, lease: true, pin: pin}}
			if err := s.decideItems(ctx, items); err != nil {
				out[0].Err, out[1].Err = err, err
			}
			p.d, p.dErr, p.leaseD, p.lseErr = out[0].Decision, out[0].Err, out[1].Decision, out[1].Err
		}
		l.shardOf(key).posts <- p // the tokens held go back to the lease unless Redis admitted the request
		if errors.Is(p.dErr, errMoved) {
			continue
		}
		d := p.d // the shard learns the bucket's own balance
		if heard(d, p.dErr) && !d.Allowed {
			d.Remaining = satAdd(d.Remaining, a.held) // the tokens held go back to the lease
		}
		s.countOne(d, p.dErr)
		return d, p.dErr
	}
}

// allowBatch is AllowBatch in lease mode: each request as Allow decides
// it, in order. A cancel of the context or a Close, looked for before each
// request, ends the batch, as it ends a batch without leases: the requests
// from there on are not decided and get that error (a bad key or cost keeps
// its own), which it returns.
func (l *leaser) allowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	fail := l.s.usable(ctx)
	var dl time.Time // one deadline for the batch, as without leases
	if fail == nil {
		dl = l.s.deadline(ctx) // ctx is not nil
	}
	var t tally
	for i, r := range reqs {
		if fail == nil && (l.s.closed.Load() || errors.Is(ctx.Err(), context.Canceled)) {
			fail = l.s.usable(ctx) // ErrClosed, or the cancel: a lease's answer would not look
		}
		if err := cmp.Or(l.s.checkReq(r.Key, r.Cost), fail); err != nil {
			out[i] = engine.Result{Err: err}
			t.add(engine.Decision{}, err)
		} else if out[i].Decision, out[i].Err = l.decide(ctx, dl, r.Key, r.Cost); out[i].Err == engine.ErrClosed {
			fail = out[i].Err // its lease shard has stopped: Close is under way, before the store counts as closed
		}
	}
	l.s.count(&t)
	return fail
}

// before readies key's lease for a Peek (mode "p": it returns the tokens
// the lease holds and the version they were taken under, which the Peek
// adds to Redis's answer if it is under that version), a Refund ("r":
// likewise, and a denial the process keeps for the key no longer holds) or
// a Charge (modeCharge: the lease goes back first, so that the charge
// takes its tokens from the bucket as a whole).
func (l *leaser) before(ctx context.Context, op, key string) (held, ver int64) {
	a := l.ask(l.shardOf(key), op, key, 1)
	l.giveBackOwed(ctx, a.gifts)
	return a.held, a.ver // held is 0 but for a Peek's or a Refund's
}

// flush takes every lease back from the shards and gives its unspent
// tokens back to Redis (see giveBack): before a cutover, and at Close. A
// shard that is closed gives its leases back itself (see stop), so flush
// then waits until every shard and fetcher has: a cutover racing Close
// must not publish before them.
func (l *leaser) flush(ctx context.Context) {
	for _, q := range l.shards {
		a := l.ask(q, opFlush, "", 0)
		if a.err != nil { // closed: Close is under way
			l.s.atHook(hookFlushWaits)
			l.wg.Wait()
			return
		}
		l.giveBackOwed(ctx, a.gifts)
	}
}

// giveBackOwed is giveBack for gifts a lease shard counts as on their way
// back: it then tells their shard they are back. The tokens are the
// process's, not the caller's: a caller canceled meanwhile does not make
// the process give them up (ctx's deadline still bounds the give-back).
func (l *leaser) giveBackOwed(ctx context.Context, gs []gift) {
	if len(gs) > 0 {
		gctx := context.WithoutCancel(ctx)
		if dl, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			gctx, cancel = context.WithDeadline(gctx, dl)
			defer cancel()
		}
		l.giveBack(gctx, gs)
		l.shardOf(gs[0].key).posts <- post{back: gs}
	}
}

// giveBack returns unspent tokens to Redis, exactly, capped at capacity:
// one script call per virtual shard, pipelined. Tokens taken under a
// version no longer in force (the store reads which first) go back only if
// no cutover since could have clamped or dropped them (see raised): else
// they are given up, since returned under a higher capacity they could
// fill the bucket past what the cutovers left it. Each refund is made
// under the version it was judged at only: one that meets a cutover
// published since is judged again. What Redis does not take is given up,
// and OnError told.
func (l *leaser) giveBack(ctx context.Context, gs []gift) {
	s := l.s
	for try := 0; len(gs) > 0; try++ {
		items, from, err := l.judge(ctx, gs, try)
		s.atHook(hookGiveBack)
		if err == nil && len(items) > 0 {
			_, err = roundGet(ctx, s, func(ctx context.Context) (int, error) { return s.exec(ctx, "r", "", items) })
		}
		gs = nil
		for i, it := range items {
			switch {
			case errors.Is(it.out.Err, errMoved):
				gs = append(gs, from[i]) // judged again under the version now in force
			case !it.done || it.out.Err != nil:
				l.lost(it.cost, cmp.Or(it.out.Err, err))
			default:
				l.returned.add(it.cost)
			}
		}
	}
}

// judge is one try of giveBack: it reads the version in force and returns
// the gifts to refund under it, as items pinned to it (each with an out of
// its own), and the gift of each, having given up those a cutover since
// could have clamped or dropped (see raised). err, if not nil, is why none
// can be refunded now: every gift not given up is then in items, for
// giveBack to count as lost.
func (l *leaser) judge(ctx context.Context, gs []gift, try int) (items []item, from []gift, err error) {
	s := l.s
	if err = s.need(ctx); err == nil {
		err = s.round(ctx, s.reload)
	}
	if err == nil && try == maxAttempts {
		err = fmt.Errorf("%w: gave up after %d attempts (policies changing too fast?)", ErrUnavailable, maxAttempts)
	}
	st := s.cur.Load()
	var retained []int64 // read at the first gift of an older version
	var unread error
	items, from = make([]item, 0, len(gs)), make([]gift, 0, len(gs))
	outs := make([]engine.Result, len(gs))
	for _, g := range gs {
		if err == nil && g.ver != st.p.Version {
			if retained == nil && unread == nil {
				retained, unread = roundGet(ctx, s, func(ctx context.Context) ([]int64, error) { vs, _, err := s.history(ctx); return vs, err })
			}
			switch {
			case unread != nil:
				l.lost(g.n, unread)
				continue
			case l.raised(ctx, g, st, retained):
				l.forfeited.add(g.n)
				continue
			}
		}
		items = append(items, item{out: &outs[len(items)], key: g.key, cost: g.n, pin: st.p.Version})
		from = append(from, g)
	}
	return items, from, err
}

// raised reports whether returning g under st could top its key up: some
// version from the one g was taken under up to st's, in retained (the
// retained versions, oldest first), would raise a band of the key's limit
// under st (see raises), so that a cutover on the way clamped or dropped
// what the lease kept out of the bucket. True if that is unknown: g's
// version or st's not retained, or a policy that could not be read.
func (l *leaser) raised(ctx context.Context, g gift, st *state, retained []int64) bool {
	from := slices.Index(retained, g.ver)
	if from < 0 {
		return true
	}
	next := st.p.ShapeAt(st.p.Overrides.Resolve(g.key))
	for _, v := range retained[from:] {
		if v == st.p.Version {
			return false
		}
		old, err := roundGet(ctx, l.s, func(ctx context.Context) (policy.Policy, error) { return l.s.policyAt(ctx, v) }) // the fetcher's ctx has no deadline
		if err != nil || raises(old.ShapeAt(old.Overrides.Resolve(g.key)), next) {
			return true
		}
	}
	return true
}

// lost counts n tokens given up, and tells OnError why.
func (l *leaser) lost(n int64, why error) {
	l.forfeited.add(n)
	l.s.report(fmt.Errorf("redisstore: %d leased tokens given up: %w", n, why))
}

// close returns every lease and stops the shards and fetchers.
func (l *leaser) close() {
	l.closing.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.s.timeout)
		l.flush(ctx)
		cancel()
		close(l.quit)
		l.wg.Wait()
	})
}

// push queues r for the shard, false if it is closed.
func (q *leaseShard) push(r *lreq) bool {
	for {
		h := q.head.Load()
		if h == closedLeases {
			return false
		}
		r.next = h
		if q.head.CompareAndSwap(h, r) {
			break
		}
	}
	if q.sleeping.Load() && q.sleeping.CompareAndSwap(true, false) {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// run is the shard's goroutine: it serves queued requests, Redis's
// answers and the sweep of old leases, until the leaser closes.
func (q *leaseShard) run() {
	defer close(q.jobs)
	tick := time.NewTicker(time.Duration(max(q.l.idle/2, int64(time.Millisecond))))
	defer tick.Stop()
	for idle := false; ; {
		if g := q.head.Swap(nil); g != nil {
			q.serve(g)
			select { // a busy shard looks for a Close between groups
			case <-q.l.quit:
				q.stop()
				return
			default:
			}
			idle = false
			continue
		}
		if !idle { // let callers about to send join the next group, rather than wake it
			idle = true
			yield.Local()
			continue
		}
		q.sleeping.Store(true)
		if q.head.Load() != nil {
			if !q.sleeping.CompareAndSwap(true, false) {
				<-q.wake
			}
			continue
		}
		select {
		case <-q.wake:
		case p := <-q.posts:
			q.settle(p)
		case <-tick.C:
			q.sweep(q.l.clk.Now())
		case <-q.l.quit:
			q.stop()
			return
		}
		if !q.sleeping.CompareAndSwap(true, false) {
			select { // the pusher that cleared it sends, now or soon: a spare wake is harmless
			case <-q.wake:
			default:
			}
		}
	}
}

// stop closes the queue, serves what it held, takes in every answer still
// owed to the shard and gives every lease back.
func (q *leaseShard) stop() {
	if g := q.head.Swap(closedLeases); g != nil {
		q.serve(g)
	}
	for q.pending > 0 { // callers and the fetcher still owe answers: their grants and held tokens go back too
		q.settle(<-q.posts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.l.s.timeout)
	q.l.giveBack(ctx, q.takeAll(false))
	cancel()
}

// serve decides a group of requests taken from the queue, newest first,
// in the order they came, then the answers Redis sent meanwhile.
func (q *leaseShard) serve(g *lreq) {
	var prev *lreq
	for g != nil {
		g.next, prev, g = prev, g, g.next
	}
	now := q.l.clk.Now()
	for range len(q.posts) { // first, so that a caller's next request sees its last answer
		q.settle(<-q.posts)
	}
	st := q.l.s.cur.Load()
	for r := prev; r != nil; {
		next := r.next
		q.decide(now, st, r)
		r.finish()
		r = next
	}
	if now >= q.sweepAt {
		q.sweep(now)
	}
}

// decide answers one request from the key's lease, or sends it to Redis;
// a flush, with every lease.
func (q *leaseShard) decide(now int64, st *state, r *lreq) {
	if r.op == opFlush {
		r.gifts = q.takeAll(true)
		return
	}
	k := q.keys[r.key]
	if k == nil {
		if r.op != opAllow {
			r.err = errRemote
			return
		}
		k = &lease{from: now}
		q.keys[strings.Clone(r.key)] = k
		q.renew(r.key, k, st)
	} else if stale := k.ver != st.p.Version; stale || r.op == opCharge || q.l.expired(now, k) {
		// A cutover ended the lease, or it is past MaxAge or its key went
		// idle (the sweep would give it back, but may not have run since:
		// it runs after a group, or on a timer): it goes back here, so that
		// no lease is spent under a replaced limit, past MaxAge, or after
		// its key went idle. A charge's goes back too, before Redis
		// charges the key.
		if k.left > 0 {
			r.gifts = []gift{{r.key, k.left, k.ver}}
			q.owe(k, k.left)
			k.left = 0
		}
		if stale {
			q.renew(r.key, k, st)
		}
	}
	if r.op == opAllow { // a Peek or a Refund is no request: it keeps no idle lease
		k.seen = now
	}
	cost := r.cost
	switch {
	case r.op == opPeek:
		r.err, r.held, r.ver = errRemote, k.left, k.ver
	case r.op == opRefund, r.op == opCharge: // a denial no longer holds: a refund grows the balance, a charge's lease went back above (it holds 0)
		r.err, r.held, r.ver, k.deniedCost = errRemote, k.left, k.ver, 0
	case cost > k.cap: // under the policy as last seen: Redis, under the one in force, answers
		r.err, r.ver = errRemote, k.ver
		q.pending++
	case k.left >= cost:
		k.left -= cost
		k.used = satAdd(k.used, cost)
		r.d = k.answer(now, true)
		q.allowed.Add(1)
		if 2*k.left < k.target { // the lease runs low: the fetcher asks for the next (none if one is being asked for)
			if n := q.l.want(now, k, 0); n > 0 && q.send(job{gift: gift{r.key, n, k.ver}}) {
				k.fetch = true
				q.pending++
			}
		}
	case k.denied(now, cost, q.l.maxAge):
		r.d = k.answer(now, false)
		q.denied.Add(1)
	default:
		r.err, r.want, r.held, r.ver = errRemote, q.l.want(now, k, cost), k.left, k.ver
		k.left, k.out = 0, k.out+k.left
		q.pending++ // the caller posts Redis's answer
		if r.want > 0 {
			k.fetch = true
		}
	}
}

// owe counts n tokens taken from k's lease to give back as on their way:
// out of the bucket, they count against the lease's bound until the post
// that says they are back (see giveBackOwed).
func (q *leaseShard) owe(k *lease, n int64) {
	if n > 0 {
		k.back += n
		q.pending++
	}
}

// answer is a decision the lease gives: Remaining and ResetAfter are
// estimates, from the global bucket's last answer and the lease's tokens.
// A denial kept answers from the denial itself as well (see denied).
func (k *lease) answer(now int64, allowed bool) engine.Decision {
	remaining, resetAt, limit, band, retry := k.remaining, k.resetAt, k.limit, k.band, int64(0)
	if !allowed {
		remaining, resetAt, limit, band = k.deniedRemaining(), max(resetAt, satAdd(k.deniedAt, int64(k.denial.ResetAfter))), k.denial.Limit, k.denial.Band
		retry = timeTo(satAdd(k.deniedAt, int64(k.denial.RetryAfter)), now)
	}
	return engine.Decision{Allowed: allowed, Remaining: min(satAdd(remaining, k.left), limit), RetryAfter: time.Duration(retry), Version: k.ver,
		Limit: limit, ResetAfter: time.Duration(max(0, timeTo(resetAt, now))), Band: band}
}

// timeTo is the time from now to the reading at; at math.MaxInt64, where a
// saturated wait lands, it stays math.MaxInt64: never.
func timeTo(at, now int64) int64 {
	if at == math.MaxInt64 {
		return math.MaxInt64
	}
	return at - now
}

// deniedRemaining is the bucket's tokens by the denial kept and the last
// answer, the fewer: Redis's answers reach the shard in any order, so an
// admission decided before the denial may be learned after it.
func (k *lease) deniedRemaining() int64 { return min(k.remaining, k.denial.Remaining) }

// denied reports whether the denial k keeps answers a request of cost at
// now: the same cost, before its RetryAfter and less than maxAge after
// Redis gave it, and still more than the bucket (as deniedRemaining counts
// it) and the lease hold together; a grant learned since may cover it, and
// then Redis decides. Its answer is the denial's, the time since taken
// off: its band, that band's limit, the later of the two resets. A denial
// kept no longer than MaxAge, as a lease is, bounds how long a process
// misses a cutover made elsewhere, or others' refunds, however long the
// RetryAfter (a day's band gives hours).
func (k *lease) denied(now, cost, maxAge int64) bool {
	return k.denialHolds(now, maxAge) && cost == k.deniedCost && satAdd(k.deniedRemaining(), k.left) < cost
}

// denialHolds reports whether k keeps a denial that may still answer at
// now: before its RetryAfter, and less than maxAge after Redis gave it.
func (k *lease) denialHolds(now, maxAge int64) bool {
	return k.deniedCost > 0 && now < satAdd(k.deniedAt, int64(k.denial.RetryAfter)) && now-k.deniedAt < maxAge
}

// renew sets k for the version in force, st, holding nothing.
func (q *leaseShard) renew(key string, k *lease, st *state) {
	sh := st.p.ShapeAt(st.p.Overrides.Resolve(key))
	c := minCapacity(sh)
	k.ver, k.cap, k.max, k.reserve = st.p.Version, c, c/q.l.divisor, c-c/2
	k.remaining, k.resetAt, k.limit, k.band = c, 0, sh.Primary.Capacity, sh.Name
	k.deniedCost, k.target = 0, 0
}

// raises reports whether next gives some band of prev a higher capacity,
// paired as the cutover pairs them (primary to primary, bands by name), or
// has a band prev lacks: the cutover starts it full.
func raises(prev, next policy.Shape) bool {
	if next.Primary.Capacity > prev.Primary.Capacity {
		return true
	}
	for i := 1; i < next.Len(); i++ {
		if j := prev.Bands.Index(next.BandName(i)); j < 0 || next.Band(i).Capacity > prev.Band(j+1).Capacity {
			return true
		}
	}
	return false
}

// want is the lease to ask for with a request of cost (0 for a top-up): as
// much as the key's demand in this process over the last Horizon, within
// the lease's bound (less what it holds: in the process, in requests Redis
// is deciding and on its way back), leaving the global bucket (as last heard) its
// reserve; 0 if that is under 2 tokens, a lease is being asked for, or
// the key's last call went unanswered (doubt).
func (l *leaser) want(now int64, k *lease, cost int64) int64 {
	if k.fetch || k.doubt || k.max < 2 {
		return 0
	}
	// The demand over the last Horizon: used, counted since from, scaled
	// to a Horizon once it counts over more. The count itself is scaled
	// (and from moved to a Horizon ago) only once it covers two: so its
	// rounding down loses at most a token a Horizon. Scaled at every
	// request, a slow steady demand would round down to nothing for good.
	demand := k.used
	if el := now - k.from; el > l.horizon {
		demand = scale(k.used, l.horizon, el)
		if el-l.horizon > l.horizon {
			k.used, k.from = demand, now-l.horizon
		}
	}
	k.target = min(demand, k.max)
	room := int64(0) // what the bucket keeps over its reserve, less cost: no overflow, whatever its debt
	if k.remaining > k.reserve {
		room = k.remaining - k.reserve
	}
	if w := min(k.target, k.max-k.left-k.out-k.back, room-cost); w >= 2 {
		return w
	}
	k.target = 0 // asks again at the next request Redis decides
	return 0
}

// send queues j for the fetcher, false if its queue is full.
func (q *leaseShard) send(j job) bool {
	q.fetching.Add(1) // before the fetcher can take it, and subtract it
	select {
	case q.jobs <- j:
		return true
	default:
		q.fetching.Add(-1)
		return false
	}
}

// settle takes in what Redis answered about a key.
func (q *leaseShard) settle(p post) {
	if p.back != nil {
		q.pending -= len(p.back)
		for _, g := range p.back {
			if k := q.keys[g.key]; k != nil { // kept while back > 0 (see sweep)
				k.back -= g.n
			}
		}
		return
	}
	q.pending--
	now := p.at
	var n int64 // the lease Redis granted
	if p.asked > 0 && heard(p.leaseD, p.lseErr) && p.leaseD.Allowed {
		n = p.asked
	}
	q.l.granted.add(n)
	k := q.keys[p.key] // nil if swept meanwhile, in a call longer than MaxAge that held and asked nothing
	if k != nil {
		k.out -= p.held
	}
	// the tokens the request took from the lease are still the process's if
	// Redis did not admit it (a failure rule's admission took nothing)
	if p.held > 0 && !(heard(p.d, p.dErr) && p.d.Allowed) {
		q.keep(p.key, k, p.held, p.ver, p.ver)
	}
	if k == nil {
		return
	}
	if p.asked > 0 {
		k.fetch = false
	}
	// Redis may have run a call whose answer was lost, and granted its lease
	// to nobody: asked again with every failed call, leases would drain the
	// bucket for every process while Redis stalls. Only Redis's own answer
	// ends the doubt: an error may be the failure rule's (a cost above
	// capacity) as well as Redis's.
	switch {
	case p.cost > 0 && unheard(p.d, p.dErr), p.asked > 0 && unheard(p.leaseD, p.lseErr):
		k.doubt = true
	case p.cost > 0 && heard(p.d, p.dErr), p.asked > 0 && heard(p.leaseD, p.lseErr):
		k.doubt = false
	}
	if p.cost > 0 && heard(p.d, p.dErr) && p.ver == k.ver { // an answer under an older version says nothing of this one
		k.learn(now, p.d)
		if p.d.Allowed {
			k.used = satAdd(k.used, p.cost)
		} else {
			k.deniedCost, k.deniedAt, k.denial = p.cost, now, p.d
		}
	}
	if p.asked > 0 && heard(p.leaseD, p.lseErr) && p.ver == k.ver {
		k.learn(now, p.leaseD)
	}
	if n > 0 {
		// taken under the version Redis decided the grant at: a cutover
		// since the lease was asked for moves it past p.ver, and then the
		// tokens go back under it, not under p.ver (see giveBack), also if
		// the lease has met it since: they were sized under p.ver's bound
		q.keep(p.key, k, n, p.leaseD.Version, p.ver)
		k.got = now
	}
}

// unheard reports whether an answer d, err may have lost what Redis
// decided: the failure rule answered it, or its call ended with its context.
func unheard(d engine.Decision, err error) bool {
	return d.Degraded || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// heard reports whether an answer d, err is Redis's decision.
func heard(d engine.Decision, err error) bool { return err == nil && !d.Degraded }

// keep adds n tokens taken under version ver, and asked for under asked,
// to k's lease, or, if k is under another version than either or nil (its
// key forgotten), has the fetcher give them back (see giveBack).
func (q *leaseShard) keep(key string, k *lease, n, ver, asked int64) {
	if k == nil || ver != k.ver || asked != k.ver {
		if !q.send(job{gift{key, n, ver}, true, k != nil}) {
			q.l.lost(n, errors.New("the lease shard's queue to Redis is full"))
		} else if k != nil {
			q.owe(k, n)
		}
		return
	}
	k.left += n
}

// learn keeps what the global bucket answered.
func (k *lease) learn(now int64, d engine.Decision) {
	k.remaining, k.resetAt, k.limit, k.band = d.Remaining, satAdd(now, int64(d.ResetAfter)), d.Limit, d.Band
}

// expired reports whether k holds a lease that must go back at now: kept
// MaxAge without a grant, or its key had no request for idle. A lease
// being asked for is not: its grant is on its way.
func (l *leaser) expired(now int64, k *lease) bool {
	return !k.fetch && k.left > 0 && (now-k.got >= l.maxAge || now-k.seen >= l.idle)
}

// sweep gives back the leases kept MaxAge without a grant, and forgets
// the keys that have been idle as long, once no denial of theirs holds.
func (q *leaseShard) sweep(now int64) {
	q.sweepAt = now + q.l.idle/2
	for key, k := range q.keys {
		switch {
		case k.fetch:
		case q.l.expired(now, k):
			if q.send(job{gift{key, k.left, k.ver}, true, true}) { // else kept, for the next sweep
				q.owe(k, k.left)
				k.left = 0
			}
		case k.left == 0 && k.out == 0 && k.back == 0 && now-k.seen >= q.l.maxAge && !k.denialHolds(now, q.l.maxAge):
			delete(q.keys, key)
		}
	}
}

// takeAll takes every lease back, for a flush (owed: see owe) or stop.
func (q *leaseShard) takeAll(owed bool) []gift {
	var gs []gift
	for key, k := range q.keys {
		if k.left > 0 {
			gs = append(gs, gift{key, k.left, k.ver})
			if owed {
				q.owe(k, k.left)
			}
			k.left = 0
		}
	}
	return gs
}

// fetcher sends the shard's jobs to Redis: the leases asked for in one
// batch call, the leases given back one call each.
func (q *leaseShard) fetcher() {
	var asks []job
	var reqs []engine.Request
	var out []engine.Result
	gives := map[gift]int64{} // n 0: the tokens, by key and version
	var owed []gift           // the gifts of gives owed a post (see owe)
	for j := range q.jobs {
		asks, reqs = asks[:0], reqs[:0]
		n := 0 // the jobs this round takes
		for more := true; more; {
			n++
			if j.give {
				gives[gift{key: j.key, ver: j.ver}] += j.n
				if j.owed {
					owed = append(owed, j.gift)
				}
			} else {
				asks = append(asks, j)
				reqs = append(reqs, engine.Request{Key: j.key, Cost: j.n})
			}
			if len(asks) == ChunkSize || len(gives) == ChunkSize {
				break
			}
			select {
			case j, more = <-q.jobs:
			default:
				more = false
			}
		}
		if len(gives) > 0 {
			gs := make([]gift, 0, len(gives))
			for g, n := range gives {
				gs = append(gs, gift{g.key, n, g.ver})
			}
			clear(gives)
			q.l.giveBack(context.Background(), gs)
			if owed != nil {
				q.posts <- post{back: owed}
				owed = nil
			}
		}
		if len(asks) > 0 {
			out = append(out[:0], make([]engine.Result, len(asks))...)
			at := q.l.clk.Now()
			_ = q.l.s.allowBatch(context.Background(), reqs, out, 0) // only ErrClosed, which every out holds then
			for i, a := range asks {
				q.posts <- post{key: a.key, ver: a.ver, at: at, asked: a.n, leaseD: out[i].Decision, lseErr: out[i].Err}
			}
		}
		q.fetching.Add(int64(-n))
	}
}

// scale is n*h/el rounded down, for 0 <= n and 0 <= h < el: the product
// takes 128 bits, and the quotient is below n.
func scale(n, h, el int64) int64 {
	hi, lo := bits.Mul64(uint64(n), uint64(h))
	q, _ := bits.Div64(hi, lo, uint64(el))
	return int64(q)
}

// satAdd is a+b, at most math.MaxInt64, for b >= 0 (a may be a debt).
func satAdd(a, b int64) int64 {
	if a > 0 && b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
