package engine

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
	"github.com/tokenshard/tokenshard/shard"
)

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	// DropFullest lets Restore fit a snapshot of more than MaxKeys keys by
	// dropping buckets, those that lack the fewest tokens first. A full
	// bucket is the same as an absent one, but a partly refilled one is
	// not: its key starts over full. RestoreReport says how many such keys
	// there were and how far from full. Without it, such a snapshot is
	// ErrKeyCapacity, and Restore holds no more than MaxKeys buckets while
	// it reads on to check the stream, but every key's name, to find a key
	// written twice (ErrInvalidSnapshot). With it, every key is held until
	// the end of the stream.
	DropFullest bool
}

// RestoreReport says what Restore did.
type RestoreReport struct {
	Restored int           // keys tracked by the new engine
	Elapsed  time.Duration // wall time between snapshot and restore, counted as refill
	// Dropped is how many keys DropFullest dropped; DroppedPartial how many
	// of them were not full, and MaxDeficit the most tokens, rounded up, any
	// of those was short of its capacity: what its key was handed.
	Dropped        int
	DroppedPartial int
	MaxDeficit     int64
	// LongKeys is how many keys of the snapshot were longer than
	// cfg.MaxKeyBytes (a MaxKeyBytes lowered since it was taken). The
	// engine refuses every request naming such a key, so none could reach
	// its bucket: they are not restored, nor counted in Restored or against
	// MaxKeys.
	LongKeys int
	// Fresh reports that RestoreFile found no snapshot file and started a
	// new, empty engine (the first boot). Restore never sets it.
	Fresh bool
	// Version is the version of the policy the snapshot was taken under.
	// Above cfg.Policy.Version, the engine restored answers with a lower
	// version than the old one did: its configuration is older than the
	// policy the old engine was last given.
	Version int64
}

// Restore builds an engine from cfg and a snapshot written by Snapshot, and
// starts it only once the whole snapshot has been read and checked: nothing
// half-restored is ever served.
//
// Every bucket is brought forward by the time that passed since its last
// update: the wall time from the snapshot to now (cfg.Clock's, if it is a
// clock.WallClock, else time.Now; zero if the wall clock went backwards),
// plus the bucket's age at the snapshot's reading on the old engine's clock,
// or less the time by which it was updated after that reading, if it was
// served while the snapshot ran (never below zero). Then it is cut over
// into cfg.Policy by ReplacePolicy's rule (the package doc's Policy cutover
// section): refilled under the limit it had, clamped to the capacity its
// key resolves to now, and a debt to the floor it resolves to now (minus
// that capacity), as a cutover clamps them. So a restore mints no token a
// cutover would not: a depleted key is exactly as depleted as the elapsed
// time says, but for a debt deeper than the new floor, which is forgiven
// down to it, since no bucket owes more than one capacity (see Charge). A
// key longer than cfg.MaxKeyBytes is dropped (RestoreReport.LongKeys): the
// engine refuses every request that names it.
//
// Errors, with no engine: those of New for cfg; ErrInvalidSnapshot (wrapped,
// saying what was wrong) for input it cannot read, and for a nil r (then
// wrapping fs.ErrInvalid too); ErrKeyCapacity if the snapshot holds more
// than cfg.MaxKeys keys and opts.DropFullest is not set; the reader's error.
func Restore(cfg Config, r io.Reader, opts RestoreOptions) (*Engine, RestoreReport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, RestoreReport{}, err
	}
	if r == nil {
		return nil, RestoreReport{}, errNilReader
	}
	e, shards := build(cfg)
	rep, err := e.restore(cfg, shards, r, opts)
	if err != nil {
		return nil, RestoreReport{}, err
	}
	for _, s := range shards {
		s.PublishCounters() // Stats counts the restored keys from the start
	}
	e.start(cfg, shards)
	return e, rep, nil
}

