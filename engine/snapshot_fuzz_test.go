package engine_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/internal/model"
	"github.com/tokenshard/tokenshard/policy"
)

// This file holds a second, test-only codec for the snapshot format, written
// from the format comment in snapshot.go rather than from the engine's code:
// tests craft well-sealed snapshots that are wrong in one way only, read
// what Snapshot wrote, and the fuzz target compares the engine's decoder
// with this one on every input. It writes and reads both versions: version
// 2, which Snapshot writes, and version 1, which Restore still reads.

const snapMagic = "tokenshard-snapshot\n"

// rawRate is a Refill rate as version 2 writes it, after a TokensPerSecond
// of 0: Tokens every Per ns.
type rawRate struct{ Tokens, Per uint64 }

func (r rawRate) rate() policy.Rate {
	return policy.Rate{Tokens: int64(r.Tokens), Per: time.Duration(r.Per)}
}

// rawBand is one band of a band set (version 2).
type rawBand struct {
	Name     string
	Capacity uint64
	Refill   rawRate
}

// rawOverride is one override. Name, Refill (written only when Rate, the
// TokensPerSecond, is 0) and Bands are version 2's.
type rawOverride struct {
	Match          string
	Capacity, Rate uint64
	Name           string
	Refill         rawRate
	Bands          []rawBand
}

// rawLevel is one band's balance in a version 2 bucket: whole tokens, and
// units below the band's period in ns.
type rawLevel struct{ Tokens, Units uint64 }

// rawBucket is one bucket. A version 1 bucket is Key, Tokens, Units (of
// 1e9), Last and its limit written out, Capacity and Rate (per second). A
// version 2 bucket is Key, Last, Limit (the index of its limit in the
// policy's limit table) and Levels, one per band of that limit, the
// primary first.
type rawBucket struct {
	Key            string
	Tokens, Units  uint64
	Last           int64
	Capacity, Rate uint64
	Limit          uint64
	Levels         []rawLevel
}

// rawSnap is a snapshot field by field, in the order they are written.
// Fields are raw (unsigned where the format is), so a test can write values
// the engine must refuse. Refill, Bands and the overrides' version 2 fields
// are written only with a Format of 2 or more.
type rawSnap struct {
	Magic                   string // "" writes the real magic
	Format                  uint64 // 0 writes 1
	Version, Capacity, Rate uint64
	Refill                  rawRate   // version 2, written when Rate is 0
	Bands                   []rawBand // version 2
	Overrides               []rawOverride
	Wall, Reading           int64
	Buckets                 []rawBucket
	Count                   *uint64 // nil writes len(Buckets)

	shapes []policy.Shape // the decoder's limit table, for a version 2 snapshot
}

func (s rawSnap) format() uint64 {
	if s.Format == 0 {
		return 1
	}
	return s.Format
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendRate writes a rate: TokensPerSecond, then in version 2, when that
// is 0, the Refill.
func appendRate(b []byte, v2 bool, perSecond uint64, r rawRate) []byte {
	b = binary.AppendUvarint(b, perSecond)
	if v2 && perSecond == 0 {
		b = binary.AppendUvarint(b, r.Tokens)
		b = binary.AppendUvarint(b, r.Per)
	}
	return b
}

func appendBands(b []byte, bands []rawBand) []byte {
	b = binary.AppendUvarint(b, uint64(len(bands)))
	for _, x := range bands {
		b = appendString(b, x.Name)
		b = binary.AppendUvarint(b, x.Capacity)
		b = binary.AppendUvarint(b, x.Refill.Tokens)
		b = binary.AppendUvarint(b, x.Refill.Per)
	}
	return b
}

// body returns every byte before the checksum.
func (s rawSnap) body() []byte {
	magic := s.Magic
	if magic == "" {
		magic = snapMagic
	}
	v2 := s.format() >= 2
	b := []byte(magic)
	b = binary.AppendUvarint(b, s.format())
	b = binary.AppendUvarint(b, s.Version)
	b = binary.AppendUvarint(b, s.Capacity)
	b = appendRate(b, v2, s.Rate, s.Refill)
	if v2 {
		b = appendBands(b, s.Bands)
	}
	b = binary.AppendUvarint(b, uint64(len(s.Overrides)))
	for _, o := range s.Overrides {
		b = appendString(b, o.Match)
		if v2 {
			b = appendString(b, o.Name)
		}
		b = binary.AppendUvarint(b, o.Capacity)
		b = appendRate(b, v2, o.Rate, o.Refill)
		if v2 {
			b = appendBands(b, o.Bands)
		}
	}
	b = binary.AppendVarint(b, s.Wall)
	b = binary.AppendVarint(b, s.Reading)
	for _, k := range s.Buckets {
		b = append(b, 1)
		b = appendString(b, k.Key)
		if v2 {
			b = binary.AppendVarint(b, k.Last)
			b = binary.AppendUvarint(b, k.Limit)
			for _, v := range k.Levels {
				b = binary.AppendUvarint(b, v.Tokens)
				b = binary.AppendUvarint(b, v.Units)
			}
			continue
		}
		b = binary.AppendUvarint(b, k.Tokens)
		b = binary.AppendUvarint(b, k.Units)
		b = binary.AppendVarint(b, k.Last)
		b = binary.AppendUvarint(b, k.Capacity)
		b = binary.AppendUvarint(b, k.Rate)
	}
	count := uint64(len(s.Buckets))
	if s.Count != nil {
		count = *s.Count
	}
	b = append(b, 0)
	return binary.AppendUvarint(b, count)
}

// encode returns the whole snapshot, sealed with a right checksum.
func (s rawSnap) encode() []byte { return seal(s.body()) }

// seal appends the xxhash64 of body, little endian.
func seal(body []byte) []byte {
	return binary.LittleEndian.AppendUint64(bytes.Clone(body), xxhash.Sum64(body))
}

// reseal replaces the last 8 bytes of data (its checksum, if it has one)
// with the right checksum of the bytes before them.
func reseal(data []byte) []byte {
	if len(data) < 8 {
		return data
	}
	return seal(data[:len(data)-8])
}

// snapDecoder reads a snapshot with every check the format comment asks
// for. It is deliberately plain: a byte slice and an offset.
type snapDecoder struct {
	data []byte
	off  int
}

var errTestDecode = errors.New("test decoder")

func (d *snapDecoder) failf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", errTestDecode, d.off, fmt.Sprintf(format, args...))
}

