package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// maxAttempts bounds the script calls one request may take: a newer policy,
// a bucket's history or a missing script each cost one more.
const maxAttempts = 8

// item is one bucket a call sends to the decide script.
type item struct {
	out   *engine.Result // nil in mode "e"
	key   string
	cost  int64
	chain string // the key's limits under retained versions with overrides

	idx      policy.LimitIndex // the shape, resolved under the state the chunk was sent with
	shard    int               // the key's virtual shard
	done     bool
	combined bool  // a single Allow sent with others: its combiner counts its decision
	counted  bool  // decided by Redis in mode "a"
	over     bool  // mode "A": the key's summed cost passed math.MaxInt64, so every capacity
	lease    bool  // a lease asked for: the failure rule's answer counts as no request's
	charge   bool  // a Charge: the failure rule admits it, whatever the rule (see Charge)
	pin      int64 // decided (refunded) under this version only, else answered errMoved (0: any)
	w        int   // the request's work in the script, in fast-path requests (see weight)
	ref      int   // its shape's place among its call's shapes (see callWords)
}

// Allow decides one request, with the same meaning as engine.Engine.Allow,
// against the bucket all stores on the prefix share. The instant is the
// Redis server's TIME. If Redis cannot answer by the context's deadline (or
// Config.Timeout, if sooner), the answer follows the fail-open or
// fail-closed rule, marked engine.Decision.Degraded, and the error is nil
// (so also before the store has first reached Redis: see New); the
// context's error is returned only if it is done before the request goes
// to Redis, or canceled while it waits to: once taken into a call, Redis
// may take its cost, so the request waits for Redis's answer (until its
// deadline), or, if the call fails, returns the context's error.
// Concurrent Allows share script calls (see the package doc).
func (s *Store) Allow(ctx context.Context, key string, cost int64) (engine.Decision, error) {
	if s.uninitialized() {
		return engine.Decision{}, engine.ErrNotInitialized
	}
	var d engine.Decision
	err := s.check(ctx, key, cost)
	switch {
	case err == nil && s.lease != nil:
		return s.lease.decide(ctx, s.deadline(ctx), key, cost) // which counts it
	case err == nil:
		d, err = s.decideOne(ctx, key, cost, 0)
	}
	s.countOne(d, err)
	return d, err
}

// usable is the error of a call on a closed store, or under a nil or ended
// context, in that order; nil if there is none. A context whose deadline
// has passed has ended (see ended), even before its timer has fired: sent,
// its request would meet go-redis's connection deadline at once, and be
// answered by the failure rule as though Redis could not be reached.
func (s *Store) usable(ctx context.Context) error {
	switch {
	case s.closed.Load():
		return engine.ErrClosed
	case ctx == nil:
		return engine.ErrNilContext
	}
	err := ended(ctx)
	if err != nil && s.closed.Load() {
		return engine.ErrClosed // Close began as ctx ended: it comes first
	}
	return err
}

// badKey reports whether key is not a valid key: blank, or too long.
func (s *Store) badKey(key string) bool {
	return strings.TrimSpace(key) == "" || len(key) > s.maxKeyBytes
}

// check is the error of one request before it goes to Redis: its key, its
// cost (see checkReq), then the store and ctx (see usable).
func (s *Store) check(ctx context.Context, key string, cost int64) error {
	return cmp.Or(s.checkReq(key, cost), s.usable(ctx))
}

// checkReq is the error of a request's key or cost, nil if both are valid.
func (s *Store) checkReq(key string, cost int64) error {
	switch {
	case s.badKey(key):
		return engine.ErrInvalidKey
	case cost < 1:
		return engine.ErrInvalidCost
	}
	return nil
}

// failOne is fail for one request.
func (s *Store) failOne(ctx context.Context, key string, cost int64, err error) (engine.Decision, error) {
	var out engine.Result // a canceled ctx's error, if fail returns it
	_ = s.fail(ctx, []item{{out: &out, key: key, cost: cost}}, err)
	return out.Decision, out.Err
}

// Peek reports key's balance now without changing it, with the meaning of
// engine.Engine.Peek: a Decision for a request of one token that spends
// nothing, over every band of the key's limit. It creates no bucket: a key
// not in Redis reports a full bucket of the limit it would get. Its errors
// are Allow's but ErrInvalidCost and ErrCostExceedsCapacity; it is not a
// decision, so when Redis cannot answer it returns an error wrapping
// ErrUnavailable rather than the fail-open or fail-closed answer.
func (s *Store) Peek(ctx context.Context, key string) (engine.Decision, error) {
	return s.one(ctx, "p", key, 1)
}

// Refund credits tokens (>= 1, else engine.ErrInvalidCost) back to key,
// with the meaning of engine.Engine.Refund: exactly, to every band of the
// key's limit, each capped at its capacity. It never creates a bucket:
// refunding a key not in Redis (never seen, or expired because it was
// full) changes nothing. It answers like Peek, with the balance after the
// refund, and fails like Peek, but for a Redis out of memory, which refuses
// it and credits nothing: engine.ErrKeyCapacity. A refund whose answer is
// lost may or may not have been credited; it is never credited twice.
func (s *Store) Refund(ctx context.Context, key string, tokens int64) (engine.Decision, error) {
	return s.one(ctx, "r", key, tokens)
}

