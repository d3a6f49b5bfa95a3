package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

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
// under up to the cutover instant, then each band carried over to the band
// of the same name (the primary to the primary), moved to the new unit
// rounding down if its period changes, and clamped to its new capacity; a
// band new in next starts full, and one next lacks is dropped.
//
// Cutovers are serialised by a lock in Redis. The store retains the last
// HistoryVersions policies, so a bucket several versions behind replays
// every cutover it missed; the cutover that would retain more first brings
// every bucket up to the version in force (a pass over the keyspace).
//
// A bucket expires at its time-to-full under its own limit. A cutover that
// could lengthen some bucket's time-to-full (it raises the capacity of a
// band it keeps, or lowers its rate relative to its capacity) would let
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
func (s *Store) ReplacePolicy(ctx context.Context, next policy.Policy, expectedVersion int64) error {
	if err := next.Validate(); err != nil {
		return err
	}
	if s.closed.Load() {
		return engine.ErrClosed
	}
	if ctx == nil {
		return engine.ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	blob, err := encodePolicy(next)
	if err != nil {
		return err
	}
	token, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer s.unlock(ctx, token)

	if err := s.round(ctx, s.reload); err != nil {
		return err
	}
	cur := s.cur.Load().p
	if expectedVersion != cur.Version || next.Version <= cur.Version {
		return engine.ErrStalePolicy
	}
	var retained int64
	if err := s.round(ctx, func(ctx context.Context) (err error) {
		retained, err = s.rdb.LLen(ctx, s.kHistory).Result()
		return err
	}); err != nil {
		return err
	}
	lengthens := !safeCutover(cur, next)
	if lengthens {
		if err := s.round(ctx, func(ctx context.Context) error {
			ok, err := pendingScript.Run(ctx, s.rdb, []string{s.kLock, s.kPending}, token, s.lockTTL.Milliseconds()).Int()
			if err == nil && ok != 1 {
				return errLostLock // another process may be preparing its own cutover
			}
			return err
		}); err != nil {
			return err
		}
		if err := s.persistPass(ctx, token); err != nil {
			return err
		}
	}
	trim := retained >= HistoryVersions
	if trim {
		if _, err := s.convertPass(ctx, "c", token); err != nil {
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
	a := encodeShape(next.Shape())
	var res []any
	err = s.round(pctx, func(ctx context.Context) (err error) {
		keys := []string{s.kPolicy, s.kHistory, s.kBlobs, s.kLock, s.kPending}
		args := []any{expectedVersion, next.Version, next.Capacity, a.rate, overridden(next), blob, s.nowArg(), token, flag(trim), a.bands}
		for range 2 { // once more after NOSCRIPT
			pipe := s.rdb.Pipeline()
			cmd := evalShaOnce(ctx, pipe, replaceScript, keys, args...)
			_, _ = pipe.Exec(ctx)
			if res, err = cmd.Slice(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
				return err
			}
			if err := replaceScript.Load(ctx, s.rdb).Err(); err != nil {
				return err
			}
		}
		return err
	})
	if err != nil {
		var v string
		if s.round(pctx, func(ctx context.Context) (err error) {
			v, err = s.rdb.HGet(ctx, s.kPolicy, "v").Result()
			return err
		}) != nil || v != strconv.FormatInt(next.Version, 10) {
			return err // not published, or unknown: the caller may retry with the same expectedVersion
		}
		res = []any{"ok"}
	}
	status, _ := res[0].(string)
	switch status {
	case "ok":
	case "stale":
		return engine.ErrStalePolicy
	case "lock":
		return fmt.Errorf("%w: the cutover lock expired before the cutover was published; nothing changed", ErrUnavailable)
	default:
		return fmt.Errorf("%w: the policy vanished from Redis during the cutover (%v)", ErrUnavailable, res)
	}
	s.mu.Lock()
	s.past[next.Version] = next
	s.mu.Unlock()
	s.adopt(next)

	if lengthens {
		// Published: from here the call completes, whatever its context
		// (engine.Engine.ReplacePolicy's rule). A bucket whose expiry this
		// pass does not set keeps none until it is next touched, which costs
		// memory, never correctness.
		if _, err := s.convertPass(pctx, "c", token); err != nil && s.onError != nil {
			s.onError(fmt.Errorf("redisstore: setting expiries after the cutover to version %d: %w", next.Version, err))
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
	if s.closed.Load() {
		return 0, engine.ErrClosed
	}
	if ctx == nil {
		return 0, engine.ErrNilContext
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return s.convertPass(ctx, "e", "")
}

// convertPass brings every bucket up to the policy in force at one instant
// and returns how many it deleted as full: mode "e" deletes them, mode "c"
// leaves them to expire (or, in tests, to EvictFull). With a token, it
// renews the cutover lock as it goes.
func (s *Store) convertPass(ctx context.Context, mode, token string) (int, error) {
	var at string
	if s.now != nil {
		at = strconv.FormatInt(s.now(), 10)
	} else {
		var t time.Time
		if err := s.round(ctx, func(ctx context.Context) (err error) {
			t, err = s.rdb.Time(ctx).Result()
			return err
		}); err != nil {
			return 0, err
		}
		at = strconv.FormatInt(t.UnixNano(), 10)
	}
	deleted := 0
	err := s.scan(ctx, func(keys []string) error {
		items := make([]item, len(keys))
		for i, k := range keys {
			items[i] = item{key: strings.TrimPrefix(k, s.kBucket)}
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
			pipe := s.rdb.Pipeline()
			for _, k := range keys {
				pipe.Persist(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
			return s.renew(ctx, token)
		})
	})
}

// round runs one exchange with Redis under the store's Timeout, and tells
// the context's end from Redis's failure.
func (s *Store) round(ctx context.Context, f func(ctx context.Context) error) error {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	err := f(bctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, ErrUnavailable), errors.Is(err, errLostLock):
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

var errLostLock = fmt.Errorf("%w: lost the cutover lock", ErrUnavailable)

// lock takes the prefix's cutover lock, waiting for another holder as long
// as ctx allows, and returns the token that proves it.
func (s *Store) lock(ctx context.Context) (string, error) {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	wait := time.Millisecond
	for {
		var ok bool
		if err := s.round(ctx, func(ctx context.Context) (err error) {
			ok, err = s.rdb.SetNX(ctx, s.kLock, token, s.lockTTL).Result()
			return err
		}); err != nil {
			return "", err
		}
		if ok {
			return token, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func (s *Store) renew(ctx context.Context, token string) error {
	ok, err := refreshScript.Run(ctx, s.rdb, []string{s.kLock, s.kPending}, token, s.lockTTL.Milliseconds()).Int()
	if err == nil && ok != 1 {
		return errLostLock
	}
	return err
}

// unlock releases the lock and the pending flag, even if ctx has ended.
func (s *Store) unlock(ctx context.Context, token string) {
	err := s.round(context.WithoutCancel(ctx), func(ctx context.Context) error {
		return releaseScript.Run(ctx, s.rdb, []string{s.kLock, s.kPending}, token).Err()
	})
	if err != nil && !errors.Is(err, redis.Nil) && s.onError != nil {
		s.onError(fmt.Errorf("redisstore: releasing the cutover lock (it expires in %v): %w", s.lockTTL, err))
	}
}

// safeCutover reports whether no bucket can take longer to fill under next
// than under cur, whatever its balance at the cutover, so that expiries set
// under cur stay at or after each bucket's time-to-full. A bucket is full
// when every band is, so its time-to-full is its bands' longest. A band new
// in next starts full and one next drops no longer counts, so only the
// bands next carries over can lengthen it. For a band moving from a to b (a
// rate of N per P ns, so a capacity of C takes C*P/N ns to fill from empty)
// that holds x tokens after the clamp (0 <= x <= b's C), the time-to-full
// goes from (Ca-x)*Pa/Na to (Cb-x)*Pb/Nb; both are linear in x, so the
// second is at most the first for every x exactly when it is at both ends:
// Cb <= Ca and Cb*Pb*Na <= Ca*Pa*Nb. A change of period also rounds the
// balance down by less than one unit, less than 1 ns of refill, which the
// expiry's margin of a millisecond covers. Every pair of shapes is
// checked, since a key may move from any of cur's to any of next's.
func safeCutover(cur, next policy.Policy) bool {
	as, bs := cur.Shapes(), next.Shapes()
	if len(as)*len(bs) > 1<<20 {
		return false
	}
	for _, a := range as {
		for _, b := range bs {
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
		}
	}
	return true
}

// fillsNoSlower reports whether band b takes at most as long to fill as
// band a from every balance b can hold: Cb <= Ca and Cb*Pb*Na <= Ca*Pa*Nb.
func fillsNoSlower(a, b policy.Limit) bool {
	if b.Capacity > a.Capacity {
		return false
	}
	ra, rb := a.Rate(), b.Rate()
	lhs := new(big.Int).Mul(big.NewInt(b.Capacity), big.NewInt(int64(rb.Per)))
	lhs.Mul(lhs, big.NewInt(ra.Tokens))
	rhs := new(big.Int).Mul(big.NewInt(a.Capacity), big.NewInt(int64(ra.Per)))
	rhs.Mul(rhs, big.NewInt(rb.Tokens))
	return lhs.Cmp(rhs) <= 0
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
