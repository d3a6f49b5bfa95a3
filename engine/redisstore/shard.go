package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/tokenshard/tokenshard/policy"
)

// Virtual shards.
const (
	// DefaultVirtualShards is the number of virtual shards when
	// Config.VirtualShards is 0: enough to spread a prefix evenly over the
	// masters of a small cluster.
	DefaultVirtualShards = 16
	// MaxVirtualShards bounds Config.VirtualShards.
	MaxVirtualShards = 1024
)

// ErrCrossShard is AllowAll's error on Redis Cluster when its keys are not
// all in one virtual shard: one script call must decide every key, and a
// script runs on one hash slot. Put related keys in one shard with a hash
// tag: keys whose first "{...}" holds the same non-empty text share a
// shard. On one server (not a cluster) AllowAll takes keys of any shards.
var ErrCrossShard = errors.New("redisstore: AllowAll keys in more than one virtual shard on Redis Cluster (co-locate them with a {tag})")

// slots is Redis Cluster's number of hash slots.
const slots = 16384

// shardKeys are one virtual shard's keys: its copy of the version in force
// (a hash, field v), its history list, its pending flag, and the start of
// its buckets' keys.
type shardKeys struct {
	policy, history, pending, bucket string
	tag                              string // between the braces
}

// hashTag is the part of key Redis Cluster hashes: the text between the
// first "{" and the first "}" after it, if that is not empty; else key.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						return key[i+1 : j]
					}
					return key
				}
			}
			return key
		}
	}
	return key
}