func (d *snapDecoder) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 {
		return 0, d.failf("%s: bad or truncated uvarint", what)
	}
	d.off += n
	return v, nil
}

func (d *snapDecoder) varint(what string) (int64, error) {
	v, n := binary.Varint(d.data[d.off:])
	if n <= 0 {
		return 0, d.failf("%s: bad or truncated varint", what)
	}
	d.off += n
	return v, nil
}

// int reads a uvarint that must lie in [lo, MaxInt64].
func (d *snapDecoder) int(lo uint64, what string) (uint64, error) {
	v, err := d.uvarint(what)
	if err == nil && (v < lo || v > math.MaxInt64) {
		err = d.failf("%s: %d out of range", what, v)
	}
	return v, err
}

func (d *snapDecoder) bytes(n uint64, what string) (string, error) {
	if n > uint64(len(d.data)-d.off) {
		return "", d.failf("%s: truncated", what)
	}
	s := string(d.data[d.off : d.off+int(n)])
	d.off += int(n)
	return s, nil
}

// string reads a uvarint length and that many bytes.
func (d *snapDecoder) string(what string) (string, error) {
	size, err := d.int(0, what+" length")
	if err != nil {
		return "", err
	}
	return d.bytes(size, what)
}

// rate reads a rate: TokensPerSecond, and in version 2, if that is 0, the
// Refill's Tokens and Per. Whether they make a valid rate is the policy's
// to say.
func (d *snapDecoder) rate(v2 bool, what string) (uint64, rawRate, error) {
	var r rawRate
	perSecond, err := d.int(0, what+" rate")
	if err != nil || !v2 || perSecond != 0 {
		return perSecond, r, err
	}
	if r.Tokens, err = d.int(0, what+" refill tokens"); err != nil {
		return 0, r, err
	}
	r.Per, err = d.int(0, what+" refill period")
	return 0, r, err
}

// bands reads a band set (version 2): a count, at most policy.MaxBands, and
// each band's Name, Capacity, Refill.Tokens and Refill.Per.
func (d *snapDecoder) bands(what string) ([]rawBand, error) {
	n, err := d.uvarint(what + " band count")
	if err != nil {
		return nil, err
	}
	if n > policy.MaxBands {
		return nil, d.failf("%s: %d bands, at most %d", what, n, policy.MaxBands)
	}
	var bands []rawBand
	for range n {
		var b rawBand
		if b.Name, err = d.string(what + " band name"); err != nil {
			return nil, err
		}
		if b.Capacity, err = d.int(0, what+" band capacity"); err != nil {
			return nil, err
		}
		if b.Refill.Tokens, err = d.int(0, what+" band refill tokens"); err != nil {
			return nil, err
		}
		if b.Refill.Per, err = d.int(0, what+" band refill period"); err != nil {
			return nil, err
		}
		bands = append(bands, b)
	}
	return bands, nil
}

// decodeSnap decodes and checks data. A key of any length is well formed:
// one above the restoring engine's MaxKeyBytes is dropped, not refused.
func decodeSnap(data []byte) (rawSnap, error) {
	d := &snapDecoder{data: data}
	return d.decode()
}