func (e *Engine) restore(cfg Config, shards []*shard.Shard, r io.Reader, opts RestoreOptions) (RestoreReport, error) {
	d := &snapReader{br: bufio.NewReaderSize(r, 64<<10), sum: xxhash.New()}
	h, err := d.header()
	if err != nil {
		return RestoreReport{}, err
	}
	// The wall time first, then the reading the buckets are brought to:
	// the time between the two is then owed once, not twice.
	rep := RestoreReport{Version: h.pol.Version}
	if wall := clock.Wall(cfg.Clock).UnixNano(); wall > h.wall {
		rep.Elapsed = time.Duration(wall - h.wall)
		if rep.Elapsed < 0 { // the difference overflows: centuries
			rep.Elapsed = math.MaxInt64
		}
	}
	// The restoring goroutine owns the states until the shards start.
	now := cfg.Clock.Now()
	count := 0
	// Past MaxKeys without DropFullest the answer is ErrKeyCapacity unless
	// the stream is malformed, and a key repeated after the bound is: over
	// holds every key read so far (the keys, not their states) to find one.
	var over, long map[string]struct{}
	for {
		tag, err := d.byte("a bucket or the end")
		if err != nil {
			return rep, err
		}
		if tag == 0 {
			break
		}
		if tag != 1 {
			return rep, d.fail("bucket %d: unexpected byte %#x", count, tag)
		}
		var lv [1 + policy.MaxBands]policy.Level
		key, last, sh, n, err := d.bucket(count, &h, &lv)
		if err != nil {
			return rep, err
		}
		// Time owed: from the bucket's last update to now, which is its age
		// at the snapshot's reading plus the wall time since. A bucket
		// served while the snapshot ran was updated after that reading:
		// the time between comes off, or it would be paid twice.
		owed := int64(rep.Elapsed)
		if last < h.reading {
			owed = satAdd(owed, h.reading-last)
		} else {
			owed = max(0, owed-(last-h.reading))
		}
		policy.RefillLevels(sh, lv[:n], owed)
		count++
		if len(key) > e.maxKeyBytes {
			// Every request naming it is refused (ErrInvalidKey), so no
			// answer can depend on its bucket: dropped, not refused, or a
			// lowered MaxKeyBytes would leave no restart but an empty one.
			// Its name is kept (as many bytes as the input held) to find
			// it written twice.
			if long == nil {
				long = map[string]struct{}{}
			}
			if _, dup := long[key]; dup {
				return rep, d.fail("bucket %d: duplicate key %s", count-1, quoted(key))
			}
			long[key] = struct{}{}
			rep.LongKeys++
			continue
		}
		if count-rep.LongKeys > cfg.MaxKeys && !opts.DropFullest {
			// The answer will be ErrKeyCapacity: read on to check the
			// stream, holding no more than MaxKeys buckets meanwhile, but
			// every name, to find a key written twice.
			if over == nil {
				over = make(map[string]struct{}, 2*cfg.MaxKeys)
				for _, s := range shards {
					s.State().Each(func(k string, _ int64, _ policy.Shape, _ []policy.Level) {
						over[strings.Clone(k)] = struct{}{}
					})
				}
			}
			if _, dup := over[key]; dup {
				return rep, d.fail("bucket %d: duplicate key %s", count-1, quoted(key))
			}
			over[key] = struct{}{}
			continue
		}
		i, hash := e.shardOf(key)
		if err := shards[i].State().Restore(now, key, hash, now, sh, lv[:n]); err != nil {
			return rep, d.fail("bucket %d: %v", count-1, err)
		}
	}
	if err := d.end(count); err != nil {
		return rep, err
	}
	rep.Restored = count - rep.LongKeys
	if rep.Restored > cfg.MaxKeys {
		if !opts.DropFullest {
			return rep, fmt.Errorf("%w: the snapshot holds %d keys, MaxKeys is %d", ErrKeyCapacity, rep.Restored, cfg.MaxKeys)
		}
		dropFullest(e, shards, rep.Restored-cfg.MaxKeys, &rep)
	}
	return rep, nil
}