// shardOf is key's virtual shard among n: FNV-1a of its hash tag (the whole
// key if it has none) modulo n. It is a fixed function, with no seed, so
// every process maps a key to the same shard.
func shardOf(key string, n int) int {
	t := hashTag(key)
	h := uint32(2166136261)
	for i := 0; i < len(t); i++ {
		h ^= uint32(t[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// crc16 is Redis Cluster's key hash (CRC-16/XMODEM); a key's slot is its
// hash tag's crc16 modulo 16384.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

var tagCache sync.Map // int -> []string

// evenTags is the most virtual shards whose tags are placed (shardTags);
// more spread evenly enough by hashing alone.
const evenTags = 64

// shardTags returns the hash tags of n virtual shards. For n up to
// evenTags, shard i's tag is the first "i-j" (j = 0, 1, ...) whose slot lies
// in a window around the middle of the i-th of n equal ranges of the slots:
// a cluster created with redis-cli gives each master an equal run of
// slots, so the shards spread evenly over the masters. Above, shard i's tag
// is "i": that many slots hashed at random spread evenly enough. Every
// process computes the same tags.
func shardTags(n int) []string {
	if v, ok := tagCache.Load(n); ok {
		return v.([]string)
	}
	tags := make([]string, n)
	if n > evenTags {
		for i := range n {
			tags[i] = strconv.Itoa(i)
		}
		tagCache.Store(n, tags)
		return tags
	}
	w := slots / n / 4
	for i := range n {
		lo := (2*i+1)*slots/(2*n) - w/2
		for j := 0; ; j++ {
			t := strconv.Itoa(i) + "-" + strconv.Itoa(j)
			if sl := int(crc16(t) % slots); sl >= lo && sl < lo+w {
				tags[i] = t
				break
			}
		}
	}
	tagCache.Store(n, tags)
	return tags
}

// globalTag is the hash tag of a prefix's global keys (policy, history,
// blobs, lock): "g" and FNV-1a of the prefix in hex, so that the global keys
// of different prefixes spread over the slots.
func globalTag(prefix string) string {
	h := uint32(2166136261)
	for i := 0; i < len(prefix); i++ {
		h ^= uint32(prefix[i])
		h *= 16777619
	}
	return "g" + strconv.FormatUint(uint64(h), 16)
}

// globals sets the names of the prefix's global keys.
func (s *Store) globals() {
	g := s.prefix + "{" + globalTag(s.prefix) + "}"
	s.kPolicy, s.kHistory, s.kBlobs, s.kLock = g+"policy", g+"history", g+"blobs", g+"lock"
	s.kBucket = s.prefix + "{" // every bucket's key starts so; see bucketKeyOf
}

// layout sets the key names of n virtual shards.
func (s *Store) layout(n int) {
	tags := shardTags(n)
	s.shards = make([]shardKeys, n)
	s.shardByTag = make(map[string]int, n)
	for i, t := range tags {
		b := s.prefix + "{" + t + "}"
		s.shards[i] = shardKeys{policy: b + "p", history: b + "h", pending: b + "n", bucket: b + "k:", tag: t}
		s.shardByTag[t] = i
	}
}

// shard is key's virtual shard.
func (s *Store) shard(key string) int { return shardOf(key, len(s.shards)) }

// bucketKeyOf parses a bucket's Redis key (one SCAN returned) into the
// user's key, reporting false for a key that is not a bucket of this
// layout, or sits in a shard its key does not map to.
func (s *Store) bucketKeyOf(rk string) (string, bool) {
	if len(rk) < len(s.kBucket) || rk[:len(s.kBucket)] != s.kBucket {
		return "", false
	}
	rest := rk[len(s.kBucket):]
	for j := 0; j < len(rest); j++ {
		if rest[j] == '}' {
			i, ok := s.shardByTag[rest[:j]]
			if !ok || len(rest) < j+3 || rest[j+1:j+3] != "k:" {
				return "", false
			}
			key := rest[j+3:]
			return key, s.shard(key) == i
		}
	}
	return "", false
}

// finish completes a cluster cutover that intentSrc recorded (next is
// "version trim tail") while version old is still in force, or only
// publishes the shards left prepared if it is committed: it prepares every
// shard, commits, and publishes every shard. Every step is conditional and
// idempotent, so the process that started the cutover and any number of
// stores that meet it may run it at once. It reports whether it had
// anything to do.
func (s *Store) finish(ctx context.Context, old, next string) (bool, error) {
	f := strings.SplitN(next, " ", 3)
	if len(f) != 3 {
		return false, fmt.Errorf("%w: malformed cutover record %q", ErrUnavailable, next)
	}
	nv, trim, tl := f[0], f[1], f[2]
	all := make([]int, len(s.shards))
	for i := range all {
		all[i] = i
	}
	if old != nv {
		ov, err := strconv.ParseInt(old, 10, 64)
		if err != nil {
			return false, fmt.Errorf("%w: the stored policy version %q", ErrUnavailable, old)
		}
		if n, err := strconv.ParseInt(nv, 10, 64); err != nil || n <= ov {
			return false, nil // an older record: nothing to finish
		}
		op, err := s.policyAt(ctx, ov)
		if err != nil {
			return false, err
		}
		if err := s.shardStep(ctx, all, prepareSrc, func(k shardKeys) []string { return []string{k.policy, k.history} },
			old, nv, tail(op), s.nowArg()); err != nil {
			return false, err
		}
		res, err := s.rdb.Eval(ctx, commitSrc, []string{s.kPolicy, s.kHistory, s.kBlobs}, old, nv, s.nowArg()).StringSlice()
		if err != nil {
			return false, fmt.Errorf("%w: committing the cutover to version %s: %w", ErrUnavailable, nv, err)
		}
		if len(res) == 0 || res[0] != "ok" {
			return true, nil // another finisher, or another cutover, got there: read again
		}
	}
	return true, s.shardStep(ctx, all, publishSrc, func(k shardKeys) []string { return []string{k.policy, k.history, k.pending} },
		nv, tl, trim, s.nowArg())
}

// shardStep runs a cutover step on the shards in which, pipelined, and
// fails unless each answers "ok" (a shard already past the step answers
// "ok" too). A shard in another state means another cutover or finisher
// moved on: the caller reads the policy again.
func (s *Store) shardStep(ctx context.Context, which []int, src string, keys func(shardKeys) []string, args ...any) error {
	cmds, err := s.eachShard(ctx, which, src, keys, args...)
	if err != nil {
		return err
	}
	for j, c := range cmds {
		v, err := c.Text()
		if err != nil {
			return fmt.Errorf("%w: a cutover step on virtual shard %d: %w", ErrUnavailable, which[j], err)
		}
		if v != "ok" {
			return fmt.Errorf("%w: %w: virtual shard %d is at version %q", ErrUnavailable, errShardMoved, which[j], v)
		}
	}
	return nil
}

// errShardMoved: a shard was not in the state a cutover step expects.
var errShardMoved = errors.New("a virtual shard moved on")

// stateShard is the shard whose copy of the policy state a script call on
// shard i reads: its own on a cluster. On one server every shard's copy is
// written by the same scripts at once, so they are all alike, and every
// call reads shard 0's: a call may then hold keys of any shards (a batch
// is not split per shard, and AllowAll takes keys of any shards).
func (s *Store) stateShard(i int) int {
	if s.cluster == nil {
		return 0
	}
	return i
}

// route splits items into script calls: on a cluster, per virtual shard
// (one slot per call; go-redis pipelines each node's calls), each shard's
// items split by chunked; on one server by chunked alone.
func (s *Store) route(items []*item) [][]*item {
	if s.cluster == nil {
		return chunked(items)
	}
	first := items[0].shard
	same := true
	for _, it := range items[1:] {
		if it.shard != first {
			same = false
			break
		}
	}
	if same {
		return chunked(items)
	}
	by := make(map[int][]*item)
	var order []int
	for _, it := range items {
		if _, ok := by[it.shard]; !ok {
			order = append(order, it.shard)
		}
		by[it.shard] = append(by[it.shard], it)
	}
	var out [][]*item
	for _, sh := range order {
		out = append(out, chunked(by[sh])...)
	}
	return out
}

// repair finishes, or only publishes, the cutover a shard was met in the
// middle of (its version "p" and the next): the process that began it may
// have died, and the caller cannot wait for it.
func (s *Store) repair(ctx context.Context) error {
	vals, err := s.rdb.HMGet(ctx, s.kPolicy, "v", "next").Result()
	if err != nil {
		return fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, err)
	}
	v, _ := vals[0].(string)
	next, _ := vals[1].(string)
	if v == "" || next == "" {
		return nil // read again: reload tells
	}
	if _, err := s.finish(ctx, v, next); err != nil && !errors.Is(err, errShardMoved) {
		return err
	}
	return nil
}

// lag is a shard found behind the committed version: its index and version.
type lag struct {
	shard   int
	version string
}

// raise publishes the committed policy p to a shard still at an older
// version (publishSrc from that version rather than from prepared). Only a
// shard reinstalled from a version read just before a commit gets there;
// without this it would refuse every store that knows the commit.
func (s *Store) raise(ctx context.Context, l lag, p policy.Policy) error {
	err := s.shardStep(ctx, []int{l.shard}, publishSrc, func(k shardKeys) []string { return []string{k.policy, k.history, k.pending} },
		strconv.FormatInt(p.Version, 10), tail(p), "0", s.nowArg(), l.version)
	if errors.Is(err, errShardMoved) {
		return nil // someone else moved it: the next attempt tells
	}
	return err
}
