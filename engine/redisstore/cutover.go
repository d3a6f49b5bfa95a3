package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// minLockTTL is how long, at least, the cutover lock outlives a holder that
// stopped renewing it (a process that died mid-cutover). The lock is renewed
// after every exchange of a pass, so a store's lock lives three of its
// Timeouts if that is longer.
const minLockTTL = 10 * time.Second

// ReplacePolicy replaces the policy every store on the prefix uses, with
// the meaning of engine.Engine.ReplacePolicy: versioned, compare-and-set in
// Redis, and the engine's cutover rule applied to each bucket when it is
// next touched: refilled under the limit of the version it was last written
// under up to the cutover instant (or its server's TIME, if that reads
// earlier: the instant is another master's, or the clock stepped back),
// then each band carried over to the band of the same name (the primary to
// the primary), moved to the new unit rounding down if its period changes,
// and clamped to its new capacity; a band new in next starts full, and one
// next lacks is dropped.
//
// Cutovers are serialised by a lock in Redis, which a ReplacePolicy waits
// for as long as ctx allows while another store holds it; a lock no store
// set (a key with no expiry, or of another type) fails it at once with
// ErrUnavailable: delete the key. The store retains the last
// HistoryVersions policies, so a bucket several versions behind replays
// every cutover it missed; the cutover that would retain more first brings
// every bucket up to the version in force (a pass over the keyspace). So
// does a cutover while the retained versions with overrides hold
// chainBytes (16 MiB) of policy or more between them, as stored (about 60
// bytes an override), one of them older than the version in force: a
// bucket behind them makes every process that meets it read and decode
// each of them, and keep them in memory.
//
// A bucket expires at its time-to-full under its own limit. A cutover that
// could lengthen some bucket's time-to-full, from any balance, a debt
// included (it raises the capacity of a band it keeps, or lowers its rate
// relative to its capacity more than a debt's depth allows) would let
// such a bucket expire before it is full, so it first clears every bucket's
// expiry, publishes, then sets each bucket's expiry under the new policy
// before it returns: two passes over the keyspace. Other cutovers need
// none. Once published, the call
// finishes that pass whatever its context, however long the keyspace takes.
// If such a cutover ends before it publishes (its context, or Redis), the
// buckets it already cleared keep no expiry until they are next touched or
// EvictFull runs: memory, never tokens.
//
// If the publish's answer is lost and Redis cannot then be asked which
// version is in force, the outcome is unknown: the call returns an error
// wrapping ErrUnavailable, and Policy (or any later call) tells.
//
// Each virtual shard keeps its own copy of the version in force, and the
// publish is the package doc's four steps: record the cutover in the
// global keys (the compare-and-set, under the lock), prepare every shard
// (each then refuses every caller), commit in the global keys, publish
// every shard.
// Once recorded the cutover is made: if a later step fails, the call
// returns an error wrapping ErrUnavailable that says so, and the next store
// call that meets a prepared shard, or the next New or ReplacePolicy on the
// prefix, finishes it.
func (s *Store) ReplacePolicy(ctx context.Context, next policy.Policy, expectedVersion int64) error {
	if s.uninitialized() {
		return engine.ErrNotInitialized
	}
	if err := cmp.Or(next.Validate(), s.usable(ctx)); err != nil {
		return err
	}
	if s.lease != nil {
		s.lease.flush(ctx) // unspent tokens go back under the version they were taken under
	}
	if err := s.need(ctx); err != nil {
		return err
	}
	token, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer s.unlock(ctx, token)

	// A cutover left unfinished (by a process that died, or a master away
	// at one of its steps) is finished first, its expiry pass included:
	// intentSrc records no other until it is.
	if _, err := s.settle(ctx, token); err != nil {
		return fmt.Errorf("%w: an earlier cutover could not be finished: %w", ErrUnavailable, err)
	}
	if err := s.round(ctx, s.reload); err != nil {
		return err
	}
	cur := s.cur.Load().p
	if expectedVersion != cur.Version || next.Version <= cur.Version {
		return staleErr(expectedVersion, next.Version, cur.Version)
	}
	lengthens := !safeCutover(cur, next)
	if lengthens {
		if err := s.round(ctx, func(ctx context.Context) error { return s.setPending(ctx, token) }); err != nil {
			return err
		}
		if err := s.persistPass(ctx, token); err != nil {
			return err
		}
	}
	trim, err := roundGet(ctx, s, s.mustTrim)
	if err != nil {
		return err
	}
	if trim {
		if _, err := s.convertPass(ctx, "c", token); err != nil {
			return err
		}
	}

	if s.cluster != nil {
		// A cutover, once recorded, prepares every shard, and the prepared
		// ones refuse every call until all are: a master known to be down
		// would stop every shard, not only its own. So every master must
		// answer first (one that fails later, during the steps, leaves the
		// cutover to be finished when it is back).
		if err := s.round(ctx, func(ctx context.Context) error {
			return s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		}); err != nil {
			return err
		}
	}

	// The last moment to abort: once the publish is sent, the call completes
	// whatever its context, and if the answer is lost on the way, Redis is
	// asked what happened.
	if err := ctx.Err(); err != nil {
		return err
	}
	pctx := context.WithoutCancel(ctx)
	if err := s.publish(pctx, next, expectedVersion, token, trim, lengthens); err != nil {
		return err
	}
	s.remember(next)
	s.cur.Store(newState(next))

	if lengthens {
		// Published: from here the call completes, whatever its context
		// (engine.Engine.ReplacePolicy's rule). A bucket whose expiry this
		// pass does not set keeps none until it is next touched, which costs
		// memory, never correctness. Every shard is published, so this
		// holder's pending flags go first: else the pass and the calls
		// meanwhile would write buckets without expiry.
		err := s.release(pctx, token, false)
		if err == nil {
			_, err = s.convertPass(pctx, "c", token)
		}
		if err == nil {
			// ends the cutover; left recorded, the next ReplacePolicy
			// runs the pass again first
			err = s.done(pctx, strconv.FormatInt(next.Version, 10))
		}
		if err != nil {
			s.report(fmt.Errorf("redisstore: setting expiries after the cutover to version %d: %w", next.Version, err))
		}
	}
	return nil
}

