package redisstore

import (
	"context"
	"encoding/binary"
	"math"
	"math/big"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/policy"
)

// IsDecideCall reports whether cmd calls the decide script (FCALL of its
// function, or EVALSHA of its script).
func IsDecideCall(cmd redis.Cmder) bool {
	a := cmd.Args()
	if len(a) < 2 {
		return false
	}
	name, _ := a[1].(string)
	switch cmd.Name() {
	case "fcall":
		return name == decideFunc
	case "evalsha":
		return name == decideScript.Hash()
	}
	return false
}

// PolicyBlob is p as the store keeps it in Redis.
func PolicyBlob(p policy.Policy) string {
	return encodePolicy(p)
}

// Key names, for tests that read or write Redis directly.

// opens holds the last store New returned on each prefix: a bucket's key
// depends on its prefix's key map, which New reads from Redis.
var opens sync.Map // prefix -> *Store

func init() { opened = func(s *Store) { opens.Store(s.prefix, s) } }

// opener is the last store New returned on prefix, brought up (see Up); it
// panics if there is none, since no key map is known then.
func opener(prefix string) *Store {
	s, ok := opens.Load(prefix)
	if !ok {
		panic("redisstore test: no store was opened on prefix " + strconv.Quote(prefix) + ", so its key map is not known")
	}
	_ = Up(s.(*Store))
	return s.(*Store)
}

// SetChainBytes sets the bound on the retained policies with overrides
// (see ReplacePolicy) until restore.
func SetChainBytes(n int64) (restore func()) {
	old := chainBytes
	chainBytes = n
	return func() { chainBytes = old }
}

// Up makes s reach Redis if it has not yet, trying again for up to 30 s,
// and returns the last attempt's error if none succeeded. New gives up on
// Redis after Config.Timeout and leaves the store to start on a later call,
// as it is meant to; on a loaded machine that happens to stores the tests
// then read the adopted key map or policy of.
func Up(s *Store) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := s.need(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		runtime.Gosched() // another caller's attempt may be under way
	}
}

// BucketKey is the Redis key of key's bucket under prefix, on which a store
// must have been opened.
func BucketKey(prefix, key string) string {
	s := opener(prefix)
	return s.shards[s.shard(key)].bucket + key
}

// GlobalKey is the Redis key of a prefix's global "policy", "history",
// "blobs" or "lock".
func GlobalKey(prefix, name string) string {
	return prefix + "{" + globalTag(prefix) + "}" + name
}

// ShardStateKeys are each virtual shard's policy hash, history list and
// pending flag, in shard order, for DefaultVirtualShards shards.
func ShardStateKeys(prefix string) (policies, histories, pendings []string) {
	s := &Store{prefix: prefix}
	s.globals()
	s.layout(DefaultVirtualShards)
	for _, k := range s.shards {
		policies = append(policies, k.policy)
		histories = append(histories, k.history)
		pendings = append(pendings, k.pending)
	}
	return policies, histories, pendings
}

// ShardOf is key's virtual shard under prefix, on which a store must have
// been opened.
func ShardOf(prefix, key string) int { return opener(prefix).shard(key) }

// ShardOfStore is key's virtual shard in s.
func ShardOfStore(s *Store, key string) int { return s.shard(key) }

// Seed is the seed of s's key map, in hex as Redis stores it.
func Seed(s *Store) string { return s.kmap.Load().seed }

// DecimalBucket is decimalBucket, for the tests that read buckets: the
// decimal format of any bucket.
var DecimalBucket = decimalBucket

// Points of the combiner and of a lease's give-back and flush where a hook
// set by SetCombineHook runs.
const (
	HookAlone      = hookAlone
	HookTaken      = hookTaken
	HookSent       = hookSent
	HookGiveBack   = hookGiveBack
	HookFlushWaits = hookFlushWaits
)

// LeasesClosed reports whether every lease shard of s has closed its
// queue (Close has reached them).
func LeasesClosed(s *Store) bool {
	for _, q := range s.lease.shards {
		if q.head.Load() != closedLeases {
			return false
		}
	}
	return true
}

// SetCombineHook makes s run hook(point) at the combiner's points and a
// lease's give-back's and flush's, from the caller's goroutine. Set it
// before s is used concurrently.
func SetCombineHook(s *Store, hook func(point string)) { s.hook = hook }

// Queued is how many single Allows for key wait in its combiner, and how
// many of its calls are in flight.
func Queued(s *Store, key string) (queued, inFlight int) {
	c := s.queueFor(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue), c.inFlight
}