func (d *snapDecoder) decode() (s rawSnap, err error) {
	if len(d.data) < len(snapMagic)+8 {
		return s, d.failf("too short")
	}
	if s.Magic, _ = d.bytes(uint64(len(snapMagic)), "magic"); s.Magic != snapMagic {
		return s, d.failf("bad magic")
	}
	if s.Format, err = d.uvarint("format"); err != nil || (s.Format != 1 && s.Format != 2) {
		return s, errors.Join(err, d.failf("format %d", s.Format))
	}
	v2 := s.Format == 2
	if s.Version, err = d.int(0, "version"); err != nil {
		return s, err
	}
	if s.Capacity, err = d.int(0, "capacity"); err != nil {
		return s, err
	}
	if s.Rate, s.Refill, err = d.rate(v2, "policy"); err != nil {
		return s, err
	}
	if v2 {
		if s.Bands, err = d.bands("policy"); err != nil {
			return s, err
		}
	}
	n, err := d.uvarint("override count")
	if err != nil {
		return s, err
	}
	for range n {
		var o rawOverride
		if o.Match, err = d.string("match"); err != nil {
			return s, err
		}
		if v2 {
			if o.Name, err = d.string("override name"); err != nil {
				return s, err
			}
		}
		if o.Capacity, err = d.int(0, "override capacity"); err != nil {
			return s, err
		}
		if o.Rate, o.Refill, err = d.rate(v2, "override"); err != nil {
			return s, err
		}
		if v2 {
			if o.Bands, err = d.bands("override"); err != nil {
				return s, err
			}
		}
		s.Overrides = append(s.Overrides, o)
	}
	p, err := s.policy()
	if err != nil {
		return s, d.failf("policy: %v", err)
	}
	s.shapes = p.Shapes()
	if s.Wall, err = d.varint("wall"); err != nil {
		return s, err
	}
	if s.Reading, err = d.varint("reading"); err != nil {
		return s, err
	}
	if s.Reading < 0 {
		return s, d.failf("negative reading")
	}
	seen := map[string]bool{}
	for {
		if d.off >= len(d.data) {
			return s, d.failf("truncated before a tag")
		}
		tag := d.data[d.off]
		d.off++
		if tag == 0 {
			break
		}
		if tag != 1 {
			return s, d.failf("tag %#x", tag)
		}
		var b rawBucket
		size, err := d.int(0, "key length")
		if err != nil {
			return s, err
		}
		if size == 0 {
			return s, d.failf("key of %d bytes", size)
		}
		if b.Key, err = d.bytes(size, "key"); err != nil {
			return s, err
		}
		if strings.TrimSpace(b.Key) == "" {
			return s, d.failf("blank key")
		}
		if seen[b.Key] {
			return s, d.failf("duplicate key %q", b.Key)
		}
		seen[b.Key] = true
		if v2 {
			err = d.bucketV2(&s, &b)
		} else {
			err = d.bucketV1(&b)
		}
		if err != nil {
			return s, err
		}
		s.Buckets = append(s.Buckets, b)
	}
	count, err := d.uvarint("count")
	if err != nil {
		return s, err
	}
	if count != uint64(len(s.Buckets)) {
		return s, d.failf("count %d, %d buckets", count, len(s.Buckets))
	}
	if len(d.data)-d.off < 8 {
		return s, d.failf("truncated checksum")
	}
	if binary.LittleEndian.Uint64(d.data[d.off:]) != xxhash.Sum64(d.data[:d.off]) {
		return s, d.failf("checksum")
	}
	if d.off += 8; d.off != len(d.data) {
		return s, d.failf("trailing bytes")
	}
	return s, nil
}

// bucketV1 reads the rest of a version 1 bucket: tokens, units (< 1e9),
// last update, and its limit, capacity and tokens per second, both >= 1.
func (d *snapDecoder) bucketV1(b *rawBucket) (err error) {
	if b.Tokens, err = d.int(0, "tokens"); err != nil {
		return err
	}
	if b.Units, err = d.int(0, "units"); err != nil {
		return err
	}
	if b.Units >= policy.UnitsPerToken {
		return d.failf("units %d", b.Units)
	}
	if b.Last, err = d.varint("last"); err != nil {
		return err
	}
	if b.Last < 0 {
		return d.failf("negative last")
	}
	if b.Capacity, err = d.int(1, "bucket capacity"); err != nil {
		return err
	}
	if b.Rate, err = d.int(1, "bucket rate"); err != nil {
		return err
	}
	if b.Tokens > b.Capacity || (b.Tokens == b.Capacity && b.Units != 0) {
		return d.failf("balance above capacity")
	}
	return nil
}