// EvictFull deletes the buckets that are full at the instant it starts (the
// server's TIME), bringing the others up to date, and returns how many it
// deleted; a bucket that is not full is never deleted, however old. Redis's
// expiry already deletes each bucket once it is full, so a service need not
// call it; it is for tests and for reclaiming memory at once. It costs a pass
// over the keyspace. If ctx ends part-way, it returns the count so far with
// the context's error.
func (s *Store) EvictFull(ctx context.Context) (int, error) {
	if s.uninitialized() {
		return 0, engine.ErrNotInitialized
	}
	if err := s.usable(ctx); err != nil {
		return 0, err
	}
	if err := s.need(ctx); err != nil {
		return 0, err
	}
	return s.convertPass(ctx, "e", "")
}

// convertPass brings every bucket up to the policy in force at one instant
// and returns how many it deleted as full: mode "e" deletes them, mode "c"
// leaves them to expire (or, in tests, to EvictFull). With a token, it
// renews the cutover lock as it goes.
func (s *Store) convertPass(ctx context.Context, mode, token string) (int, error) {
	at := s.nowArg()
	if at == "" {
		t, err := roundGet(ctx, s, func(ctx context.Context) (time.Time, error) {
			return one(ctx, s, func(c redis.Cmdable) *redis.TimeCmd { return c.Time(ctx) }).Result()
		})
		if err != nil {
			return 0, err
		}
		at = strconv.FormatInt(t.UnixNano(), 10)
	}
	deleted := 0
	err := s.scan(ctx, func(keys []string) error {
		items := make([]item, len(keys))
		for i, k := range keys {
			items[i].key, _ = s.bucketKeyOf(k) // scan passes buckets only
		}
		return s.round(ctx, func(ctx context.Context) error {
			n, err := s.exec(ctx, mode, at, items)
			deleted += n
			if err == nil && token != "" {
				err = s.renew(ctx, token)
			}
			return err
		})
	})
	return deleted, err
}

