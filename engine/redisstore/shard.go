package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"unsafe"

	"github.com/dchest/siphash"
	"github.com/redis/go-redis/v9"

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
// shard. On a prefix that ignores tags (Config.IgnoreKeyTags) keys share a
// shard only by chance, so AllowAll over several keys mostly returns this
// there. On one server (not a cluster) AllowAll takes keys of any shards.
var ErrCrossShard = errors.New("redisstore: AllowAll keys in more than one virtual shard on Redis Cluster (co-locate them with a {tag}; under IgnoreKeyTags, keys share one only by chance)")

// slots is Redis Cluster's number of hash slots.
const slots = 16384

// shardKeys are one virtual shard's keys: its copy of the version in force
// (a hash, field v), its history list, its pending flag, and the start of
// its buckets' keys.
type shardKeys struct {
	policy, history, pending, bucket string
	words                            [3]any // policy, history and pending, boxed once: a script call's first keys
}

// hashTag is the part of key Redis Cluster hashes: the text between the
// first "{" and the first "}" after it, if that is not empty; else key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// A prefix's key map: how its keys map to virtual shards, stored with the
// prefix's policy by the first store (see installSrc) and adopted by every
// other, so that every process maps a key to the same shard.
//
// A key's shard is SipHash-2-4, keyed by the prefix's seed, of the key's
// hash tag (of the whole key if it has none, or if the prefix ignores
// tags), modulo the number of shards. The seed is 16 bytes from
// crypto/rand, drawn by the store that creates the prefix: without reading
// it from Redis, nobody can tell which keys share a shard, so a client that
// picks its keys' text cannot pile them onto one shard (one master of a
// cluster). SipHash is a keyed hash made for exactly this: it tells nothing
// of its key from outputs, and costs about as much as FNV-1a did.
type keyMap struct {
	k0, k1     uint64 // the seed, as SipHash's two key words (little-endian)
	ignoreTags bool   // hash the whole key, "{...}" or not
	seed, tags string // as stored
	word       any    // seed, boxed once: the decide script's argument
}

// seedBytes is the length of a prefix's seed: SipHash's 128-bit key.
const seedBytes = 16

// ErrKeyTags is New's error when Config.IgnoreKeyTags differs from the
// setting stored with the prefix: stores that map keys to shards
// differently would keep two buckets for one key, each with its own quota.
var ErrKeyTags = errors.New("redisstore: Config.IgnoreKeyTags differs from the setting stored with the prefix")

// newSeed draws a seed for a new prefix, in hex as it is stored.
func newSeed() string {
	var b [seedBytes]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand crashes the program rather than return an error
	return hex.EncodeToString(b[:])
}

// tagsArg is the stored form of the tags setting: "0" when the prefix
// ignores "{...}" in keys, "1" when a key's tag picks its shard.
func tagsArg(ignore bool) string { return flag(!ignore) }

// parseKeyMap reads a key map as stored: the seed in hex and the tags
// setting.
func parseKeyMap(seed, tags string) (keyMap, error) {
	b, err := hex.DecodeString(seed)
	if err != nil || len(b) != seedBytes || (tags != "0" && tags != "1") {
		return keyMap{}, fmt.Errorf("%w: the stored key map (seed %q, tags %q)", ErrUnavailable, seed, tags)
	}
	return keyMap{k0: binary.LittleEndian.Uint64(b), k1: binary.LittleEndian.Uint64(b[8:]), ignoreTags: tags == "0",
		seed: seed, tags: tags, word: seed}, nil
}

// shardOf is key's virtual shard among n under m.
func (m *keyMap) shardOf(key string, n int) int {
	t := key
	if !m.ignoreTags {
		t = hashTag(key)
	}
	return int(sipHash(m.k0, m.k1, t) % uint64(n))
}

