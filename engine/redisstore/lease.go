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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	shardmsg "github.com/tokenshard/tokenshard/internal/decision"
	"github.com/tokenshard/tokenshard/internal/yield"
	"github.com/tokenshard/tokenshard/msg"
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
	// spent here. 0 means DefaultLeaseMaxAge.
	MaxAge time.Duration
}

// The defaults of Leases' fields.
const (
	DefaultLeaseDivisor = 16
	DefaultLeaseHorizon = 100 * time.Millisecond
	DefaultLeaseMaxAge  = time.Second
)

// errRemote is a lease shard's answer to a request it cannot decide: the
// caller asks Redis, and with it for a lease of the Single's Cost tokens
// if that is positive. The Decision's Remaining is what the lease held,
// taken for the request: Redis is asked for the rest of its cost (for a
// peek, the tokens are only reported).
var errRemote = errors.New("redisstore: for redis")

// closedLeases heads a closed lease shard's queue.
var closedLeases = new(msg.Single)

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
	ctl             atomic.Int32 // flushes and Closes under way, which busy shards look for
	wg              sync.WaitGroup
	closing         sync.Once

	granted, returned, forfeited atomic.Uint64 // tokens (see Stats)
}

// leaseShard owns the leases of its keys: only its goroutine (run) reads
// or writes keys. Requests reach it on a lock-free take-all queue, as they
// reach an engine shard; Redis's answers about its keys on posts.
type leaseShard struct {
	l        *leaser
	head     atomic.Pointer[msg.Single]
	sleeping atomic.Bool
	wake     chan struct{} // one-slot buffer
	posts    chan post
	flush    chan chan []gift // a caller takes every lease back (see leaser.flush)
	jobs     chan job         // to the fetcher
	exited   chan struct{}    // closed when run returns

	keys    map[string]*lease
	sweepAt int64

	allowed, denied atomic.Uint64 // requests decided here (written by run only)
}

// lease is what one process holds of one key's global bucket, and what it
// last heard of it.
type lease struct {
	ver     int64        // the version the lease was taken under
	shape   policy.Shape // the key's limit under ver
	cap     int64        // the smallest band capacity: no cost above it is admissible
	max     int64        // the most tokens a lease may hold
	reserve int64        // a lease is asked for only while the bucket keeps this much
	left    int64        // unspent tokens
	target  int64        // the tokens the next lease should hold; 0 until demand asks
	used    int64        // tokens admitted on the key since from
	from    int64        // clock reading where used began counting
	got     int64        // reading of the last grant
	seen    int64        // reading of the last request
	fetch   bool         // a lease is being asked for

	remaining  int64 // the global bucket's whole tokens at its last answer
	resetAt    int64 // reading at which it would be full, by that answer
	limit      int64
	band       string
	deniedTill int64 // a denial by the global bucket holds until then,
	deniedCost int64 // for requests of at least this cost
}

// post is what Redis answered about a key: a caller's request of cost
// (0 for none), of which the lease held held, and a lease of asked tokens
// (0 for none), sent under version ver at clock reading at (no later than
// Redis decided: its RetryAfter and ResetAfter count from then).
type post struct {
	key               string
	ver               int64
	at                int64
	cost, held, asked int64
	d, leaseD         engine.Decision
	dErr, lseErr      error
}

// job is the fetcher's work: a lease of n tokens to ask for (ver is the
// version it is asked under), or, if give, n tokens to give back.
type job struct {
	key  string
	n    int64
	ver  int64
	give bool
}

// gift is a lease taken back from a shard, to return to Redis.
type gift struct {
	key string
	n   int64
}