// persistPass clears the expiry of every bucket, renewing the lock.
func (s *Store) persistPass(ctx context.Context, token string) error {
	return s.scan(ctx, func(keys []string) error {
		return s.round(ctx, func(ctx context.Context) error {
			if _, err := inPipeline(ctx, s, len(keys), func(pipe redis.Pipeliner, i int) *redis.BoolCmd { return pipe.Persist(ctx, keys[i]) }); err != nil {
				return err
			}
			return s.renew(ctx, token)
		})
	})
}

// round runs one exchange with Redis under the store's Timeout, and tells
// the context's end from Redis's failure.
func (s *Store) round(ctx context.Context, f func(ctx context.Context) error) error {
	bctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := f(bctx)
	s.nodeFailed(ctx, err) // a lost node: reload the slot map (nil is no failure)
	switch {
	case err == nil:
		return nil
	case ended(ctx) != nil:
		return ended(ctx)
	case errors.Is(err, ErrUnavailable): // errLostLock too
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// roundGet is round for an exchange f that returns a value.
func roundGet[T any](ctx context.Context, s *Store, f func(context.Context) (T, error)) (T, error) {
	var v T
	err := s.round(ctx, func(ctx context.Context) (err error) { v, err = f(ctx); return err })
	return v, err
}

// ended is ctx's error, or context.DeadlineExceeded once its deadline has
// passed: go-redis gives a connection the context's deadline, which may
// fire (an i/o timeout) before the context's own timer does.
func ended(ctx context.Context) error {
	if d, ok := ctx.Deadline(); ok && ctx.Err() == nil && clock.Until(d) <= 0 {
		return context.DeadlineExceeded
	}
	return ctx.Err()
}

var errLostLock = fmt.Errorf("%w: lost the cutover lock", ErrUnavailable)

// lock takes the prefix's cutover lock, waiting for another holder as long
// as ctx allows, and returns the token that proves it; a lock no store set
// is an error (see foreignLock).
func (s *Store) lock(ctx context.Context) (string, error) {
	token := newSeed() // 16 random bytes in hex, as a prefix's seed is
	wait := time.Millisecond
	for {
		var ok bool
		var foreign error
		if err := s.round(ctx, func(ctx context.Context) (err error) {
			ok, err = one(ctx, s, func(c redis.Cmdable) *redis.BoolCmd { return c.SetNX(ctx, s.kLock, token, s.lockTTL) }).Result()
			if err == nil && !ok {
				// go-redis sends a SET again after a lost reply: the
				// holder may be this very call.
				held, gerr := one(ctx, s, func(c redis.Cmdable) *redis.StringCmd { return c.Get(ctx, s.kLock) }).Result()
				if ok = gerr == nil && held == token; !ok {
					foreign = s.foreignLock(ctx, gerr)
				}
			}
			return err
		}); err != nil {
			// Its reply lost, the SET may have taken the lock: left held,
			// it would stop every cutover on the prefix for its TTL.
			s.unlock(ctx, token)
			return "", err
		}
		switch {
		case ok:
			return token, nil
		case foreign != nil:
			return "", foreign
		}
		if err := sleep(ctx, wait); err != nil {
			return "", err
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// foreignLock is an error if the cutover lock another token holds (GET
// answered gerr) is none a store sets: a key of another type, or one with
// no expiry (a store's always has one). Such a lock never goes away by
// itself, and every ReplacePolicy would wait on it as long as its context
// allows.
func (s *Store) foreignLock(ctx context.Context, gerr error) error {
	if redis.HasErrorPrefix(gerr, "WRONGTYPE") { // another reply (BUSY, LOADING, CLUSTERDOWN) tells of the server, not the key
		return fmt.Errorf("%w: the cutover lock %s is no store's (%w): delete it", ErrUnavailable, s.kLock, gerr)
	}
	if gerr != nil {
		return nil
	}
	if ttl, err := one(ctx, s, func(c redis.Cmdable) *redis.DurationCmd { return c.PTTL(ctx, s.kLock) }).Result(); err == nil && ttl == -1 {
		return fmt.Errorf("%w: the cutover lock %s has no expiry, so no store set it: delete it", ErrUnavailable, s.kLock)
	}
	return nil
}

// renew extends the cutover lock, then this holder's pending flags, in one
// round trip; errLostLock if another process holds the lock.
func (s *Store) renew(ctx context.Context, token string) error {
	ttl := s.lockTTL.Milliseconds()
	pipe := s.rdb.Pipeline()
	lock := pipe.Eval(ctx, refreshSrc, []string{s.kLock}, token, ttl, "1")
	for _, k := range s.shards {
		pipe.Eval(ctx, refreshSrc, []string{k.pending}, token, ttl, "0")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if ok, err := lock.Int(); err != nil || ok != 1 {
		return cmp.Or(err, errLostLock)
	}
	return nil
}

// setPending sets this holder's pending flag in every virtual shard, if it
// still holds the lock, so that the decide script writes buckets without
// expiry until the cutover is published: on one server with the lock
// checked in the same script; on a cluster the lock is checked first, then
// the flags are set (another slot): a holder whose lock expired in between
// adds its own token, which costs memory (buckets written without expiry
// until it expires), never tokens, and cannot remove the next holder's.
func (s *Store) setPending(ctx context.Context, token string) error {
	ttl := s.lockTTL.Milliseconds()
	if s.cluster == nil {
		keys := []string{s.kLock}
		for _, k := range s.shards {
			keys = append(keys, k.pending)
		}
		if ok, err := one(ctx, s, func(c redis.Cmdable) *redis.Cmd { return c.Eval(ctx, pendingSrc, keys, token, ttl, "1") }).Int(); err != nil || ok != 1 {
			return cmp.Or(err, errLostLock) // another process may be preparing its own cutover
		}
		return nil
	}
	if err := s.renew(ctx, token); err != nil {
		return err
	}
	_, err := s.eachShard(ctx, s.allShards(), pendingSrc, func(k shardKeys) []string { return []string{k.pending} }, token, ttl, "0")
	return err
}

// unlock releases the lock and the pending flags, even if ctx has ended.
func (s *Store) unlock(ctx context.Context, token string) {
	err := s.release(context.WithoutCancel(ctx), token, true)
	if err != nil && !errors.Is(err, redis.Nil) {
		s.report(fmt.Errorf("redisstore: releasing the cutover lock (it expires in %v): %w", s.lockTTL, err))
	}
}

// release drops this holder's pending flags and, with lock, the lock.
func (s *Store) release(ctx context.Context, token string, lock bool) error {
	return s.round(ctx, func(ctx context.Context) error {
		pipe := s.rdb.Pipeline()
		for _, k := range s.shards {
			pipe.Eval(ctx, releaseSrc, []string{k.pending}, token, "0")
		}
		if lock {
			pipe.Eval(ctx, releaseSrc, []string{s.kLock}, token, "1")
		}
		_, err := pipe.Exec(ctx)
		return err
	})
}

// staleErr is ReplacePolicy's ErrStalePolicy, saying the versions as the
// engine's does, so a caller can tell which it should retry with.
func staleErr(expected, next, inForce int64) error {
	return fmt.Errorf("%w: expected version %d, next version %d, version in force %d",
		engine.ErrStalePolicy, expected, next, inForce)
}

func (s *Store) allShards() []int {
	all := make([]int, len(s.shards))
	for i := range all {
		all[i] = i
	}
	return all
}

// publish makes next the policy in force, expectedVersion permitting, once
// the caller holds the lock and every pass before it is done; ctx has no
// cancellation. It is the two-phase cutover (see ReplacePolicy).
func (s *Store) publish(ctx context.Context, next policy.Policy, expectedVersion int64, token string, trim, lengthens bool) error {
	nv := strconv.FormatInt(next.Version, 10)
	// Intent: idempotent (it writes nothing a second run would not), so
	// go-redis may retry it.
	res, err := roundGet(ctx, s, func(ctx context.Context) ([]any, error) {
		return one(ctx, s, func(c redis.Cmdable) *redis.Cmd {
			return c.Eval(ctx, intentSrc, []string{s.kPolicy, s.kBlobs, s.kLock},
				expectedVersion, nv, tail(next), encodePolicy(next), token, flag(trim), flag(lengthens))
		}).Slice()
	})
	if err != nil {
		// unknown, or not published: the caller may retry with the same expectedVersion
		if v, nx, rerr := s.policyRecord(ctx); rerr != nil || (v != nv && !strings.HasPrefix(nx, nv+" ")) {
			return err
		}
		res = []any{"ok"}
	}
	status, _ := res[0].(string)
	switch status {
	case "ok":
	case "stale":
		v, _ := res[len(res)-1].(string) // {"stale", version in force}
		inForce, _ := strconv.ParseInt(v, 10, 64)
		return staleErr(expectedVersion, next.Version, inForce)
	case "lock":
		return fmt.Errorf("%w: the cutover lock expired before the cutover was published; nothing changed", ErrUnavailable)
	case "busy":
		return fmt.Errorf("%w: an earlier cutover (%v) is not finished; nothing changed", ErrUnavailable, res[1:])
	default:
		return fmt.Errorf("%w: the policy vanished from Redis during the cutover (%v)", ErrUnavailable, res)
	}
	// Recorded: from here the cutover is made, by this call (settle) or,
	// if it fails part-way, by the next store that meets it. A lengthening
	// cutover's record stays until its expiry pass (ReplacePolicy).
	s.remember(next)
	unfinished := fmt.Errorf("%w: the cutover to version %d is recorded but not finished; the next store to meet it finishes it", ErrUnavailable, next.Version)
	if _, err := s.settle(ctx, ""); err != nil {
		return fmt.Errorf("%w: %w", unfinished, err)
	}
	if v, _, err := s.policyRecord(ctx); err != nil || v != nv {
		return unfinished
	}
	return nil
}

// chainBytes bounds the policies, as stored, of the retained versions
// with overrides (see ReplacePolicy); a variable for tests.
var chainBytes int64 = 16 << 20

// mustTrim reports whether the cutover must first bring every bucket up to
// the version in force, so that the history can be trimmed: it holds
// HistoryVersions versions, or its versions with overrides hold chainBytes
// of stored policy or more between them, one of them older than the
// version in force (the trim keeps that one, so without another it drops
// nothing a bucket behind would read).
func (s *Store) mustTrim(ctx context.Context) (bool, error) {
	vs, overridden, err := s.history(ctx)
	switch {
	case err != nil:
		return false, err
	case len(vs) >= HistoryVersions:
		return true, nil
	case !slices.Contains(overridden[:max(len(overridden)-1, 0)], true):
		return false, nil
	}
	var fields []string
	for i, v := range vs {
		if overridden[i] {
			fields = append(fields, strconv.FormatInt(v, 10))
		}
	}
	cmds, err := inPipeline(ctx, s, len(fields), func(pipe redis.Pipeliner, i int) *redis.IntCmd { return pipe.HStrLen(ctx, s.kBlobs, fields[i]) })
	if err != nil {
		return false, fmt.Errorf("%w: reading the retained policies' sizes: %w", ErrUnavailable, err)
	}
	n := int64(0)
	for _, c := range cmds {
		n += c.Val()
	}
	return n >= chainBytes, nil
}

// safeCutover reports whether no bucket can take longer to fill under next
// than under cur, whatever its balance at the cutover, so that expiries set
// under cur stay at or after each bucket's time-to-full. A bucket is full
// when every band is, so its time-to-full is its bands' longest. A band new
// in next starts full and one next drops no longer counts, so only the
// bands next carries over can lengthen it. For a band moving from a to b (a
// rate of N per P ns, so a capacity of C takes C*P/N ns to fill from empty)
// that holds x tokens after the clamp (-Cb <= x <= Cb: a debt reaches
// down to minus the capacity), the time-to-full goes from (Ca-x)*Pa/Na to
// (Cb-x)*Pb/Nb; both are linear in x, so the second is at most the first
// for every x exactly when it is at both ends: Cb <= Ca at x = Cb, and
// 2*Cb*Pb*Na <= (Ca+Cb)*Pa*Nb at x = -Cb. A deeper debt raised to -Cb by
// the clamp only had longer to go. A change of period also rounds the
// balance down by less than one unit, less than 1 ns of refill, which the
// expiry's margin of a millisecond covers. Each pair of shapes a key may
// move between is checked: a key an exact override of either policy names,
// from its shape under cur to its shape under next; any other key, from
// cur's default or pattern to next's default or the pattern at the same
// place if both have the same patterns in the same order, else to any.
// (Checking every pair of shapes made a policy with an override below its
// default lengthen at every cutover, and pass over the keyspace, whatever
// changed.)
func safeCutover(cur, next policy.Policy) bool {
	ao, bo := cur.Overrides.Overrides(), next.Overrides.Overrides()
	as, am := loose(cur, ao)
	bs, bm := loose(next, bo)
	for i, a := range as {
		for j, b := range bs {
			if (i == j || !slices.Equal(am, bm)) && !noSlower(a, b) {
				return false
			}
		}
	}
	seen := map[[2]policy.LimitIndex]bool{}
	for _, os := range [][]policy.Override{ao, bo} {
		for _, o := range os {
			if strings.Contains(o.Match, "*") {
				continue // a pattern: among loose's
			}
			k := [2]policy.LimitIndex{cur.Overrides.Resolve(o.Match), next.Overrides.Resolve(o.Match)}
			if !seen[k] {
				seen[k] = true
				if !noSlower(cur.ShapeAt(k[0]), next.ShapeAt(k[1])) {
					return false
				}
			}
		}
	}
	return true
}

// loose is the shapes p, whose overrides are os, may give a key no exact
// override names, its default and then its patterns', and the patterns, in
// order.
func loose(p policy.Policy, os []policy.Override) (shs []policy.Shape, patterns []string) {
	shs = []policy.Shape{p.Shape()}
	for _, o := range os {
		if strings.Contains(o.Match, "*") {
			lim := policy.Limit{Capacity: o.Capacity, TokensPerSecond: o.TokensPerSecond, Refill: o.Refill}
			shs, patterns = append(shs, policy.Shape{Name: o.Name, Primary: lim, Bands: o.Bands}), append(patterns, o.Match)
		}
	}
	return shs, patterns
}

// noSlower reports whether no band of a that b keeps fills slower under b.
func noSlower(a, b policy.Shape) bool {
	for i := range b.Len() {
		j := 0
		if i > 0 {
			if j = a.Bands.Index(b.BandName(i)) + 1; j == 0 {
				continue // new: starts full
			}
		}
		if !fillsNoSlower(a.Band(j), b.Band(i)) {
			return false
		}
	}
	return true
}

// fillsNoSlower reports whether band b takes at most as long to fill as
// band a from every balance b can hold, a debt included: Cb <= Ca and
// 2*Cb*Pb*Na <= (Ca+Cb)*Pa*Nb.
func fillsNoSlower(a, b policy.Limit) bool {
	if b.Capacity > a.Capacity {
		return false
	}
	ra, rb := a.Rate(), b.Rate()
	ca, cb := big.NewInt(a.Capacity), big.NewInt(b.Capacity)
	lhs := new(big.Int).Lsh(cb, 1) // 2*Cb*Pb*Na
	lhs.Mul(lhs, new(big.Int).SetUint64(uint64(rb.Per)))
	lhs.Mul(lhs, big.NewInt(ra.Tokens))
	rhs := new(big.Int).Add(ca, cb) // (Ca+Cb)*Pa*Nb
	rhs.Mul(rhs, new(big.Int).SetUint64(uint64(ra.Per)))
	rhs.Mul(rhs, big.NewInt(rb.Tokens))
	return lhs.Cmp(rhs) <= 0
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