// PublishScript is the text of a cluster cutover's publish step, for tests
// that make one shard's publish fail.
var PublishScript = publishSrc

// PrepareScript is the text of a cluster cutover's prepare step.
var PrepareScript = prepareSrc

// FlagScript is the text of the step that sets a lengthening cutover's own
// pending token in each shard.
var FlagScript = flagSrc

// LockTTL is how long s's cutover lock, and a holder's pending flags,
// outlive a holder that stopped renewing them.
func LockTTL(s *Store) time.Duration { return s.lockTTL }

// compactMark starts a compact bucket (see decide.lua): then T, F and the
// last update's seconds as three little-endian doubles, its ns and the
// expiry given (ms after the update's ms; 0 if none is recorded) as two
// little-endian uint32s, then "version cap rate".
const compactMark = 2

// compactFields are a compact bucket's T, F, seconds and ns, its expiry
// (ms; 0 if not recorded) and its tag, and whether raw is compact.
func compactFields(raw string) (f [4]float64, expiry int64, tag string, ok bool) {
	if len(raw) < 33 || raw[0] != compactMark {
		return f, 0, "", false
	}
	d := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(raw[i : i+8]))) }
	u := func(i int) int64 { return int64(binary.LittleEndian.Uint32([]byte(raw[i : i+4]))) }
	f = [4]float64{d(1), d(9), d(17), float64(u(25))}
	if x := u(29); x > 0 {
		expiry = int64(f[2])*1000 + int64(f[3])/1e6 + x
	}
	return f, expiry, raw[33:], true
}

// CompactExpiry is the expiry (ms) a compact bucket records, and whether it
// records one.
func CompactExpiry(raw string) (int64, bool) {
	_, x, _, ok := compactFields(raw)
	return x, ok && x > 0
}

// decimalBucket returns a bucket's value in the decimal format, "units last
// version cap rate" (a compact bucket's units are T*P + F, P from its own
// rate), or raw itself if it is not compact (or is malformed).
func decimalBucket(raw string) string {
	f, _, tag, ok := compactFields(raw)
	if !ok {
		return raw
	}
	fields := strings.Fields(tag)
	if len(fields) != 3 {
		return raw
	}
	p := int64(time.Second)
	if _, ps, ok := strings.Cut(fields[2], "/"); ok {
		v, err := strconv.ParseInt(ps, 10, 64)
		if err != nil {
			return raw
		}
		p = v
	}
	units := new(big.Int).Mul(big.NewInt(int64(f[0])), big.NewInt(p))
	units.Add(units, big.NewInt(int64(f[1])))
	last := new(big.Int).Mul(big.NewInt(int64(f[2])), big.NewInt(1e9))
	last.Add(last, big.NewInt(int64(f[3])))
	return units.String() + " " + last.String() + " " + tag
}

// FillsNoSlower is fillsNoSlower: whether a cutover from band a to band b
// may keep every bucket's expiry.
var FillsNoSlower = fillsNoSlower

// Sleep waits d, or until ctx ends, and then returns ctx's error: a slow
// server, for the tests' hooks.
func Sleep(ctx context.Context, d time.Duration) error { return sleep(ctx, d) }

// LeaseKeys reports, once s is closed (its lease shards have ended), how
// many keys its lease shards still keep an entry for.
func LeaseKeys(s *Store) int {
	n := 0
	for _, q := range s.lease.shards {
		n += len(q.keys)
	}
	return n
}

// LeaseDebts reports, once s is closed (its lease shards and fetchers have
// ended), what they still count: posts owed, posts left unread, and over
// every key the tokens held, out at Redis and on their way back.
func LeaseDebts(s *Store) (pending, unread int, left, out, back int64) {
	for _, q := range s.lease.shards {
		pending += q.pending
		unread += len(q.posts)
		for _, k := range q.keys {
			left, out, back = left+k.left, out+k.out, back+k.back
		}
	}
	return pending, unread, left, out, back
}

// LeaseFetching reports how many jobs s's lease shards have sent their
// fetchers (top-ups asked for, leases given back) whose posts the fetchers
// have not yet sent: 0 once every one has landed in a shard's queue, which
// the shard takes in before it serves its next request.
func LeaseFetching(s *Store) int64 {
	var n int64
	for _, q := range s.lease.shards {
		n += q.fetching.Load()
	}
	return n
}