// one runs and counts one Peek (mode "p"), Refund ("r") or Charge
// (modeCharge), each a script call of its own. A Peek or Refund Redis does
// not answer is an error; a Charge is answered as Charge says.
func (s *Store) one(ctx context.Context, mode, key string, tokens int64) (engine.Decision, error) {
	if s.uninitialized() {
		return engine.Decision{}, engine.ErrNotInitialized
	}
	if err := s.check(ctx, key, tokens); err != nil {
		s.errs[kindOf(err)].Add(1)
		return engine.Decision{}, err
	}
	var held, ver int64
	// One deadline for the lease's give-back, reaching Redis (a store
	// started without it) and the call.
	rctx := ctx
	if s.lease != nil || !s.ready.Load() {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	if s.lease != nil {
		held, ver = s.lease.before(rctx, mode, key)
	}
	var out engine.Result
	err := s.need(rctx)
	if err == nil {
		_, err = roundGet(rctx, s, func(ctx context.Context) (int, error) {
			return s.exec(ctx, mode, "", []item{{out: &out, key: key, cost: tokens}})
		})
	}
	if err != nil && ended(ctx) == nil && ended(rctx) != nil && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err) // the store's Timeout, not the caller's deadline
	}
	if err != nil && mode == modeCharge {
		if !errors.Is(ctx.Err(), context.Canceled) { // see Charge: allowed, Degraded, counted and told
			s.report(unavailable(err))
			return s.failResult(s.cur.Load(), &item{key: key, charge: true}, 1).Decision, nil
		}
		err = ctx.Err()
	}
	if err = cmp.Or(err, out.Err); err != nil {
		s.errs[kindOf(err)].Add(1)
		return engine.Decision{}, err
	}
	d, n := out.Decision, &s.allowed // a charge, as the engine counts it: an admission
	switch mode {
	case "p":
		n = &s.peeks
	case "r":
		n = &s.refunds
	}
	if held > 0 && d.Version == ver { // a Peek's or a Refund's: what this process's lease holds counts, unless the call met a cutover, which ends the lease
		d.Remaining = min(satAdd(d.Remaining, held), d.Limit)
		d.Allowed, d.RetryAfter = true, 0 // a request of one token would take it from the lease
	}
	n.Add(1)
	return d, nil
}

// AllowBatch decides reqs[i] into out[i], with the same meaning as
// engine.Engine.AllowBatch: about ChunkSize requests per script call, each
// call deciding its requests in order at one instant, and all calls
// pipelined in one round trip (a key with more than ChunkSize requests
// sends the rest in further rounds). Redis failures are answered per
// request as Allow's are.
func (s *Store) AllowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result) error {
	switch {
	case s.uninitialized():
		for i := range min(len(reqs), len(out)) {
			out[i] = engine.Result{Err: engine.ErrNotInitialized} // as a zero engine.Engine's
		}
		return engine.ErrNotInitialized
	case len(out) < len(reqs): // in the engine's words
		return fmt.Errorf("%w: len(out) %d < len(reqs) %d", engine.ErrInvalidConfig, len(out), len(reqs))
	}
	if s.lease != nil {
		return s.lease.allowBatch(ctx, reqs, out)
	}
	err := s.allowBatch(ctx, reqs, out, len(reqs))
	var t tally
	for i := range reqs {
		t.add(out[i].Decision, out[i].Err)
	}
	s.count(&t)
	return err
}

// allowBatch is AllowBatch, out long enough, without its counting; the
// requests from reqs[leases] on ask for leases, whose failure rule's
// answers count as no request's.
func (s *Store) allowBatch(ctx context.Context, reqs []engine.Request, out []engine.Result, leases int) error {
	fail := s.usable(ctx)
	items := make([]item, 0, len(reqs))
	for i, r := range reqs {
		if out[i] = (engine.Result{Err: s.check(ctx, r.Key, r.Cost)}); out[i].Err == nil {
			items = append(items, item{out: &out[i], key: r.Key, cost: r.Cost, lease: i >= leases})
		}
	}
	if fail != nil || len(items) == 0 {
		return fail
	}
	return s.decideItems(ctx, items)
}

// decideItems decides items (mode "a"), checked, under ctx bounded by the
// store's Timeout, answering the undecided ones if it fails (see fail).
// It is the path of a batch, and of a single Allow sent alone.
func (s *Store) decideItems(ctx context.Context, items []item) error {
	if ok, err := s.upExec(ctx, "a", items); !ok || err != nil {
		return s.fail(ctx, items, err)
	}
	return nil
}

// upExec reaches Redis if the store has not yet (see up), then, if it has,
// runs items through the decide script in mode (see exec): one deadline
// for both, ctx's bounded by the store's Timeout. ok reports whether the
// store had reached Redis; err is up's error, or exec's.
func (s *Store) upExec(ctx context.Context, mode string, items []item) (ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if ok, err = s.up(ctx); ok {
		_, err = s.exec(ctx, mode, "", items)
	}
	return ok, err
}