func newLeaser(s *Store, cfg *Leases, clk clock.Clock) *leaser {
	l := &leaser{
		s:       s,
		clk:     clk,
		divisor: max(cfg.Divisor, 0),
		horizon: int64(cfg.Horizon),
		maxAge:  int64(cfg.MaxAge),
		yields:  msg.WaitYields(runtime.GOMAXPROCS(0)),
		seed:    maphash.MakeSeed(),
		quit:    make(chan struct{}),
	}
	if l.divisor == 0 {
		l.divisor = DefaultLeaseDivisor
	}
	if l.horizon == 0 {
		l.horizon = int64(DefaultLeaseHorizon)
	}
	if l.maxAge == 0 {
		l.maxAge = int64(DefaultLeaseMaxAge)
	}
	l.idle = min(2*l.horizon, l.maxAge)
	l.pool.New = func() any { return &msg.Single{Done: make(chan struct{}, 1)} }
	l.shards = make([]*leaseShard, runtime.GOMAXPROCS(0))
	for i := range l.shards {
		q := &leaseShard{
			l:      l,
			wake:   make(chan struct{}, 1),
			posts:  make(chan post, 256),
			flush:  make(chan chan []gift),
			jobs:   make(chan job, 1024),
			exited: make(chan struct{}),
			keys:   map[string]*lease{},
		}
		l.shards[i] = q
		l.wg.Add(2)
		go q.run()
		go q.fetcher()
	}
	return l
}

// checkLeases is the error of a Leases New refuses, nil if there is none.
func checkLeases(c *Leases) error {
	if c != nil && (c.Divisor < 0 || c.Horizon < 0 || c.MaxAge < 0) {
		return fmt.Errorf("%w: redisstore: negative Leases field", engine.ErrInvalidConfig)
	}
	return nil
}

func (l *leaser) shardOf(key string) *leaseShard {
	return l.shards[maphash.String(l.seed, key)%uint64(len(l.shards))]
}

// ask hands one request to its key's shard and waits for the answer.
func (l *leaser) ask(op msg.Op, key string, cost int64) (shardmsg.Decision, int64, error) {
	q := l.shardOf(key)
	r := l.pool.Get().(*msg.Single)
	r.Op, r.Key, r.Cost, r.Reply = op, key, cost, msg.Reply{}
	r.Arm()
	if !q.push(r) {
		l.pool.Put(r)
		return shardmsg.Decision{}, 0, engine.ErrClosed
	}
	r.Wait(l.yields)
	d, n, err := r.Reply.Decision, r.Cost, r.Reply.Err
	r.Key = ""
	l.pool.Put(r)
	return d, n, err
}

// allow is Allow in lease mode: decided by the key's lease if it covers
// cost or a denial of Redis still holds, else by Redis, which may grant
// the next lease in the same call.
func (l *leaser) allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	s := l.s
	if err := s.check(ctx, key, cost); err != nil {
		return engine.Decision{}, err
	}
	d, want, err := l.ask(msg.OpAllow, key, cost)
	held := d.Remaining
	if err == engine.ErrClosed {
		s.errs[kindClosed].Add(1)
	}
	if err != errRemote {
		return engine.Decision{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter,
			Version: d.Version, Limit: d.Limit, ResetAfter: d.ResetAfter, Band: d.Band}, err
	}
	p := post{key: key, ver: s.cur.Load().p.Version, at: l.clk.Now(), cost: cost, held: held, asked: want}
	if want == 0 {
		p.d, p.dErr = s.allow(ctx, key, cost-held)
	} else {
		reqs := [2]engine.Request{{Key: key, Cost: cost - held}, {Key: key, Cost: want}}
		var out [2]engine.Result
		if err := s.allowBatch(ctx, reqs[:], out[:]); err != nil {
			out[0].Err, out[1].Err = err, err
		}
		p.d, p.dErr, p.leaseD, p.lseErr = out[0].Decision, out[0].Err, out[1].Decision, out[1].Err
		if p.leaseD.Degraded {
			s.uncountFailure() // the failure rule's answer to a lease is no request's
		}
	}
	if p.dErr == nil && !p.d.Allowed && !p.d.Degraded {
		p.d.Remaining = satAdd(p.d.Remaining, held) // the tokens held go back to the lease
	}
	l.shardOf(key).post(p)
	var t tally
	t.add(p.d, p.dErr)
	s.count(&t)
	return p.d, p.dErr
}