// dropFullest drops the n buckets closest to full, by what they lack: the
// fewest tokens handed out by forgetting them. A key of several bands lacks
// what its emptiest band (in tokens) lacks.
func dropFullest(e *Engine, shards []*shard.Shard, n int, rep *RestoreReport) {
	type entry struct {
		key   string // a view of the shard's table, good until its own Drop: Drop moves no other slot
		hash  uint64
		shard int
		// The deficit in tokens: whole, and the fraction in 64 bits,
		// rounded down (exact for the order of deficits of one period).
		whole, frac uint64
		deficitTok  int64 // the same in tokens, rounded up
	}
	var all []entry
	for i, s := range shards {
		s.State().Each(func(key string, _ int64, sh policy.Shape, lv []policy.Level) {
			_, h := e.shardOf(key)
			x := entry{key: key, hash: h, shard: i}
			for j, v := range lv {
				whole, frac := deficitTokens(sh.Band(j), v)
				if whole > x.whole || (whole == x.whole && frac > x.frac) {
					x.whole, x.frac = whole, frac
				}
				x.deficitTok = max(x.deficitTok, satDeficit(sh.Band(j).Capacity, v.Tokens))
			}
			all = append(all, x)
		})
	}
	slices.SortFunc(all, func(a, b entry) int {
		if c := cmp.Compare(a.whole, b.whole); c != 0 {
			return c
		}
		return cmp.Compare(a.frac, b.frac)
	})
	for _, x := range all[:n] {
		shards[x.shard].State().Drop(x.key, x.hash)
		rep.Dropped++
		if x.whole != 0 || x.frac != 0 {
			rep.DroppedPartial++
			rep.MaxDeficit = max(rep.MaxDeficit, x.deficitTok)
		}
	}
	rep.Restored -= n
}

// deficitTokens returns what v lacks of l's capacity in tokens: the whole
// tokens, and the fraction of one as a 64-bit binary fraction, rounded down.
func deficitTokens(l policy.Limit, v policy.Level) (whole, frac uint64) {
	per := uint64(l.Rate().Per)
	if v.Tokens >= l.Capacity {
		return 0, 0
	}
	whole = uint64(l.Capacity - v.Tokens)
	if v.Frac == 0 {
		return whole, 0
	}
	// capacity - tokens - frac/per = (whole-1) + (per-frac)/per
	f, _ := bits.Div64(per-v.Frac, 0, per) // (per-frac) < per
	return whole - 1, f
}

// satDeficit is capacity - tokens for a balance in [-capacity, capacity],
// saturated at math.MaxInt64: a debt against a capacity near it lacks more.
func satDeficit(capacity, tokens int64) int64 {
	if tokens < 0 && capacity > math.MaxInt64+tokens {
		return math.MaxInt64
	}
	return capacity - tokens
}

// satAdd is a + b for b >= 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// snapReader decodes a snapshot, hashing every byte it consumes.
type snapReader struct {
	br      *bufio.Reader
	sum     *xxhash.Digest
	pending []byte // consumed, not yet hashed
	scratch []byte
	ioErr   error // the last error of the underlying reader
}

type snapHeader struct {
	format  uint64
	pol     policy.Policy
	shapes  []policy.Shape // pol.Shapes(): a version 2 bucket names its limit by index
	wall    int64
	reading int64
}

func (d *snapReader) fail(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidSnapshot}, args...)...)
}

// truncated turns the end of input into a clear error.
func (d *snapReader) truncated(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return d.fail("truncated: the stream ends before %s", what)
	}
	if err != d.ioErr {
		return d.fail("%s: %v", what, err) // a varint longer than 64 bits
	}
	return err // the reader's own error
}

func (d *snapReader) hash() {
	_, _ = d.sum.Write(d.pending)
	d.pending = d.pending[:0]
}

// ReadByte lets binary.ReadUvarint read through d.
func (d *snapReader) ReadByte() (byte, error) {
	c, err := d.br.ReadByte()
	if err != nil {
		d.ioErr = err
		return 0, err
	}
	d.pending = append(d.pending, c)
	if len(d.pending) >= 4096 {
		d.hash()
	}
	return c, nil
}