// fail answers every undecided item: with ctx's error, which it returns, if
// ctx was canceled, else by the fail-open or fail-closed rule, telling
// OnError err (the attempt's error, nil if this call made none).
func (s *Store) fail(ctx context.Context, items []item, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		for i := range items {
			if !items[i].done {
				*items[i].out = engine.Result{Err: ctx.Err()}
			}
		}
		return ctx.Err()
	}
	s.failAnswers(items)
	s.report(unavailable(err))
	return nil
}

// unavailable is err, a failure the failure rule answered for, as OnError
// is told it: wrapping ErrUnavailable (a deadline that passed then says
// where), unless it already does or is ErrNotReplicated or ErrKeyTags.
func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrKeyTags) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// report tells OnError err, if there is one to tell and an OnError to
// tell it.
func (s *Store) report(err error) {
	if err != nil && s.onError != nil {
		s.onError(err)
	}
}

// failAnswers answers every undecided item by the fail-open or fail-closed
// rule, and counts those that are not leases.
func (s *Store) failAnswers(items []item) {
	st := s.cur.Load()
	for i := range items {
		if it := &items[i]; !it.done {
			n := uint64(1)
			if it.lease {
				n = 0
			}
			*it.out = s.failResult(st, it, n)
		}
	}
}

// failResult is the failure rule's answer to it under st, counted as n
// requests: admitted with nothing Remaining (fail open, and a charge
// whatever the rule), or denied with RetryAfter Config.FailRetryAfter
// (fail closed); Degraded either way. A cost no band of the key's shape
// holds is engine.ErrCostExceedsCapacity (not counted), whatever Redis
// would say.
func (s *Store) failResult(st *state, it *item, n uint64) engine.Result {
	sh := st.p.ShapeAt(st.p.Overrides.Resolve(it.key))
	if it.over || it.cost > minCapacity(sh) {
		return engine.Result{Err: engine.ErrCostExceedsCapacity}
	}
	d := engine.Decision{Allowed: s.failOpen || it.charge, Version: st.p.Version, Limit: sh.Primary.Capacity, Band: sh.Name, Degraded: true}
	counter := &s.failedOpen
	if !d.Allowed {
		d.RetryAfter, counter = s.failRetry, &s.failedClosed
	}
	counter.Add(n)
	return engine.Result{Decision: d}
}

// exec runs items through the decide script in mode "a" (decide), "A"
// (decide all or nothing: items of distinct keys, in one chunk), "p"
// (peek), "r" (refund), "d" (charge), "e" (bring up to date; delete if
// full) or "c" (bring up to date), at the server's TIME or, for modes "e"
// and "c", at the instant at. It pipelines one call per chunk (see route)
// and repeats, for the items not yet done, the calls that met a newer
// policy, a history their bucket needs or a missing script. It returns how
// many buckets mode "e" deleted, and the first error that stopped it:
// Redis's or the context's. (A Redis out of memory answers modes "a", "A",
// "d" and "r" with engine.ErrKeyCapacity per request.) A failure that may
// mean a lost node has the cluster client reload its slot map (see
// nodeFailed); the call is not sent again.
func (s *Store) exec(ctx context.Context, mode, at string, items []item) (deleted int, err error) {
	defer func() { s.nodeFailed(ctx, err) }()
	st0, weigh := s.cur.Load(), len(items) > 1 && mode != modeAll // mode "A" is one call, whatever its work
	todo := make([]*item, len(items))
	for i := range items {
		it := &items[i]
		it.w = 1
		if weigh {
			it.w = weight(st0, it.key)
		}
		if mode == "c" || mode == "e" { // a pass: its buckets replay the cutovers they missed
			it.w = max(it.w, replayWeight)
		}
		todo[i] = it
	}
	todo, waves := rounds(todo) // the first round's items, and each later round's
	var km *keyMap              // the key map the items' shards are of
	busy := 0                   // rounds that met a slot being migrated (TRYAGAIN)
	eval := false               // send EVALSHA, not FCALL: a Redis out of memory refuses FCALL before it runs
	var later []*item           // items held for the next round (see route), the next of waves among them
	loaded := false             // a round loaded the decide script
	for attempt := 0; len(todo) > 0 || len(later) > 0; attempt++ {
		switch {
		case attempt > 0 && len(todo) == 0:
			attempt-- // only items held back: a round, not an attempt
		case attempt == maxAttempts:
			return deleted, fmt.Errorf("%w: gave up after %d attempts (policies changing too fast?)", ErrUnavailable, maxAttempts)
		}
		st := s.cur.Load()
		todo, later = unpinned(todo, st), unpinned(later, st)
		for len(todo)+len(later) == 0 && len(waves) > 0 { // every item of the round answered: the next round's
			later, waves = unpinned(waves[0], st), waves[1:]
			for i := 0; km != nil && i < len(later); i++ { // else the first round's, below
				later[i].shard = km.shardOf(later[i].key, len(s.shards))
			}
		}
		if len(todo)+len(later) == 0 {
			break
		}
		all := append(todo, later...)
		if m := s.kmap.Load(); m != km { // the first round, or a key map adopted (see syncKeyMap)
			km = m
			for _, it := range all {
				it.shard = km.shardOf(it.key, len(s.shards))
			}
			if mode == modeAll && s.cluster != nil && slices.ContainsFunc(all, func(it *item) bool { return it.shard != all[0].shard }) {
				return deleted, ErrCrossShard // under a key map adopted since AllowAll checked: one call cannot take them
			}
		}
		var chunks [][]*item
		chunks, later = s.route(all)
		if len(waves) > 0 { // after the items route held: a key's items go in order
			for _, it := range waves[0] {
				it.shard = km.shardOf(it.key, len(s.shards))
			}
			later, waves = append(later, waves[0]...), waves[1:]
		}
		for _, c := range chunks {
			if attempt > 0 && slices.Contains(todo, c[0]) { // sent again: not a call of held-back items only
				s.retries.Add(1)
			}
		}
		cmds := s.send(ctx, st, km, chunks, mode, at, eval)
		var p pass
		for c, cmd := range cmds {
			if err := s.read(ctx, st, mode, chunks[c], cmd, &p); err != nil {
				return deleted + p.deleted, err
			}
		}
		deleted, todo, eval = deleted+p.deleted, p.todo, eval || p.eval
		if p.failed == nil && p.tryAgain && len(p.load) == 0 && !p.reload && len(p.behind) == 0 {
			// Only a migration stood in the way: wait for it, as long as the
			// call's deadline allows, without counting an attempt.
			attempt--
			busy++
			p.failed = sleep(ctx, time.Duration(min(busy, 20))*time.Millisecond)
		} else if p.failed == nil {
			// a second miss: the slot map may be behind a MOVED (see loadDecide)
			p.loadAll, loaded = loaded, loaded || len(p.load) > 0
			p.failed = s.mend(ctx, st, &p)
		}
		if p.failed != nil {
			return deleted, cmp.Or(ctx.Err(), p.failed)
		}
	}
	return deleted, nil
}