// bucketV2 reads the rest of a version 2 bucket: last update, the index of
// its limit in the policy's limit table, and per band of that limit, the
// primary first, whole tokens (at most the band's capacity, at least minus
// it: a debt, in two's complement) and units (below the band's period in
// ns; none at capacity).
func (d *snapDecoder) bucketV2(s *rawSnap, b *rawBucket) (err error) {
	if b.Last, err = d.varint("last"); err != nil {
		return err
	}
	if b.Last < 0 {
		return d.failf("negative last")
	}
	if b.Limit, err = d.uvarint("limit"); err != nil {
		return err
	}
	if b.Limit >= uint64(len(s.shapes)) {
		return d.failf("limit %d of %d", b.Limit, len(s.shapes))
	}
	sh := s.shapes[b.Limit]
	for i := range sh.Len() {
		var v rawLevel
		if v.Tokens, err = d.uvarint("band tokens"); err != nil { // two's complement: a debt is negative
			return err
		}
		if v.Units, err = d.uvarint("band units"); err != nil {
			return err
		}
		l := sh.Band(i)
		if v.Units >= uint64(l.Rate().Per) {
			return d.failf("band %d: units %d, period %d", i, v.Units, l.Rate().Per)
		}
		if tokens := int64(v.Tokens); tokens > l.Capacity || (tokens == l.Capacity && v.Units != 0) {
			return d.failf("band %d: balance above capacity", i)
		} else if tokens < -l.Capacity {
			return d.failf("band %d: balance below the floor", i)
		}
		b.Levels = append(b.Levels, v)
	}
	return nil
}

// newBands builds a band set from raw bands.
func newBands(raw []rawBand) (*policy.BandSet, error) {
	var bands []policy.Band
	for _, b := range raw {
		bands = append(bands, policy.Band{Name: b.Name, Capacity: int64(b.Capacity), Refill: b.Refill.rate()})
	}
	return policy.NewBands(bands...)
}

// policy builds the snapshot's policy, with its overrides, and in version 2
// their names, Refill rates and bands.
func (s rawSnap) policy() (policy.Policy, error) {
	v2 := s.format() >= 2
	var os []policy.Override
	for i, o := range s.Overrides {
		po := policy.Override{Match: o.Match, Capacity: int64(o.Capacity), TokensPerSecond: int64(o.Rate)}
		if v2 {
			bands, err := newBands(o.Bands)
			if err != nil {
				return policy.Policy{}, fmt.Errorf("override %d: %w", i, err)
			}
			po.Name, po.Refill, po.Bands = o.Name, o.Refill.rate(), bands
		}
		os = append(os, po)
	}
	set, err := policy.NewOverrideSet(os...)
	if err != nil {
		return policy.Policy{}, err
	}
	p := policy.Policy{Version: int64(s.Version), Capacity: int64(s.Capacity), TokensPerSecond: int64(s.Rate), Overrides: set}
	if v2 {
		if p.Bands, err = newBands(s.Bands); err != nil {
			return policy.Policy{}, err
		}
		p.Refill = s.Refill.rate()
	}
	return p, p.Validate()
}

// shape is the limit b had in the snapshot: the one written out in a
// version 1 bucket, one band per second; the entry of the policy's limit
// table at b.Limit in version 2.
func (s rawSnap) shape(b rawBucket) policy.Shape {
	if s.format() < 2 {
		return policy.Shape{Primary: policy.Limit{Capacity: int64(b.Capacity), TokensPerSecond: int64(b.Rate)}}
	}
	shapes := s.shapes
	if shapes == nil { // crafted, not decoded
		p, err := s.policy()
		if err != nil {
			panic(err)
		}
		shapes = p.Shapes()
	}
	return shapes[b.Limit]
}

// levels is b's balance, band by band.
func (s rawSnap) levels(b rawBucket) []rawLevel {
	if s.format() < 2 {
		return []rawLevel{{b.Tokens, b.Units}}
	}
	return b.Levels
}

// sameShape reports whether a and b are the same limit, band for band (the
// band sets by content: a decoded policy has band sets of its own).
func sameShape(a, b policy.Shape) bool {
	return a.Name == b.Name && a.Primary == b.Primary && slices.Equal(a.Bands.Bands(), b.Bands.Bands())
}

// The balances below are exact rationals of tokens (math/big.Rat): a band
// of N tokens per P ns holds whole tokens plus units of 1/P token, and
// earns elapsed*N/P tokens, up to its capacity.

// tokensOf is v's balance in tokens under l; v.Tokens is two's complement,
// negative for a debt (version 1 has none, and never reaches 1<<63).
func tokensOf(v rawLevel, l policy.Limit) *big.Rat {
	t := new(big.Rat).SetFrac(new(big.Int).SetUint64(v.Units), big.NewInt(int64(l.Rate().Per)))
	return t.Add(t, new(big.Rat).SetInt64(int64(v.Tokens)))
}