// allowBatch is AllowBatch in lease mode: each request as Allow decides
// it, in order.
func (l *leaser) allowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	fail := l.s.usable(ctx)
	var t tally
	for i, r := range reqs {
		if err := l.s.check(ctx, r.Key, r.Cost); err != nil {
			out[i] = engine.Result{Err: err}
			t.add(engine.Decision{}, err)
		} else {
			out[i].Decision, out[i].Err = l.allow(ctx, r.Key, r.Cost)
		}
	}
	l.s.count(&t)
	return fail
}

// before readies key's lease for a Peek (mode "p": it returns the tokens
// the lease holds, which the Peek adds to Redis's answer), a Refund ("r":
// a denial the process keeps for the key no longer holds) or a Charge
// (modeCharge: the lease goes back first, so that the charge takes its
// tokens from the bucket as a whole).
func (l *leaser) before(ctx context.Context, mode, key string) int64 {
	op := msg.OpPeek
	switch mode {
	case "r":
		op = msg.OpRefund
	case modeCharge:
		op = msg.OpCharge
	}
	d, held, err := l.ask(op, key, 1)
	switch {
	case err != errRemote:
	case op == msg.OpPeek:
		return held
	case op == msg.OpCharge && d.Remaining > 0:
		l.giveBack(ctx, []gift{{key, d.Remaining}})
	}
	return 0
}

// flush takes every lease back from the shards and returns its unspent
// tokens to Redis under the version they were taken under: before a
// cutover, and at Close.
func (l *leaser) flush(ctx context.Context) {
	reply := make(chan []gift, 1)
	l.ctl.Add(1)
	defer l.ctl.Add(-1)
	for _, q := range l.shards {
		select {
		case q.flush <- reply:
			l.giveBack(ctx, <-reply)
		case <-q.exited:
		}
	}
}

// giveBack returns unspent tokens to Redis, exactly, capped at capacity:
// one script call per virtual shard, pipelined. What Redis does not take
// is given up, and OnError told.
func (l *leaser) giveBack(ctx context.Context, gs []gift) {
	if len(gs) == 0 {
		return
	}
	s := l.s
	items, outs := make([]item, len(gs)), make([]engine.Result, len(gs))
	for i, g := range gs {
		items[i] = item{out: &outs[i], key: g.key, cost: g.n}
	}
	err := s.need(ctx)
	if err == nil {
		err = s.round(ctx, func(ctx context.Context) error {
			_, err := s.exec(ctx, "r", "", items)
			return err
		})
	}
	for i, it := range items {
		if !it.done || outs[i].Err != nil {
			l.lost(it.cost, cmp.Or(outs[i].Err, err))
		} else {
			l.returned.Add(uint64(it.cost))
		}
	}
}

// lost counts n tokens given up, and tells OnError why.
func (l *leaser) lost(n int64, why error) {
	l.forfeited.Add(uint64(n))
	l.s.report(fmt.Errorf("redisstore: %d leased tokens given up: %w", n, why))
}

// close returns every lease and stops the shards and fetchers.
func (l *leaser) close() {
	l.closing.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.s.timeout)
		l.flush(ctx)
		cancel()
		l.ctl.Add(1)
		close(l.quit)
		l.wg.Wait()
	})
}