// pass is what one round of exec's calls met: the items Redis did not
// decide, to be sent again, and what stood in their way: a slot being
// migrated (tryAgain), a shard mid-cutover (repair), a script not loaded
// (load), a newer policy or a shard without one (reload).
type pass struct {
	todo    []*item // the items to send again
	behind  []*item // those of chunks that stopped for a chain
	missing []int   // shards with no version
	lagging []lag   // shards behind the committed version
	failed  error   // the first chunk Redis failed; the others still count
	deleted int     // buckets mode "e" deleted
	eval    bool    // FCALL met a Redis out of memory: send EVALSHA from now on

	load    []string // a key of each call that met the script not loaded (see loadDecide)
	loadAll bool     // an earlier round loaded it already: load it on every master

	tryAgain, repair, reload bool
}

// read takes one chunk's reply to cmd, under st, into p: it answers the
// items Redis decided, and notes the others, to be sent again, with what
// stopped them, or the chunk's failure. Only a status it does not know is
// an error.
func (s *Store) read(ctx context.Context, st *state, mode string, chunk []*item, cmd *redis.Cmd, p *pass) error {
	raw, err := cmd.Slice()
	home := s.stateShard(chunk[0].shard)
	if err != nil {
		// by FCALL: the call's own word, not noFunc, which a concurrent
		// call's refusal may have set since this one was sent
		viaFunc := cmd.Args()[0] == "fcall"
		switch a := classify(err); {
		case a == actWait && (s.cluster != nil || redis.HasErrorPrefix(err, "TRYAGAIN")) && !s.movedToFailed(ctx, err):
			p.tryAgain = true
		case a == actLoad:
			p.load = append(p.load, s.shards[home].policy)
		case a == actNoFunc && viaFunc:
			s.noFunc.Store(true)
			p.load = append(p.load, s.shards[home].policy)
		case a == actOOM && viaFunc:
			p.eval = true
		case a == actOOM && (mode == "a" || mode == modeAll || mode == modeCharge || mode == "r"):
			for _, it := range chunk {
				*it.out, it.done = engine.Result{Err: engine.ErrKeyCapacity}, true
				if (mode == "a" || mode == modeAll) && (it.over || it.cost > minCapacity(st.p.ShapeAt(it.idx))) {
					it.out.Err = engine.ErrCostExceedsCapacity // checked before the key bound
				}
			}
			return nil
		default:
			// Not sent again (see classify). A call that never left
			// could be, but the slot map would send it to the same
			// node until the reload asked here has landed.
			s.nodeFailed(ctx, err) // each chunk's: the first failed may be another node's
			p.failed = cmp.Or(p.failed, fmt.Errorf("%w: %w", ErrUnavailable, err))
			return nil
		}
		p.todo = append(p.todo, chunk...) // the script did not run: sent again
		return nil
	}
	r, err := parseReply(raw)
	if err != nil {
		p.failed = cmp.Or(p.failed, err)
		return nil
	}
	p.deleted += r.deleted
	for i, it := range chunk[:r.done] {
		if it.out != nil {
			s.decided(it, st, mode, r.results[3*i].(int64), r.results[3*i+1], r.results[3*i+2])
		}
		it.done = true
	}
	rest := chunk[r.done:]
	switch r.status {
	case "ok":
		return nil
	case "nopolicy", "keymap": // no policy, or a key map not the caller's: see syncKeyMap
		p.reload, p.missing = true, append(p.missing, home)
	case "stale":
		if !storedVersion(r.behind) { // not one a store writes: no reload mends it
			p.failed = cmp.Or(p.failed, fmt.Errorf("%w: virtual shard %d holds version %q, not a version", ErrUnavailable, home, r.behind))
			return nil
		}
		p.reload = true
		if strings.HasPrefix(r.behind, "p") { // mid-cutover: settled by mend
			p.repair = true
		} else if v, err := strconv.ParseInt(r.behind, 10, 64); err == nil && v < st.p.Version {
			// A shard behind the version this store has, which is
			// committed (a store learns no other): one reinstalled
			// while a cutover committed. Published to it by mend.
			p.lagging = append(p.lagging, lag{home, r.behind})
		}
	case "chain":
		// Give every bucket left in the chunk its limits under every
		// retained version with overrides (the script uses those after
		// each bucket's own version): one more round trip, however many
		// buckets are behind.
		p.behind = append(p.behind, rest...)
	default:
		return fmt.Errorf("%w: unexpected script status %q", ErrUnavailable, r.status)
	}
	p.todo = append(p.todo, rest...)
	return nil
}