// refilled is t after elapsed ns (>= 0) of refill under l, at most l's
// capacity.
func refilled(t *big.Rat, l policy.Limit, elapsed *big.Int) *big.Rat {
	r := l.Rate()
	u := new(big.Rat).SetFrac(new(big.Int).Mul(elapsed, big.NewInt(r.Tokens)), big.NewInt(int64(r.Per)))
	u.Add(u, t)
	return capped(u, l.Capacity)
}

func capped(t *big.Rat, capacity int64) *big.Rat {
	if c := new(big.Rat).SetInt64(capacity); t.Cmp(c) > 0 {
		return c
	}
	return t
}

// cutoverTokens carries a key's balances t under old (refilled up to the
// cutover) to next, by the cutover rule: the primary takes the primary's
// balance and a band the balance of old's band of the same name; a balance
// whose period changes is rounded down to a whole unit of the new period
// (a multiple of 1/P tokens; a debt toward more debt), then clamped to the
// new capacity and to its floor, minus that capacity; a band new
// in next starts full; old's other bands are dropped.
func cutoverTokens(old policy.Shape, t []*big.Rat, next policy.Shape) []*big.Rat {
	out := make([]*big.Rat, next.Len())
	for j := range out {
		l := next.Band(j)
		src := 0
		if j > 0 {
			src = -1
			for i := 1; i < old.Len(); i++ {
				if old.BandName(i) == next.BandName(j) {
					src = i
				}
			}
		}
		if src < 0 {
			out[j] = new(big.Rat).SetInt64(l.Capacity)
			continue
		}
		v := new(big.Rat).Set(t[src])
		if per := int64(l.Rate().Per); per != int64(old.Band(src).Rate().Per) {
			scaled := new(big.Rat).Mul(v, new(big.Rat).SetInt64(per))
			v.SetFrac(new(big.Int).Div(scaled.Num(), scaled.Denom()), big.NewInt(per)) // Euclidean: floor
		}
		v = capped(v, l.Capacity)
		if f := new(big.Rat).SetInt64(-l.Capacity); v.Cmp(f) < 0 {
			v = f
		}
		out[j] = v
	}
	return out
}

// restoredTokens is what a restore at reading now of a Manual clock (whose
// wall is the reading) under next owes b, band by band of the limit its key
// resolves to under next: its balance brought forward, under the limit it
// had, by the time from its last update to the restore, then cut over to
// next (cutoverTokens). That time is the wall time from the snapshot to the
// restore (zero if the wall went back, at most MaxInt64 ns, as
// RestoreReport.Elapsed), plus the snapshot's reading less the bucket's
// last update. The last term is negative for a bucket its shard served after
// the snapshot began and copied later: that much of the wall time since the
// snapshot had already passed when it was copied, and counting it again
// would mint tokens. The sum is clamped to [0, MaxInt64] ns; the rest is
// exact but for the cutover's one rounding.
func restoredTokens(s rawSnap, b rawBucket, next policy.Policy, now int64) []*big.Rat {
	maxOwed := big.NewInt(math.MaxInt64)
	owed := new(big.Int).Sub(big.NewInt(now), big.NewInt(s.Wall))
	if owed.Sign() < 0 {
		owed.SetInt64(0)
	}
	if owed.Cmp(maxOwed) > 0 {
		owed.Set(maxOwed)
	}
	owed.Add(owed, big.NewInt(s.Reading))
	owed.Sub(owed, big.NewInt(b.Last))
	if owed.Sign() < 0 {
		owed.SetInt64(0)
	}
	if owed.Cmp(maxOwed) > 0 {
		owed.Set(maxOwed)
	}
	old := s.shape(b)
	var t []*big.Rat
	for i, v := range s.levels(b) {
		t = append(t, refilled(tokensOf(v, old.Band(i)), old.Band(i), owed))
	}
	return cutoverTokens(old, t, model.ShapeOf(next, b.Key))
}

// ceilNs is ceil(t * P / N) ns for a positive t tokens under l, saturated.
func ceilNs(t *big.Rat, l policy.Limit) time.Duration {
	if t.Sign() <= 0 {
		return 0
	}
	r := l.Rate()
	x := new(big.Rat).Mul(t, big.NewRat(int64(r.Per), r.Tokens))
	q, rem := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if rem.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return time.Duration(q.Int64())
}

func floorTokens(t *big.Rat) int64 { return new(big.Int).Div(t.Num(), t.Denom()).Int64() } // Euclidean: floor