// sipHash is SipHash-2-4 of s under the key (k0, k1), read from s's bytes
// in place, without a copy: siphash.Hash only reads its input, and keeps
// none of it.
func sipHash(k0, k1 uint64, s string) uint64 {
	return siphash.Hash(k0, k1, unsafe.Slice(unsafe.StringData(s), len(s)))
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

// evenTags is the most virtual shards whose tags are placed (shardTags);
// more spread evenly enough by hashing alone.
const evenTags = 64

// shardTags returns the hash tags of n virtual shards whose keys Redis
// Cluster hashes by lead + tag (see openLead). For n up to evenTags, shard
// i's tag is the first "i-j" (j = 0, 1, ...) that puts lead + tag's slot in
// a window around the middle of the i-th of n equal ranges of the slots: a
// cluster created with redis-cli gives each master an equal run of slots,
// so the shards spread evenly over the masters. Above, shard i's tag is
// "i": that many slots hashed at random spread evenly enough. Every process
// computes the same tags.
func shardTags(lead string, n int) []string {
	tags := make([]string, n)
	w := slots / n / 4
	for i := range n {
		if n > evenTags {
			tags[i] = strconv.Itoa(i)
			continue
		}
		lo := (2*i+1)*slots/(2*n) - w/2
		for j := 0; ; j++ {
			t := strconv.Itoa(i) + "-" + strconv.Itoa(j)
			if sl := int(crc16(lead+t) % slots); sl >= lo && sl < lo+w {
				tags[i] = t
				break
			}
		}
	}
	return tags
}

// openLead is what Redis Cluster hashes ahead of a shard's tag in the keys
// Prefix + "{" + tag + "}" + name: nothing for a prefix with no "{"; for a
// prefix whose first "{" is left open (no "}" after it), the text after
// that "{", then the "{" the store adds, for the first "}" closes both. A
// prefix that closes a tag of its own ("app{t}:") puts every key in that
// tag's slot, and one whose first "{" is closed at once hashes each key
// whole (New refuses it): no choice of the shards' tags places those, and
// openLead returns "" for them.
func openLead(prefix string) string {
	_, rest, ok := strings.Cut(prefix, "{")
	if !ok || strings.Contains(rest, "}") {
		return ""
	}
	return rest + "{"
}

// globalTag is the hash tag of a prefix's global keys (policy, history,
// blobs, lock): "g" and FNV-1a of the prefix in hex, so that the global keys
// of different prefixes spread over the slots.
func globalTag(prefix string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(prefix))
	return "g" + strconv.FormatUint(uint64(h.Sum32()), 16)
}

// globals sets the names of the prefix's global keys.
func (s *Store) globals() {
	g := s.prefix + "{" + globalTag(s.prefix) + "}"
	s.kPolicy, s.kHistory, s.kBlobs, s.kLock = g+"policy", g+"history", g+"blobs", g+"lock"
	s.kBucket = s.prefix + "{" // every bucket's key starts so; see bucketKeyOf
}

// layout sets the key names of n virtual shards.
func (s *Store) layout(n int) {
	tags := shardTags(openLead(s.prefix), n)
	s.shards = make([]shardKeys, n)
	s.shardByTag = make(map[string]int, n)
	for i, t := range tags {
		b := s.prefix + "{" + t + "}"
		k := shardKeys{policy: b + "p", history: b + "h", pending: b + "n", bucket: b + "k:"}
		k.words = [3]any{k.policy, k.history, k.pending}
		s.shards[i] = k
		s.shardByTag[t] = i
	}
}

// shard is key's virtual shard, under the prefix's key map.
func (s *Store) shard(key string) int { return s.kmap.Load().shardOf(key, len(s.shards)) }

// bucketKeyOf parses a bucket's Redis key (one SCAN returned) into the
// user's key, reporting false for a key that is not a bucket of this
// layout, or sits in a shard its key does not map to.
func (s *Store) bucketKeyOf(rk string) (string, bool) {
	rest, ok := strings.CutPrefix(rk, s.kBucket)
	tag, rest, ok2 := strings.Cut(rest, "}")
	i, ok3 := s.shardByTag[tag]
	key, ok4 := strings.CutPrefix(rest, "k:")
	if !ok || !ok2 || !ok3 || !ok4 {
		return "", false
	}
	return key, s.shard(key) == i
}

// record is a parsed cutover record (see intentSrc).
type record struct {
	nv, trim, lengthens, at, tail string
}