// mend sets right, in this order and up to the first error, what a round
// of calls under st met before its items are sent again: chains to fetch,
// a shard mid-cutover, shards lagging or missing, a script not loaded, a
// newer policy. It runs after every chunk's answer is taken: a failure
// here must not discard the decisions Redis made for the chunks after it.
func (s *Store) mend(ctx context.Context, st *state, p *pass) error {
	var err error
	if len(p.behind) > 0 {
		err = s.chains(ctx, p.behind, st)
	}
	if err == nil && p.repair {
		// A shard met mid-cutover (its version "p" and the next): the
		// process that began it may have died, and the call cannot wait
		// for it, so it finishes it, or only publishes it.
		if _, e := s.settle(ctx, ""); !errors.Is(e, errShardMoved) {
			err = e
		}
	}
	for i := 0; err == nil && i < len(p.lagging); i++ {
		err = s.raise(ctx, p.lagging[i], st.p)
	}
	if err == nil && len(p.missing) > 0 {
		if err = s.reload(ctx); err == nil {
			err = s.syncKeyMap(ctx) // before a shard's copy is written
		}
		if err == nil {
			err = s.ensureShards(ctx, p.missing)
		}
	}
	if err == nil && len(p.load) > 0 {
		at := p.load
		if p.loadAll {
			at = nil
		}
		err = s.loadDecide(ctx, at)
	}
	if err == nil && p.reload {
		err = s.reload(ctx)
	}
	return err
}

// errMoved answers an item pinned to a version no longer in force.
var errMoved = errors.New("redisstore: the policy version moved on")

// unpinned is items less those pinned to a version other than st's, which
// it answers errMoved.
func unpinned(items []*item, st *state) []*item {
	return slices.DeleteFunc(items, func(it *item) bool {
		if it.pin == 0 || it.pin == st.p.Version {
			return false
		}
		*it.out, it.done = engine.Result{Err: errMoved}, true
		return true
	})
}

// send queues one decide call per chunk, all under st, and sends them. One
// call goes as a command on one server, not a pipeline of one, which costs
// the client more: a Pipeline, its commands' slice and the pipeline's path
// through go-redis. A single Allow is most calls. On a cluster it goes as
// a pipeline of one all the same (about half as much again), since a
// command there may wait on go-redis's read of the command table past its
// deadline (see one). go-redis follows MOVED and ASK for the command as for
// a pipeline's, and never resends it (noRetryCmd).
func (s *Store) send(ctx context.Context, st *state, km *keyMap, chunks [][]*item, mode, at string, eval bool) []*redis.Cmd {
	// the server's TIME and expiries, or Config.Clock's readings and none
	nowArg, expiry := cmp.Or(at, s.nowArg()), flag(s.clk == nil)
	cmds := make([]*redis.Cmd, len(chunks))
	queue := func(via processor, c int) *redis.Cmd {
		sk := s.shards[s.stateShard(chunks[c][0].shard)]
		// FCALL, or EVALSHA with eval or once FUNCTION was refused; never
		// retried by go-redis
		a := s.callWords(sk, st, km, chunks[c], mode, nowArg, expiry)
		a[0], a[1], a[2] = "fcall", decideFunc, keyBuckets-1+len(chunks[c])
		if eval || s.noFunc.Load() {
			a[0], a[1] = "evalsha", decideScript.Hash()
		}
		cmds[c] = redis.NewCmd(ctx, a...)
		_ = via.Process(ctx, noRetryCmd{cmds[c]})
		return cmds[c]
	}
	if len(chunks) == 1 {
		queue(direct{s}, 0)
		return cmds
	}
	pipeline := func(group []int) {
		_, _ = inPipeline(ctx, s, len(group), func(pipe redis.Pipeliner, i int) *redis.Cmd { return queue(pipe, group[i]) }) // each command holds its error
	}
	// One pipeline per master, all at once (the first on this goroutine,
	// each other in one of its own): go-redis ends a cluster pipeline that
	// retries a master it cannot reach by giving every command the last
	// error, the other masters' replies too, which would then be answered
	// by the failure rule though their scripts ran.
	groups := s.byMaster(ctx, chunks)
	var wg sync.WaitGroup
	for _, group := range groups[1:] {
		wg.Go(func() { pipeline(group) })
	}
	pipeline(groups[0])
	wg.Wait()
	return cmds
}