// decisionFor is the Decision for a request of cost on a key of shape sh
// whose bands hold t tokens, in force as version, by the package doc's
// rules: allowed only if every band holds the cost, and then it is taken
// from every band; the binding band is, on a denial, the one with the
// longest wait (RetryAfter), when allowed the one with the fewest whole
// tokens left, ties to the lowest index; Remaining (floored), Limit and
// ResetAfter (a ceiling) are that band's. t is not changed.
func decisionFor(t []*big.Rat, sh policy.Shape, version, cost int64) engine.Decision {
	c := new(big.Rat).SetInt64(cost)
	after := make([]*big.Rat, len(t))
	allowed := true
	for i, v := range t {
		after[i] = new(big.Rat).Sub(v, c)
		allowed = allowed && after[i].Sign() >= 0
	}
	d := engine.Decision{Allowed: allowed, Version: version}
	at := 0
	if allowed {
		for i := range after {
			if floorTokens(after[i]) < floorTokens(after[at]) {
				at = i
			}
		}
	} else {
		after = t
		for i, v := range t {
			if w := ceilNs(new(big.Rat).Sub(c, v), sh.Band(i)); w > d.RetryAfter {
				d.RetryAfter, at = w, i
			}
		}
	}
	l := sh.Band(at)
	d.Remaining = floorTokens(after[at])
	d.Limit = l.Capacity
	d.ResetAfter = ceilNs(new(big.Rat).Sub(new(big.Rat).SetInt64(l.Capacity), after[at]), l)
	d.Band = sh.BandName(at)
	return d
}

// Fuzz configuration: small bounds, so the fuzzer reaches them.
const (
	fuzzMaxKeys     = 4
	fuzzMaxKeyBytes = 16
	fuzzNow         = int64(5 * time.Second)
)

// fuzzPolicy is what the fuzz target restores into: a primary per second
// and a band "m" per minute, so a restore cuts every snapshot over band by
// band: the seeds' primaries and their own bands "m" change period, their
// other bands are dropped, and a snapshot without an "m" gets it full.
var fuzzPolicy = policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2,
	Bands: mustBands(policy.Band{Name: "m", Capacity: 12, Refill: policy.PerMinute(100)})}

// mustBands is policy.NewBands for bands known to be valid.
func mustBands(bands ...policy.Band) *policy.BandSet {
	set, err := policy.NewBands(bands...)
	if err != nil {
		panic(err)
	}
	return set
}