func (d *snapReader) byte(what string) (byte, error) {
	c, err := d.ReadByte()
	if err != nil {
		return 0, d.truncated(what, err)
	}
	return c, nil
}

// bytes reads exactly n bytes into a reused buffer. It grows the buffer at
// most a MiB ahead of what has arrived, so a corrupt length ends at the
// stream's end instead of allocating what it claims.
func (d *snapReader) bytes(n int, what string) ([]byte, error) {
	d.hash()
	b := d.scratch[:0]
	for len(b) < n {
		next := min(n, len(b)+1<<20)
		b = slices.Grow(b, next-len(b))
		k, err := io.ReadFull(d.br, b[len(b):next])
		b = b[:len(b)+k]
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				d.ioErr = err
			}
			return nil, d.truncated(what, err)
		}
	}
	d.scratch = b
	_, _ = d.sum.Write(b)
	return b, nil
}

func (d *snapReader) uvarint(what string) (uint64, error) {
	v, err := binary.ReadUvarint(d)
	if err != nil {
		return 0, d.truncated(what, err)
	}
	return v, nil
}

// int reads a uvarint that must lie in [lo, math.MaxInt64].
func (d *snapReader) int(lo int64, what string) (int64, error) {
	v, err := d.uvarint(what)
	if err != nil {
		return 0, err
	}
	if v > math.MaxInt64 || int64(v) < lo {
		return 0, d.fail("%s is %d, want %d to %d", what, v, lo, int64(math.MaxInt64))
	}
	return int64(v), nil
}

func (d *snapReader) varint(what string) (int64, error) {
	v, err := binary.ReadVarint(d)
	if err != nil {
		return 0, d.truncated(what, err)
	}
	return v, nil
}