// byMaster groups the indexes of chunks by the master that holds their
// virtual shard, as the cluster's slot map says now: one group on one
// server, and one for the chunks whose master the slot map cannot tell.
func (s *Store) byMaster(ctx context.Context, chunks [][]*item) [][]int {
	var groups [][]int
	var masters []*redis.Client // of groups, in order: a few, so searched
	for c, chunk := range chunks {
		var m *redis.Client // nil: one server, or no slot map to be had
		if s.cluster != nil {
			m, _ = s.cluster.MasterForKey(ctx, s.shards[s.stateShard(chunk[0].shard)].policy)
		}
		g := slices.Index(masters, m)
		if g < 0 {
			g, masters, groups = len(groups), append(masters, m), append(groups, nil)
		}
		groups[g] = append(groups[g], c)
	}
	return groups
}

// sleep waits d, or until ctx ends: then it returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// The decide script's key and argument positions, from 1 as in Lua: the
// KEY and ARG tables at the top of decide.lua, which a test compares with
// these.
const (
	keyPolicy = 1 + iota
	keyHistory
	keyPending
	keyBuckets // the first bucket's
)

const (
	argMode = 1 + iota
	argVersion
	argNow
	argExpiry
	argPer
	argSeed   // the key map's seed: the shard refuses a call whose keys another map placed
	argShapes // then each shape's cap and rate, then each bucket's words
)

// callWords is the decide script call of chunk, bound for the shard whose
// keys sk are: callHead words left for send, the keys (policy,
// history, pending flag, then each item's bucket), and the arguments: mode,
// version, instant, expiry, the words per item, km's seed (the map the
// items' shards are of), the chunk's distinct shapes and each one's
// capacity and rate argument, in the order first met, then each item's
// words: its cost, then, unless every item has the first shape and no
// chain, its shape's number, followed by ";" and its chain if it has one.
// It resolves each item's shape (it.idx) under st.
func (s *Store) callWords(sk shardKeys, st *state, km *keyMap, chunk []*item, mode, nowArg, expiry string) []any {
	var inline [8]policy.LimitIndex
	shapes := inline[:0] // the chunk's distinct shapes, in the order first met
	one := true          // every item has the first shape, and no chain
	for _, it := range chunk {
		it.idx = st.p.Overrides.Resolve(it.key)
		j := slices.Index(shapes, it.idx) // a chunk has few shapes: overrides are few
		if j < 0 {
			j = len(shapes)
			shapes = append(shapes, it.idx)
		}
		it.ref = j
		one = one && j == 0 && it.chain == ""
	}
	n, per := len(chunk), 2
	if one {
		per = 1
	}
	nkeys := keyBuckets - 1 + n
	a := make([]any, callHead+nkeys+argShapes+2*len(shapes)+per*n)
	copy(a[callHead+keyPolicy-1:], sk.words[:])
	for i, it := range chunk {
		a[callHead+keyBuckets-1+i] = s.shards[it.shard].bucket + it.key
	}
	arg := a[callHead+nkeys-1:] // arg[argX] is ARGV[argX]
	arg[argMode], arg[argVersion], arg[argNow], arg[argExpiry] = word(mode), st.verWord, word(nowArg), word(expiry)
	arg[argPer], arg[argSeed], arg[argShapes] = per, km.word, len(shapes)
	if repeats(chunk) {
		arg[argExpiry] = "0m"
		if expiry == "1" {
			arg[argExpiry] = "1m"
		}
	}
	g := callHead + nkeys + argShapes
	for _, x := range shapes {
		la := st.args[x]
		a[g], a[g+1] = la.capacity, la.rate
		g += 2
	}
	for _, it := range chunk {
		a[g] = any(it.cost)
		if it.over {
			a[g] = aboveInt64
		}
		g++
		if one {
			continue
		}
		if it.chain == "" {
			a[g] = it.ref + 1 // a small int, boxed without allocating
		} else {
			a[g] = strconv.Itoa(it.ref+1) + ";" + it.chain
		}
		g++
	}
	return a
}

// words are the constant words of a call's head, each boxed once (a string
// boxed anew allocates); word is w boxed, from words if it is one.
var words = map[string]any{"": "", "a": "a", modeAll: modeAll, "p": "p", "r": "r",
	modeCharge: modeCharge, "e": "e", "c": "c", "0": "0", "1": "1"}

func word(w string) any {
	if v, ok := words[w]; ok {
		return v
	}
	return w
}

// decided turns a script result of mode "a", "A", "p", "r" or "d" into its
// Decision. AllowAll counts its own decisions, per request.
func (s *Store) decided(it *item, st *state, mode string, code int64, x, y any) {
	switch {
	case mode == modeAll:
		mode = "a" // each key is answered as Allow would answer its summed cost
	case mode == "a" && it.combined:
		it.counted = true
	case mode == "a" || mode == modeCharge: // a charge is counted in Allowed, as the engine counts it
		s.decisions.Add(1)
	}
	if code == codeOverCap {
		*it.out = engine.Result{Err: engine.ErrCostExceedsCapacity}
		return
	}
	d, err := decision(st.p.ShapeAt(it.idx), mode, code == codeAllowed, x, y, it.cost)
	if err != nil {
		*it.out = engine.Result{Err: fmt.Errorf("%w: %w", ErrUnavailable, err)}
		return
	}
	d.Version = st.p.Version
	*it.out = engine.Result{Decision: d}
}