// finish completes a cutover that intentSrc recorded (rec) while
// version v is in force in the global keys, or only publishes its shards if
// it is committed (v is its version): for a lengthening cutover it first
// sets the cutover's pending flag in every shard, then it prepares every
// shard, commits, and publishes every shard as of the commit's instant.
// Every step is conditional and idempotent, so the process that started
// the cutover and any number of stores that meet it may run it at once. It
// reports whether every shard is published; an error wrapping
// errShardMoved means another finisher or cutover moved on, and the caller
// must read the global keys again before it goes on (never assume the
// cutover committed).
func (s *Store) finish(ctx context.Context, v string, rec record) (bool, error) {
	all, token := s.allShards(), ""
	if rec.lengthens == "1" {
		// the pending token a lengthening cutover sets in every shard
		// before it prepares any, kept until the shard is published: every
		// finisher sets and removes the same one, so that no shard writes
		// an expiry under the old version once the cutover may be
		// finished, whoever finishes it
		token = "c" + rec.nv
	}
	if v != rec.nv {
		ov, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return false, fmt.Errorf("%w: the stored policy version %q", ErrUnavailable, v)
		}
		n, err := strconv.ParseInt(rec.nv, 10, 64)
		if err != nil || n <= ov {
			return false, nil // an older record: nothing to finish
		}
		op, err := s.policyAt(ctx, ov)
		if err != nil {
			return false, err
		}
		// Recorded with its policy (intentSrc): a record without one was
		// written by hand, and committed, no store could read the version
		// in force.
		if _, err := s.policyAt(ctx, n); err != nil {
			return false, fmt.Errorf("%w: the cutover to version %s recorded without its policy (remove field next of %s): %w", ErrUnavailable, rec.nv, s.kPolicy, err)
		}
		if token != "" {
			if err := s.shardStep(ctx, all, flagSrc, func(k shardKeys) []string { return []string{k.policy, k.pending} },
				rec.nv, token); err != nil {
				return false, err
			}
		}
		if err := s.shardStep(ctx, all, prepareSrc, func(k shardKeys) []string { return []string{k.policy, k.history} },
			v, rec.nv, tail(op), s.nowArg()); err != nil {
			return false, err
		}
		res, err := one(ctx, s, func(c redis.Cmdable) *redis.Cmd {
			return c.Eval(ctx, commitSrc, []string{s.kPolicy, s.kHistory, s.kBlobs}, v, rec.nv, s.nowArg())
		}).StringSlice()
		if err != nil {
			return false, fmt.Errorf("%w: committing the cutover to version %s: %w", ErrUnavailable, rec.nv, err)
		}
		if len(res) != 2 || res[0] != "ok" {
			return false, fmt.Errorf("%w: %w: the commit of version %s found %v", ErrUnavailable, errShardMoved, rec.nv, res)
		}
		rec.at = res[1]
	}
	if rec.at == "-" {
		return false, fmt.Errorf("%w: a committed cutover record without its instant (version %s)", ErrUnavailable, rec.nv)
	}
	if err := s.shardStep(ctx, all, publishSrc, func(k shardKeys) []string { return []string{k.policy, k.history, k.pending} },
		rec.nv, rec.tail, rec.trim, rec.at, "", token, s.lockTTL.Milliseconds()); err != nil {
		return false, err
	}
	return true, nil
}