func (d *snapReader) header() (snapHeader, error) {
	var h snapHeader
	magic, err := d.bytes(len(snapMagic), "the magic header")
	if err != nil {
		return h, err
	}
	if string(magic) != snapMagic {
		return h, d.fail("not a tokenshard snapshot (bad magic %q)", magic)
	}
	v, err := d.uvarint("the format version")
	if err != nil {
		return h, err
	}
	if v != 1 && v != snapVersion {
		return h, d.fail("format version %d, this build reads 1 and %d", v, snapVersion)
	}
	h.format = v
	p := &h.pol
	if p.Version, err = d.int(0, "policy version"); err != nil {
		return h, err
	}
	if p.Capacity, err = d.int(0, "policy capacity"); err != nil {
		return h, err
	}
	if p.TokensPerSecond, p.Refill, err = d.rate(v, "policy"); err != nil {
		return h, err
	}
	if v >= 2 {
		if p.Bands, err = d.bands("policy"); err != nil {
			return h, err
		}
	}
	n, err := d.uvarint("the override count")
	if err != nil {
		return h, err
	}
	var os []policy.Override
	for i := range n {
		what := fmt.Sprintf("override %d's", i)
		match, err := d.string(what+" Match", math.MaxInt64) // any Match a policy takes
		if err != nil {
			return h, err
		}
		o := policy.Override{Match: match}
		if v >= 2 {
			if o.Name, err = d.string(what+" Name", policy.MaxNameBytes); err != nil {
				return h, err
			}
		}
		if o.Capacity, err = d.int(0, what+" capacity"); err != nil {
			return h, err
		}
		if o.TokensPerSecond, o.Refill, err = d.rate(v, what); err != nil {
			return h, err
		}
		if v >= 2 {
			if o.Bands, err = d.bands(what); err != nil {
				return h, err
			}
		}
		os = append(os, o)
	}
	if p.Overrides, err = policy.NewOverrideSet(os...); err != nil {
		return h, d.fail("policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return h, d.fail("policy: %w", err)
	}
	h.shapes = p.Shapes()
	if h.wall, err = d.varint("the wall time"); err != nil {
		return h, err
	}
	if h.reading, err = d.varint("the clock reading"); err != nil {
		return h, err
	}
	if h.reading < 0 {
		return h, d.fail("clock reading %d is negative", h.reading)
	}
	return h, nil
}

// string reads a string of at most max bytes.
func (d *snapReader) string(what string, max int64) (string, error) {
	size, err := d.int(0, what+" length")
	if err != nil {
		return "", err
	}
	if max = min(max, math.MaxInt); size > max { // MaxInt: int is 32 bits on some platforms
		return "", d.fail("%s is %d bytes, at most %d", what, size, max)
	}
	b, err := d.bytes(int(size), what)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// rate reads a rate of the given format: TokensPerSecond, and in version 2
// a Refill when that is 0. Validation is the policy's.
func (d *snapReader) rate(format uint64, what string) (int64, policy.Rate, error) {
	var r policy.Rate
	perSecond, err := d.int(0, what+" tokens per second")
	if err != nil || format < 2 || perSecond != 0 {
		return perSecond, r, err
	}
	if r.Tokens, err = d.int(0, what+" refill tokens"); err != nil {
		return 0, r, err
	}
	per, err := d.int(0, what+" refill period")
	r.Per = time.Duration(per)
	return 0, r, err
}

// bands reads a band set.
func (d *snapReader) bands(what string) (*policy.BandSet, error) {
	n, err := d.int(0, what+" band count")
	if err != nil {
		return nil, err
	}
	if n > policy.MaxBands {
		return nil, d.fail("%s %d bands, at most %d", what, n, policy.MaxBands)
	}
	bands := make([]policy.Band, n)
	for i := range bands {
		b := &bands[i]
		w := fmt.Sprintf("%s band %d", what, i)
		if b.Name, err = d.string(w+" name", policy.MaxNameBytes); err != nil {
			return nil, err
		}
		if b.Capacity, err = d.int(0, w+" capacity"); err != nil {
			return nil, err
		}
		if b.Refill.Tokens, err = d.int(0, w+" refill tokens"); err != nil {
			return nil, err
		}
		per, err := d.int(0, w+" refill period")
		if err != nil {
			return nil, err
		}
		b.Refill.Per = time.Duration(per)
	}
	set, err := policy.NewBands(bands...)
	if err != nil {
		return nil, d.fail("policy: %w", err)
	}
	return set, nil
}

// bucket reads bucket i after its tag byte and checks it: its key, the
// reading it was last brought up to date at, its limit, and its levels
// into lv, n of them.
func (d *snapReader) bucket(i int, h *snapHeader, lv *[1 + policy.MaxBands]policy.Level) (key string, last int64, sh policy.Shape, n int, err error) {
	size, err := d.int(0, fmt.Sprintf("bucket %d's key length", i))
	if err != nil {
		return
	}
	// A key above the engine's MaxKeyBytes is read (memory grows with the
	// bytes received, not the length claimed) and then dropped by Restore.
	if size == 0 || size > math.MaxInt {
		err = d.fail("bucket %d: a key of %d bytes", i, size)
		return
	}
	raw, err := d.bytes(int(size), fmt.Sprintf("bucket %d's key", i))
	if err != nil {
		return
	}
	key = string(raw)
	if isBlank(key) {
		err = d.fail("bucket %d: blank key %s", i, quoted(key))
		return
	}
	if h.format == 1 {
		last, sh, err = d.bucketV1(i, key, &lv[0])
		return key, last, sh, 1, err
	}
	if last, err = d.varint(fmt.Sprintf("bucket %d's last update", i)); err != nil {
		return
	}
	if last < 0 {
		err = d.fail("bucket %d (%s): last update %d is negative", i, quoted(key), last)
		return
	}
	idx, err := d.uvarint(fmt.Sprintf("bucket %d's limit", i))
	if err != nil {
		return
	}
	if idx >= uint64(len(h.shapes)) {
		err = d.fail("bucket %d (%s): limit %d, the policy has %d", i, quoted(key), idx, len(h.shapes))
		return
	}
	sh = h.shapes[idx]
	n = sh.Len()
	for j := range n {
		v := &lv[j]
		// Two's complement: a debt reads as a negative count, which
		// checkLevel holds to the band's floor.
		var u uint64
		if u, err = d.uvarint(fmt.Sprintf("bucket %d's band %d tokens", i, j)); err != nil {
			return
		}
		v.Tokens = int64(u)
		if v.Frac, err = d.uvarint(fmt.Sprintf("bucket %d's band %d units", i, j)); err != nil {
			return
		}
		if err = d.checkLevel(i, key, sh.Band(j), *v); err != nil {
			return
		}
	}
	return key, last, sh, n, nil
}

// bucketV1 reads the rest of a version 1 bucket: one band per second.
func (d *snapReader) bucketV1(i int, key string, v *policy.Level) (int64, policy.Shape, error) {
	var sh policy.Shape
	var err error
	if v.Tokens, err = d.int(0, fmt.Sprintf("bucket %d's tokens", i)); err != nil {
		return 0, sh, err
	}
	if v.Frac, err = d.uvarint(fmt.Sprintf("bucket %d's units", i)); err != nil {
		return 0, sh, err
	}
	last, err := d.varint(fmt.Sprintf("bucket %d's last update", i))
	if err != nil {
		return 0, sh, err
	}
	if last < 0 {
		return 0, sh, d.fail("bucket %d (%s): last update %d is negative", i, quoted(key), last)
	}
	lim := &sh.Primary
	if lim.Capacity, err = d.int(1, fmt.Sprintf("bucket %d's capacity", i)); err != nil {
		return 0, sh, err
	}
	if lim.TokensPerSecond, err = d.int(1, fmt.Sprintf("bucket %d's tokens per second", i)); err != nil {
		return 0, sh, err
	}
	return last, sh, d.checkLevel(i, key, *lim, *v)
}

// checkLevel checks that v is a balance l can hold: from minus its
// capacity (the deepest debt) to its capacity.
func (d *snapReader) checkLevel(i int, key string, l policy.Limit, v policy.Level) error {
	if v.Frac >= uint64(l.Rate().Per) {
		return d.fail("bucket %d (%s): %d units, want fewer than a token", i, quoted(key), v.Frac)
	}
	if v.Tokens < -l.Capacity {
		return d.fail("bucket %d (%s): balance %d tokens is below its floor, minus its capacity %d", i, quoted(key), v.Tokens, l.Capacity)
	}
	if v.Tokens > l.Capacity || (v.Tokens == l.Capacity && v.Frac != 0) {
		return d.fail("bucket %d (%s): balance %d tokens and %d units is above its capacity %d", i, quoted(key), v.Tokens, v.Frac, l.Capacity)
	}
	return nil
}

// end reads the bucket count and the checksum after the end byte, and
// checks that nothing follows.
func (d *snapReader) end(count int) error {
	n, err := d.uvarint("the bucket count")
	if err != nil {
		return err
	}
	if n != uint64(count) {
		return d.fail("the end says %d buckets, the stream held %d", n, count)
	}
	d.hash()
	want := d.sum.Sum64()
	raw, err := d.bytes(8, "the checksum")
	if err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint64(raw); got != want {
		return d.fail("checksum mismatch: the stream says %#x, its bytes hash to %#x", got, want)
	}
	if _, err := d.br.ReadByte(); err == nil {
		return d.fail("trailing bytes after the checksum")
	} else if !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// quoted is key quoted for an error message, its first 64 bytes if it is
// longer (a snapshot's keys are bounded only by its size), with its length.
func quoted(key string) string {
	if len(key) <= 64 {
		return strconv.Quote(key)
	}
	n := 64
	for n > 0 && !utf8.RuneStart(key[n]) {
		n-- // not in the middle of a character, which would read as a byte the key lacks
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:n], len(key))
}