// decision is the Decision of a script result for a key of shape sh: for
// mode "a", of the request of cost the script decided (allowed or
// denied); for modes "p" and "r", of a request of one token taking nothing,
// as the bands stand after the operation; for mode "d", of the charge, as
// the bands stand after it. x and y are the balance the
// script returned: whole tokens and the fraction (two integers, the fast
// path's), or the units of each band as decimals and "" or the time until
// the bucket's last update, which refills nothing before it comes: a
// denial's RetryAfter and a ResetAfter count that time too. The binding
// band is chosen by the policy package's rule (policy.DecideLevels), from
// the balances the decision saw.
func decision(sh policy.Shape, mode string, allowed bool, x, y any, cost int64) (engine.Decision, error) {
	var buf [1 + policy.MaxBands]policy.Level
	lv := buf[:sh.Len()]
	ahead, err := levels(sh, x, y, lv)
	if err != nil {
		return engine.Decision{}, err
	}
	var o policy.Outcome
	var at int
	switch mode {
	case "a":
		if allowed {
			for i := range lv {
				lv[i].Tokens += cost // the balances the decision saw
			}
		}
		if o, at = policy.DecideLevels(sh, lv, cost); o.Allowed != allowed {
			return engine.Decision{}, fmt.Errorf("the script decided allowed=%v on balances %v %v that decide %v", allowed, x, y, o.Allowed)
		}
	case modeCharge:
		// allowed, for the band with the fewest whole tokens left (ties to
		// the lowest index), as policy.ChargeLevels describes it
		for i := 1; i < len(lv); i++ {
			if lv[i].Tokens < lv[at].Tokens {
				at = i
			}
		}
		o = policy.Outcome{Allowed: true, Remaining: lv[at].Tokens, ResetAfter: lv[at].ResetAfter(sh.Band(at))}
	default:
		o, at = policy.PeekLevels(sh, lv)
	}
	if !o.Allowed {
		o.RetryAfter = satAdd(o.RetryAfter, ahead) // ahead is 0 once the last update has come
	}
	if o.ResetAfter > 0 {
		o.ResetAfter = satAdd(o.ResetAfter, ahead)
	}
	return engine.Decision{
		Allowed:    o.Allowed,
		Remaining:  o.Remaining,
		RetryAfter: time.Duration(o.RetryAfter),
		Limit:      sh.Band(at).Capacity,
		ResetAfter: time.Duration(o.ResetAfter),
		Band:       sh.BandName(at),
	}, nil
}

// levels reads a script's balance (see decision) into lv, one level per
// band of sh, and returns the ns until the bucket's last update (0 if it
// has come), saturated at math.MaxInt64.
func levels(sh policy.Shape, x, y any, lv []policy.Level) (ahead int64, err error) {
	if t, ok := x.(int64); ok {
		f, ok := y.(int64)
		if !ok || len(lv) != 1 || t < -sh.Primary.Capacity || f < 0 || uint64(f) >= period(sh.Primary) {
			return 0, fmt.Errorf("balance %v %v for %d bands", x, y, len(lv))
		}
		lv[0] = policy.Level{Tokens: t, Frac: uint64(f)}
		return 0, nil
	}
	units, ok := x.(string)
	if !ok {
		return 0, fmt.Errorf("balance %v %v", x, y)
	}
	if lag, _ := y.(string); lag != "" {
		if ahead, err = parseAhead(lag); err != nil {
			return 0, err
		}
	}
	rest := units
	for i := range lv {
		u, tail, _ := strings.Cut(rest, " ")
		l, err := parseSigned(u, period(sh.Band(i)))
		if err != nil {
			return 0, err
		}
		lv[i], rest = l, tail
	}
	if rest != "" {
		return 0, fmt.Errorf("balances %q for %d bands", units, sh.Len())
	}
	return ahead, nil
}

// chains gives each item its own shapes under the retained versions that
// carry overrides, but the one in force (the script has that one).
func (s *Store) chains(ctx context.Context, items []*item, st *state) error {
	vs, overridden, err := s.history(ctx)
	if err != nil {
		return err
	}
	var ps []policy.Policy
	for i, v := range vs {
		if !overridden[i] || v == st.p.Version {
			continue
		}
		p, err := s.policyAt(ctx, v)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	for _, it := range items {
		var b strings.Builder
		for _, p := range ps {
			sh := p.ShapeAt(p.Overrides.Resolve(it.key))
			if b.Len() > 0 {
				b.WriteByte(';')
			}
			fmt.Fprintf(&b, "%d %d %s", p.Version, sh.Primary.Capacity, encodeShape(sh).arg())
		}
		it.chain = b.String()
	}
	return nil
}

// history reads the retained versions, oldest first, and whether each
// carries overrides. The history list holds one entry per retained
// version: "version cutover cap rate overridden", then " bands" if the
// default shape has bands.
func (s *Store) history(ctx context.Context) (vs []int64, overridden []bool, err error) {
	raw, err := one(ctx, s, func(c redis.Cmdable) *redis.StringSliceCmd { return c.LRange(ctx, s.kHistory, 0, -1) }).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: reading the policy history: %w", ErrUnavailable, err)
	}
	for _, e := range raw {
		if f := strings.Fields(e); len(f) == 5 || len(f) == 6 {
			if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				vs, overridden = append(vs, v), append(overridden, f[4] == "1")
				continue
			}
		}
		return nil, nil, fmt.Errorf("%w: malformed history entry %q", ErrUnavailable, e)
	}
	return vs, overridden, nil
}