// fuzzSeeds returns real snapshots, small enough for the fuzzer to mutate:
// an empty engine, a few keys at various balances after a cutover with
// overrides, one over fuzzMaxKeys keys, the same with rates per any period
// and bands, and crafted ones of both versions.
func fuzzSeeds(tb testing.TB) map[string][]byte {
	seeds := map[string][]byte{}
	snap := func(name string, keys int, from, to policy.Policy) {
		clk := clock.NewManual(int64(time.Second))
		e, err := engine.New(engine.Config{Policy: from, Shards: 2, Clock: clk})
		require.NoError(tb, err)
		defer func() { _ = e.Close() }()
		for i := range keys {
			_, _ = e.Allow(tb.Context(), fmt.Sprintf("k%d", i), int64(1+i%4))
			_, _ = e.Allow(tb.Context(), fmt.Sprintf("a%d", i), 3)
		}
		clk.Advance(1500 * time.Millisecond)
		if to.Version != 0 {
			require.NoError(tb, e.ReplacePolicy(tb.Context(), to, from.Version))
		}
		clk.Advance(250 * time.Millisecond)
		_, _ = e.Allow(tb.Context(), "k0", 1)
		var buf bytes.Buffer
		require.NoError(tb, e.Snapshot(tb.Context(), &buf))
		seeds[name] = buf.Bytes()
	}
	set, err := policy.NewOverrideSet(policy.Override{Match: "a*", Capacity: 4, TokensPerSecond: 1}, policy.Override{Match: "k1", Capacity: 30, TokensPerSecond: 5})
	require.NoError(tb, err)
	v1 := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2, Overrides: set}
	v2 := policy.Policy{Version: 2, Capacity: 6, TokensPerSecond: 3, Overrides: set}
	snap("empty", 0, v1, policy.Policy{})
	snap("two", 1, v1, policy.Policy{})
	snap("cutover", 2, v1, v2)
	snap("over-max-keys", 3, v1, v2)

	banded, err := policy.NewOverrideSet(
		policy.Override{Match: "a*", Name: "gold", Capacity: 4, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second},
			Bands: mustBands(policy.Band{Name: "m", Capacity: 5, Refill: policy.Rate{Tokens: 7, Per: 3 * time.Second}})},
		policy.Override{Match: "k1", Capacity: 30, Refill: policy.PerDay(1)},
	)
	require.NoError(tb, err)
	b1 := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerMinute(100), Overrides: banded, Bands: mustBands(
		policy.Band{Name: "m", Capacity: 8, Refill: policy.PerSecond(1)},
		policy.Band{Name: "d", Capacity: 20, Refill: policy.PerDay(1)},
	)}
	b2 := policy.Policy{Version: 2, Capacity: 6, TokensPerSecond: 3, Overrides: banded, Bands: mustBands(
		policy.Band{Name: "d", Capacity: 15, Refill: policy.PerHour(1)},
		policy.Band{Name: "x", Capacity: 9, Refill: policy.PerMinute(1)},
		policy.Band{Name: "m", Capacity: 7, Refill: policy.PerSecond(2)},
	)}
	snap("bands", 2, b1, policy.Policy{})
	snap("bands-cutover", 2, b1, b2)
	snap("bands-over-max-keys", 3, b1, b2)

	seeds["wall-far-back"] = rawSnap{Version: 1, Capacity: 10, Rate: 2, Wall: math.MinInt64, Reading: 7,
		Buckets: []rawBucket{{Key: "k", Tokens: 1, Units: 5, Last: 3, Capacity: 10, Rate: 2}}}.encode()
	seeds["crafted-v2"] = okSnapV2().encode()
	// Keys above fuzzMaxKeyBytes, which Restore drops: beside a short key,
	// and one written twice.
	long := strings.Repeat("L", fuzzMaxKeyBytes+1)
	longKeys := rawSnap{Version: 1, Capacity: 10, Rate: 2, Wall: 5, Reading: 5, Buckets: []rawBucket{
		{Key: "k", Tokens: 1, Units: 5, Last: 3, Capacity: 10, Rate: 2},
		{Key: long, Tokens: 0, Units: 0, Last: 4, Capacity: 10, Rate: 2},
		{Key: long + "x", Tokens: 2, Units: 0, Last: 4, Capacity: 10, Rate: 2},
	}}
	seeds["long-keys"] = longKeys.encode()
	longKeys.Buckets = append(longKeys.Buckets, longKeys.Buckets[1])
	seeds["long-key-twice"] = longKeys.encode()

	// Debts: a key at its floor in every band, one in debt in the primary
	// only, one repaying.
	clk := clock.NewManual(int64(time.Second))
	e, err := engine.New(engine.Config{Policy: b1, Shards: 2, Clock: clk})
	require.NoError(tb, err)
	defer func() { _ = e.Close() }()
	_, _ = e.Charge(tb.Context(), "k0", math.MaxInt64)
	_, _ = e.Charge(tb.Context(), "k1", 3)
	_, _ = e.Charge(tb.Context(), "a1", 13)
	clk.Advance(1500 * time.Millisecond)
	_, _ = e.Charge(tb.Context(), "k2", 12)
	var buf bytes.Buffer
	require.NoError(tb, e.Snapshot(tb.Context(), &buf))
	seeds["debts"] = buf.Bytes()
	return seeds
}

// okSnapV2 is a crafted, valid version 2 snapshot for tests to break in one
// place: a policy of 100 per minute with bands "burst" (1 per second) and
// "daily" (20 per day), and an override "gold" of 7 per 3 s with its own
// "daily" (1 per day); a bucket of each.
func okSnapV2() rawSnap {
	const day = uint64(24 * time.Hour)
	return rawSnap{Format: 2, Version: 3, Capacity: 10, Refill: rawRate{100, uint64(time.Minute)},
		Bands: []rawBand{{"burst", 5, rawRate{1, uint64(time.Second)}}, {"daily", 20, rawRate{20, day}}},
		Overrides: []rawOverride{{Match: "vip:*", Name: "gold", Capacity: 30, Refill: rawRate{7, uint64(3 * time.Second)},
			Bands: []rawBand{{"daily", 100, rawRate{1, day}}}}},
		Wall: int64(5 * time.Second), Reading: int64(5 * time.Second),
		Buckets: []rawBucket{
			{Key: "a", Last: int64(4 * time.Second), Limit: 0, Levels: []rawLevel{{3, 7}, {5, 0}, {19, 123}}},
			{Key: "vip:b", Last: int64(5 * time.Second), Limit: 1, Levels: []rawLevel{{0, uint64(3*time.Second) - 1}, {100, 0}}},
		}}
}