// settle finishes the cutover recorded in the global keys, if any,
// reading them again whenever a step finds that another finisher moved on.
// Once every shard is published it ends the cutover (doneSrc; a failure
// to end it goes to OnError, and the next ReplacePolicy ends it), except that
// a lengthening cutover's record stays until every bucket's expiry is set
// under the new version: with a lock token (the caller holds the cutover
// lock: ReplacePolicy) it runs that pass itself, else it leaves the record
// for the next ReplacePolicy, and the buckets written meanwhile keep no
// expiry (memory, never tokens). It reports whether a committed cutover was
// left unpublished.
func (s *Store) settle(ctx context.Context, token string) (bool, error) {
	for range 4 {
		v, next, err := s.policyRecord(ctx)
		if err != nil {
			return false, err
		}
		if v == "" || next == "" {
			return false, nil
		}
		f := strings.SplitN(next, " ", 5)
		if len(f) != 5 {
			return false, fmt.Errorf("%w: malformed cutover record %q", ErrUnavailable, next)
		}
		rec := record{nv: f[0], trim: f[1], lengthens: f[2], at: f[3], tail: f[4]}
		published, err := roundGet(ctx, s, func(ctx context.Context) (bool, error) { return s.finish(ctx, v, rec) })
		switch {
		case errors.Is(err, errShardMoved):
			continue // read again
		case err != nil:
			return v == rec.nv, err
		case !published:
			return false, nil
		}
		if rec.lengthens == "1" {
			if token == "" {
				return false, nil
			}
			if _, err := s.convertPass(ctx, "c", token); err != nil {
				return false, err
			}
		}
		if err := s.done(ctx, rec.nv); err != nil {
			s.report(fmt.Errorf("redisstore: ending the cutover to version %s (the next ReplacePolicy ends it): %w", rec.nv, err))
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: the cutover recorded in the prefix kept moving while it was finished", ErrUnavailable)
}

// policyRecord reads the version in force and the cutover record
// ("" for none) from the global keys.
func (s *Store) policyRecord(ctx context.Context) (v, next string, err error) {
	vals, err := roundGet(ctx, s, func(ctx context.Context) ([]any, error) {
		return one(ctx, s, func(c redis.Cmdable) *redis.SliceCmd { return c.HMGet(ctx, s.kPolicy, "v", "next") }).Result()
	})
	if err == nil {
		v, _ = vals[0].(string)
		next, _ = vals[1].(string)
	}
	return v, next, err
}

// done ends the committed and published cutover to version nv.
func (s *Store) done(ctx context.Context, nv string) error {
	return s.round(ctx, func(ctx context.Context) error {
		return one(ctx, s, func(c redis.Cmdable) *redis.Cmd { return c.Eval(ctx, doneSrc, []string{s.kPolicy}, nv) }).Err()
	})
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
		switch v, _ := c.Text(); {
		case v == "ok":
		case v != "" && !storedVersion(v): // no finisher moves a shard there: reading again would not help
			return fmt.Errorf("%w: virtual shard %d holds version %q, not a version", ErrUnavailable, which[j], v)
		default:
			return fmt.Errorf("%w: %w: virtual shard %d is at version %q", ErrUnavailable, errShardMoved, which[j], v)
		}
	}
	return nil
}

// storedVersion reports whether v, a virtual shard's version as stored, is
// one a store writes: a version in decimal, or "p" and one (prepared).
func storedVersion(v string) bool {
	v = strings.TrimPrefix(v, "p")
	n, err := strconv.ParseInt(v, 10, 64)
	return err == nil && n >= 1 && strconv.FormatInt(n, 10) == v
}

// errShardMoved: a shard was not in the state a cutover step expects.
var errShardMoved = errors.New("a virtual shard moved on")

// stateShard is the shard whose copy of the policy state a script call on
// shard i reads: its own on a cluster. On one server every call reads
// shard 0's (every copy moves in the same pipelines, a cutover's steps
// included): a call may then hold keys of any shards (a batch is not
// split per shard, and AllowAll takes keys of any shards).
func (s *Store) stateShard(i int) int {
	if s.cluster == nil {
		return 0
	}
	return i
}

// route splits items into script calls of about ChunkSize of work (see
// weight), in order, each on one virtual shard on a cluster (one slot per
// call; go-redis pipelines each node's calls), and with every item of a
// key in the call of its first: calls are pipelined, and one that stops
// part-way (a chain to fetch) is sent again after the others, so a key
// must not have items in two of them (a batch decides each key's requests
// in request order). A key's items make its call longer, up to ChunkSize
// of work: its items past that are returned in later, in order, for a
// later round, so that they wait for the round after its earlier ones are
// done rather than ride in a call of their own. A call then holds less
// than 2*ChunkSize of work.
func (s *Store) route(items []*item) (chunks [][]*item, later []*item) {
	w, one := 0, true
	for _, it := range items {
		w += it.w
		one = one && w <= ChunkSize && s.stateShard(it.shard) == s.stateShard(items[0].shard)
	}
	if one {
		return [][]*item{items}, nil
	}
	var work []int
	keys := make(map[string][2]int, len(items)) // a key's chunk, and its work in this round
	open := make(map[int]int)                   // a shard's chunk being filled
	for _, it := range items {
		k, ok := keys[it.key]
		if k[1] >= ChunkSize {
			later = append(later, it)
			continue
		}
		if !ok {
			sh := s.stateShard(it.shard)
			c, ok := open[sh]
			if !ok || work[c] >= ChunkSize {
				c = len(chunks)
				chunks, work, open[sh] = append(chunks, nil), append(work, 0), c
			}
			k[0] = c
		}
		k[1] += it.w
		keys[it.key] = k
		chunks[k[0]] = append(chunks[k[0]], it)
		work[k[0]] += it.w
	}
	return chunks, later
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
	// Only to the version in force in the global keys: a store's cached
	// version is not committed if the global keys were reinstalled older
	// meanwhile, and no shard may go above the global.
	v, err := one(ctx, s, func(c redis.Cmdable) *redis.StringCmd { return c.HGet(ctx, s.kPolicy, "v") }).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: reading the policy: %w", ErrUnavailable, err)
	}
	nv := strconv.FormatInt(p.Version, 10)
	if v != nv {
		return nil // the next attempt reloads
	}
	err = s.shardStep(ctx, []int{l.shard}, publishSrc, func(k shardKeys) []string { return []string{k.policy, k.history, k.pending} },
		nv, tail(p), "0", s.nowArg(), l.version, "", s.lockTTL.Milliseconds())
	if errors.Is(err, errShardMoved) {
		return nil // someone else moved it: the next attempt tells
	}
	return err
}