// rounds splits items, in order, into the rounds route would send them in
// if every call succeeded: a key's items go in a round until their work
// there reaches ChunkSize, the rest in the rounds after. Split once, each
// round routes only its own items: routing every item still held, each
// round, cost a key repeated n times O(n*n/ChunkSize) on the client.
func rounds(items []*item) (first []*item, rest [][]*item) {
	w := 0
	for _, it := range items {
		w += it.w
	}
	if w <= ChunkSize {
		return items, nil
	}
	type at struct{ round, work int }
	keys := make(map[string]at, len(items))
	first = items[:0] // in place: it never passes the item it takes
	for _, it := range items {
		k := keys[it.key]
		if k.work >= ChunkSize {
			k = at{round: k.round + 1}
		}
		k.work += it.w
		keys[it.key] = k
		if k.round == 0 {
			first = append(first, it)
			continue
		}
		if k.round > len(rest) {
			rest = append(rest, nil)
		}
		rest[k.round-1] = append(rest[k.round-1], it)
	}
	return first, rest
}

// repeats reports whether a key comes more than once in chunk.
func repeats(chunk []*item) bool {
	if len(chunk) <= 16 {
		for i, it := range chunk {
			if slices.ContainsFunc(chunk[:i], func(o *item) bool { return o.key == it.key }) {
				return true
			}
		}
		return false
	}
	seen := make(map[string]struct{}, len(chunk))
	for _, it := range chunk {
		if _, ok := seen[it.key]; ok {
			return true
		}
		seen[it.key] = struct{}{}
	}
	return false
}

// replayWeight is about what a bucket that replays a cutover costs the
// decide script, in requests of the fast path: the general path's limbs,
// through the cutover and on to now. Each bucket a pass (modes "c" and
// "e") brings up to date counts as at least that much, so that a pass's
// calls hold Redis no longer than a batch's (TestPassCallsBounded).
const replayWeight = 8

// weight is about what a request of key costs the decide script, in
// requests of the fast path (~1 us each): a limit beyond the fast path
// (limbs) about 8, each band of a limit with bands about 5 (measured with
// SLOWLOG on 10,000-request batches: 8 us and 25 us a request, for 4
// bands). So a call of ChunkSize of work holds Redis about 0.3 ms. A
// bucket that replays cutovers it missed costs more than its weight.
func weight(st *state, key string) int {
	sh := st.p.ShapeAt(st.p.Overrides.Resolve(key))
	if sh.Bands != nil {
		return 5 * sh.Len()
	}
	r := sh.Primary.Rate()
	if sh.Primary.Capacity > 1<<52 || r.Tokens >= (1<<52)/int64(r.Per) {
		return 8
	}
	return 1
}

// reply is a decide script's answer.
type reply struct {
	status  string
	done    int
	deleted int
	behind  string // "chain": the bucket's version; "stale": the shard's
	results []any  // modes "a", "A", "p", "r": three per done bucket
}

func parseReply(raw []any) (reply, error) {
	var r reply
	ok := len(raw) > 0
	if ok {
		r.status, ok = raw[0].(string)
	}
	switch {
	case ok && (r.status == "stale" || r.status == "nopolicy" || r.status == "keymap"):
		if len(raw) > 1 {
			r.behind, _ = raw[1].(string) // the shard's version
		}
		return r, nil
	case ok && len(raw) >= 4:
		done, ok1 := raw[2].(int64)
		deleted, ok2 := raw[3].(int64)
		r.done, r.deleted, r.results = int(done), int(deleted), raw[4:]
		ok = ok1 && ok2 && done >= 0
		if r.status == "chain" {
			ok = ok && len(r.results) > 0
			if ok {
				r.behind, ok = r.results[0].(string)
				r.results = r.results[1:]
			}
		}
		ok = ok && (len(r.results) == 0 || len(r.results) == 3*r.done)
		for i := 0; ok && i < len(r.results); i += 3 {
			c, isCode := r.results[i].(int64)
			ok = isCode && c >= codeDenied && c <= codeOverCap
		}
	default:
		ok = false
	}
	if !ok {
		return r, fmt.Errorf("%w: malformed script reply %v", ErrUnavailable, raw)
	}
	return r, nil
}

// The decide script's result codes (integers: a string would cost the
// client an allocation per request).
const (
	codeDenied  = 0 // for a peek or refund: the bucket does not exist
	codeAllowed = 1 // for a peek or refund: the bucket exists
	codeOverCap = 2 // the cost is above a band's capacity
)

// noRetryCmd is a script call go-redis must not send again after a lost
// reply: the script may have run, and running it twice takes tokens twice
// (or answers "stale" to the cutover that was just published).
type noRetryCmd struct{ *redis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }

// processor is where a script call goes: a pipeline, which queues it, or
// a client, which sends it at once.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}