// push queues r for the shard, false if it is closed.
func (q *leaseShard) push(r *msg.Single) bool {
	for {
		h := q.head.Load()
		if h == closedLeases {
			return false
		}
		r.Next = h
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

// post hands Redis's answer to the shard, or, once it has exited, returns
// a granted lease at once.
func (q *leaseShard) post(p post) {
	select {
	case q.posts <- p:
	case <-q.exited:
		if n := granted(p); n > 0 {
			q.l.granted.Add(uint64(n))
			q.l.forfeited.Add(uint64(n)) // the store is closing: Redis keeps it
		}
	}
}

// granted is the lease p's call took from Redis.
func granted(p post) int64 {
	if p.asked > 0 && p.lseErr == nil && p.leaseD.Allowed && !p.leaseD.Degraded {
		return p.asked
	}
	return 0
}

// run is the shard's goroutine: it serves queued requests, Redis's
// answers, flushes and the sweep of old leases, until the leaser closes.
func (q *leaseShard) run() {
	defer q.l.wg.Done()
	defer close(q.exited)
	defer close(q.jobs)
	tick := time.NewTicker(time.Duration(max(q.l.idle/2, int64(time.Millisecond))))
	defer tick.Stop()
	for idle := false; ; {
		if g := q.head.Swap(nil); g != nil {
			q.serve(g)
			if q.l.ctl.Load() != 0 { // a flush or Close waits: a busy shard looks between groups
				select {
				case reply := <-q.flush:
					reply <- q.takeAll()
				case <-q.l.quit:
					q.stop()
					return
				default:
				}
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
		case reply := <-q.flush:
			reply <- q.takeAll()
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

// stop closes the queue, serves what it held and hands every lease to the
// fetcher to give back, which it does before it exits.
func (q *leaseShard) stop() {
	if g := q.head.Swap(closedLeases); g != nil {
		q.serve(g)
	}
	for _, g := range q.takeAll() {
		q.send(job{key: g.key, n: g.n, give: true})
	}
}

// serve decides a group of requests taken from the queue, newest first,
// in the order they came, then the answers Redis sent meanwhile.
func (q *leaseShard) serve(g *msg.Single) {
	var prev *msg.Single
	for g != nil {
		g.Next, prev, g = prev, g, g.Next
	}
	now := q.l.clk.Now()
	for range len(q.posts) { // first, so that a caller's next request sees its last answer
		q.settle(<-q.posts)
	}
	st := q.l.s.cur.Load()
	for r := prev; r != nil; {
		next := r.Next
		q.decide(now, st, r)
		r.Finish()
		r = next
	}
	if now >= q.sweepAt {
		q.sweep(now)
	}
}

// decide answers one request from the key's lease, or sends it to Redis.
func (q *leaseShard) decide(now int64, st *state, r *msg.Single) {
	k := q.keys[r.Key]
	if k == nil {
		if r.Op != msg.OpAllow {
			r.Reply.Err, r.Cost = errRemote, 0
			return
		}
		k = &lease{from: now}
		q.keys[strings.Clone(r.Key)] = k
		q.renew(r.Key, k, st)
	} else if k.ver != st.p.Version {
		q.end(r.Key, k, st)
	}
	k.seen = now
	cost := r.Cost
	switch {
	case r.Op == msg.OpPeek:
		r.Reply.Err, r.Cost = errRemote, k.left
	case r.Op == msg.OpRefund: // the balance grows: a denial no longer holds
		r.Reply.Err, k.deniedTill = errRemote, 0
	case r.Op == msg.OpCharge: // the lease goes back before Redis charges the key
		r.Reply.Err, r.Reply.Decision.Remaining, k.left, k.deniedTill = errRemote, k.left, 0, 0
	case cost > k.cap:
		r.Reply.Err = engine.ErrCostExceedsCapacity
	case k.left >= cost:
		k.left -= cost
		k.used += cost
		r.Reply.Decision = k.answer(now, true)
		q.allowed.Add(1)
		if !k.fetch && 2*k.left < k.target {
			q.topUp(now, r.Key, k)
		}
	case now < k.deniedTill && cost == k.deniedCost:
		r.Reply.Decision = k.answer(now, false)
		q.denied.Add(1)
	default:
		r.Reply.Err, r.Cost = errRemote, q.l.want(now, k, cost)
		r.Reply.Decision.Remaining, k.left = k.left, 0
		if r.Cost > 0 {
			k.fetch = true
		}
	}
}

// answer is a decision the lease gives: Remaining and ResetAfter are
// estimates, from the global bucket's last answer and the lease's tokens.
func (k *lease) answer(now int64, allowed bool) shardmsg.Decision {
	d := shardmsg.Decision{Allowed: allowed, Remaining: satAdd(k.remaining, k.left), Version: k.ver,
		Limit: k.limit, ResetAfter: time.Duration(max(0, k.resetAt-now)), Band: k.band}
	if !allowed {
		d.RetryAfter = time.Duration(k.deniedTill - now)
	}
	return d
}

// renew sets k for the version in force, st, holding nothing.
func (q *leaseShard) renew(key string, k *lease, st *state) {
	_, idx := st.p.Resolve(key)
	sh := st.p.ShapeAt(idx)
	c := minCapacity(sh)
	k.ver, k.shape, k.cap, k.max, k.reserve = st.p.Version, sh, c, c/q.l.divisor, c-c/2
	k.remaining, k.resetAt, k.limit, k.band = c, 0, sh.Primary.Capacity, sh.Name
	k.deniedTill, k.target = 0, 0
}

// end closes k's lease at a cutover: its unspent tokens go back, unless
// the new limit raises a band's capacity (returned under the new one,
// they could fill a bucket past the old: the process gives them up).
func (q *leaseShard) end(key string, k *lease, st *state) {
	old := k.shape
	q.renew(key, k, st)
	if k.left > 0 {
		if raises(old, k.shape) {
			q.l.forfeited.Add(uint64(k.left))
		} else {
			q.send(job{key: key, n: k.left, give: true})
		}
		k.left = 0
	}
}

// raises reports whether next gives some band of prev a higher capacity.
func raises(prev, next policy.Shape) bool {
	for i := range next.Len() {
		for j := range prev.Len() {
			if next.BandName(i) == prev.BandName(j) && next.Band(i).Capacity > prev.Band(j).Capacity {
				return true
			}
		}
	}
	return false
}

// want is the lease to ask for with a request of cost (0 for a top-up): as
// much as the key's demand in this process over the last Horizon, within
// the lease's bound, leaving the global bucket (as last heard) its reserve;
// 0 if that is under 2 tokens or a lease is being asked for.
func (l *leaser) want(now int64, k *lease, cost int64) int64 {
	if k.fetch || k.max < 2 {
		return 0
	}
	if el := now - k.from; el > l.horizon {
		k.used, k.from = mulDiv(k.used, l.horizon, el), now-l.horizon
	}
	k.target = min(k.used, k.max)
	if w := min(k.target, k.max-k.left, k.remaining-cost-k.reserve); w >= 2 {
		return w
	}
	k.target = 0 // asks again at the next request Redis decides
	return 0
}

// topUp asks the fetcher for the next lease of a key whose lease runs low.
func (q *leaseShard) topUp(now int64, key string, k *lease) {
	if n := q.l.want(now, k, 0); n > 0 {
		k.fetch = q.send(job{key: key, n: n, ver: k.ver})
	}
}

// send queues j for the fetcher, false if its queue is full (a lease not
// asked for, or given up).
func (q *leaseShard) send(j job) bool {
	select {
	case q.jobs <- j:
		return true
	default:
		if j.give {
			q.l.lost(j.n, errors.New("the lease shard's queue to Redis is full"))
		}
		return false
	}
}

// settle takes in what Redis answered about a key.
func (q *leaseShard) settle(p post) {
	now := p.at
	n := granted(p)
	q.l.granted.Add(uint64(n))
	k := q.keys[p.key]
	if k == nil { // swept meanwhile, in a call longer than MaxAge that asked for no lease
		if unspent(p) {
			q.send(job{key: p.key, n: p.held, give: true})
		}
		return
	}
	if p.asked > 0 {
		k.fetch = false
	}
	if p.cost > 0 && p.dErr == nil && !p.d.Degraded {
		k.learn(now, p.d)
		if p.d.Allowed {
			k.used += p.cost
		} else {
			k.deniedTill, k.deniedCost = now+int64(p.d.RetryAfter), p.cost
		}
	}
	if unspent(p) {
		q.keep(p.key, k, p.held, p.ver) // the request did not spend them
	}
	if p.asked > 0 && p.lseErr == nil && !p.leaseD.Degraded {
		k.learn(now, p.leaseD)
	}
	if n > 0 {
		q.keep(p.key, k, n, p.ver)
		k.got = now
	}
}

// unspent reports whether the tokens p's request took from the lease are
// still the process's: Redis did not admit it (a failure rule's admission
// took nothing from the bucket).
func unspent(p post) bool {
	return p.held > 0 && (p.dErr != nil || !p.d.Allowed || p.d.Degraded)
}

// keep adds n tokens taken under version ver to k's lease, or gives them up
// if k has moved on to another version since: taken across a cutover,
// returning them could top the key up.
func (q *leaseShard) keep(key string, k *lease, n, ver int64) {
	if ver != k.ver {
		q.l.forfeited.Add(uint64(n))
		return
	}
	k.left += n
}

// learn keeps what the global bucket answered.
func (k *lease) learn(now int64, d engine.Decision) {
	k.remaining, k.resetAt, k.limit, k.band = d.Remaining, now+int64(d.ResetAfter), d.Limit, d.Band
}

// sweep gives back the leases kept MaxAge without a grant, and forgets
// the keys that have been idle as long.
func (q *leaseShard) sweep(now int64) {
	q.sweepAt = now + q.l.idle/2
	for key, k := range q.keys {
		switch {
		case k.fetch:
		case k.left > 0 && (now-k.got >= q.l.maxAge || now-k.seen >= q.l.idle):
			if q.send(job{key: key, n: k.left, give: true}) {
				k.left = 0
			}
		case k.left == 0 && now-k.seen >= q.l.maxAge && now >= k.deniedTill:
			delete(q.keys, key)
		}
	}
}

// takeAll takes every lease back, for flush.
func (q *leaseShard) takeAll() []gift {
	var gs []gift
	for key, k := range q.keys {
		if k.left > 0 {
			gs = append(gs, gift{key, k.left})
			k.left = 0
		}
	}
	return gs
}

// fetcher sends the shard's jobs to Redis: the leases asked for in one
// batch call, the leases given back one call each.
func (q *leaseShard) fetcher() {
	defer q.l.wg.Done()
	s := q.l.s
	var asks []job
	var reqs []engine.Request
	var out []engine.Result
	gives := map[string]int64{}
	for j := range q.jobs {
		asks, reqs = asks[:0], reqs[:0]
		for more := true; more; {
			if j.give {
				gives[j.key] += j.n
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
			for k, n := range gives {
				gs = append(gs, gift{k, n})
			}
			clear(gives)
			q.l.giveBack(context.Background(), gs)
		}
		if len(asks) == 0 {
			continue
		}
		out = append(out[:0], make([]engine.Result, len(asks))...)
		at := q.l.clk.Now()
		if err := s.allowBatch(context.Background(), reqs, out); err != nil {
			for i := range out {
				out[i].Err = err
			}
		}
		for i, a := range asks {
			if out[i].Decision.Degraded {
				s.uncountFailure()
			}
			q.post(post{key: a.key, ver: a.ver, at: at, asked: a.n, leaseD: out[i].Decision, lseErr: out[i].Err})
		}
	}
}

// uncountFailure takes back the count of one failure rule's answer.
func (s *Store) uncountFailure() {
	if s.failOpen {
		s.failedOpen.Add(^uint64(0))
	} else {
		s.failedClosed.Add(^uint64(0))
	}
}

// satAdd is a+b, at most math.MaxInt64, for b >= 0 (a may be a debt).
func satAdd(a, b int64) int64 {
	if a > 0 && b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// mulDiv is a*b/c rounded down, at most math.MaxInt64, for a, b >= 0 and
// c > 0.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}