// FuzzRestore feeds Restore arbitrary bytes, as they are and with their last
// 8 bytes replaced by the right checksum (so mutations get past it and
// reach the checks behind it), and compares it with the test decoder:
//   - it never panics;
//   - it fails, with no engine, exactly when the test decoder rejects the
//     input (ErrInvalidSnapshot, with a message past the sentinel's) or the
//     input holds more than MaxKeys keys (ErrKeyCapacity);
//   - when it succeeds, the engine tracks exactly the snapshot's keys, each
//     with the balance Restore's doc comment promises in every band, to the
//     unit (read back from the restored engine's own snapshot), and answers
//     a request accordingly.
func FuzzRestore(f *testing.F) {
	for _, data := range fuzzSeeds(f) {
		f.Add(data)
		f.Add(data[:len(data)/2])
		f.Add(append(bytes.Clone(data), 0))
		flipped := bytes.Clone(data)
		flipped[len(flipped)/3] ^= 0x10
		f.Add(flipped)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRestore(t, data)
		if sealed := reseal(data); !bytes.Equal(sealed, data) {
			checkRestore(t, sealed)
		}
	})
}

func checkRestore(t *testing.T, data []byte) {
	clk := clock.NewManual(fuzzNow)
	cfg := engine.Config{Policy: fuzzPolicy, Shards: 2, MaxKeys: fuzzMaxKeys, MaxKeyBytes: fuzzMaxKeyBytes, Clock: clk}
	want, wantErr := decodeSnap(data)
	// Keys above MaxKeyBytes no request can name: Restore drops them.
	long := 0
	want.Buckets = slices.DeleteFunc(want.Buckets, func(b rawBucket) bool {
		if len(b.Key) > fuzzMaxKeyBytes {
			long++
			return true
		}
		return false
	})
	e, rep, err := engine.Restore(cfg, bytes.NewReader(data), engine.RestoreOptions{})
	if err != nil {
		require.Nil(t, e, "an error comes with no engine")
		require.Equal(t, engine.RestoreReport{}, rep, "an error comes with no report")
		switch {
		case errors.Is(err, engine.ErrInvalidSnapshot):
			require.Error(t, wantErr, "Restore rejected a snapshot the test decoder accepts: %v", err)
			require.Greater(t, len(err.Error()), len(engine.ErrInvalidSnapshot.Error())+2, "the error names the problem: %v", err)
		case errors.Is(err, engine.ErrKeyCapacity):
			require.NoError(t, wantErr, "ErrKeyCapacity for a snapshot the test decoder rejects: %v", err)
			require.Greater(t, len(want.Buckets), fuzzMaxKeys, "ErrKeyCapacity for %d keys", len(want.Buckets))
		default:
			t.Fatalf("Restore: unexpected error %v", err)
		}
		return
	}
	defer func() { require.NoError(t, e.Close()) }()
	require.NoError(t, wantErr, "Restore accepted a snapshot the test decoder rejects")
	require.LessOrEqual(t, len(want.Buckets), fuzzMaxKeys)
	require.Equal(t, len(want.Buckets), e.KeyCount())
	require.Equal(t, len(want.Buckets), rep.Restored)
	require.Equal(t, long, rep.LongKeys)
	require.Equal(t, fuzzPolicy, e.Policy())
	require.GreaterOrEqual(t, rep.Elapsed, time.Duration(0), "elapsed wall time is never negative (wall %d, now %d)", want.Wall, fuzzNow)
	require.Zero(t, rep.Dropped)

	// The restored state, every band, read back through the test decoder.
	var buf bytes.Buffer
	require.NoError(t, e.Snapshot(t.Context(), &buf))
	got, err := decodeSnap(buf.Bytes())
	require.NoError(t, err, "the restored engine's snapshot")
	held := map[string][]*big.Rat{}
	for _, b := range got.Buckets {
		sh := got.shape(b)
		require.True(t, sameShape(model.ShapeOf(fuzzPolicy, b.Key), sh), "key %q: restored under its limit", b.Key)
		for i, v := range got.levels(b) {
			held[b.Key] = append(held[b.Key], refilled(tokensOf(v, sh.Band(i)), sh.Band(i), big.NewInt(fuzzNow-b.Last)))
		}
	}
	require.Len(t, held, len(want.Buckets))
	for _, b := range want.Buckets {
		tokens := restoredTokens(want, b, fuzzPolicy, fuzzNow)
		require.Equal(t, ratStrings(tokens), ratStrings(held[b.Key]), "key %q: bucket %+v, snapshot wall %d reading %d", b.Key, b, want.Wall, want.Reading)
		d, err := e.Allow(t.Context(), b.Key, 1)
		require.NoError(t, err)
		require.Equal(t, decisionFor(tokens, model.ShapeOf(fuzzPolicy, b.Key), fuzzPolicy.Version, 1), d, "key %q: bucket %+v, snapshot wall %d reading %d", b.Key, b, want.Wall, want.Reading)
	}
}

// ratStrings formats balances for comparison and failure messages.
func ratStrings(t []*big.Rat) []string {
	out := make([]string, len(t))
	for i, v := range t {
		out[i] = v.RatString()
	}
	return out
}
