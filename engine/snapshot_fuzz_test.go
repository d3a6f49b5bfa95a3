package engine_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
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
// with this one on every input.

const snapMagic = "tokenshard-snapshot\n"

type rawOverride struct {
	Match          string
	Capacity, Rate uint64
}

type rawBucket struct {
	Key            string
	Tokens, Units  uint64
	Last           int64
	Capacity, Rate uint64
}

// rawSnap is a snapshot field by field, in the order they are written.
// Fields are raw (unsigned where the format is), so a test can write values
// the engine must refuse.
type rawSnap struct {
	Magic                   string // "" writes the real magic
	Format                  uint64 // 0 writes 1
	Version, Capacity, Rate uint64
	Overrides               []rawOverride
	Wall, Reading           int64
	Buckets                 []rawBucket
	Count                   *uint64 // nil writes len(Buckets)
}

// body returns every byte before the checksum.
func (s rawSnap) body() []byte {
	magic, format := s.Magic, s.Format
	if magic == "" {
		magic = snapMagic
	}
	if format == 0 {
		format = 1
	}
	b := []byte(magic)
	b = binary.AppendUvarint(b, format)
	b = binary.AppendUvarint(b, s.Version)
	b = binary.AppendUvarint(b, s.Capacity)
	b = binary.AppendUvarint(b, s.Rate)
	b = binary.AppendUvarint(b, uint64(len(s.Overrides)))
	for _, o := range s.Overrides {
		b = binary.AppendUvarint(b, uint64(len(o.Match)))
		b = append(b, o.Match...)
		b = binary.AppendUvarint(b, o.Capacity)
		b = binary.AppendUvarint(b, o.Rate)
	}
	b = binary.AppendVarint(b, s.Wall)
	b = binary.AppendVarint(b, s.Reading)
	for _, k := range s.Buckets {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(k.Key)))
		b = append(b, k.Key...)
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

// snapDecoder reads a snapshot with every check the format comment and the
// issue ask for. It is deliberately plain: a byte slice and an offset.
type snapDecoder struct {
	data        []byte
	off         int
	maxKeyBytes int
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

// decodeSnap decodes and checks data. maxKeyBytes is the key bound of the
// engine that would restore it.
func decodeSnap(data []byte, maxKeyBytes int) (rawSnap, error) {
	d := &snapDecoder{data: data, maxKeyBytes: maxKeyBytes}
	return d.decode()
}

func (d *snapDecoder) decode() (s rawSnap, err error) {
	if len(d.data) < len(snapMagic)+8 {
		return s, d.failf("too short")
	}
	if s.Magic, _ = d.bytes(uint64(len(snapMagic)), "magic"); s.Magic != snapMagic {
		return s, d.failf("bad magic")
	}
	if s.Format, err = d.uvarint("format"); err != nil || s.Format != 1 {
		return s, errors.Join(err, d.failf("format %d", s.Format))
	}
	if s.Version, err = d.int(0, "version"); err != nil {
		return s, err
	}
	if s.Capacity, err = d.int(0, "capacity"); err != nil {
		return s, err
	}
	if s.Rate, err = d.int(0, "rate"); err != nil {
		return s, err
	}
	n, err := d.uvarint("override count")
	if err != nil {
		return s, err
	}
	for range n {
		var o rawOverride
		size, err := d.int(0, "match length")
		if err != nil {
			return s, err
		}
		if o.Match, err = d.bytes(size, "match"); err != nil {
			return s, err
		}
		if o.Capacity, err = d.int(0, "override capacity"); err != nil {
			return s, err
		}
		if o.Rate, err = d.int(0, "override rate"); err != nil {
			return s, err
		}
		s.Overrides = append(s.Overrides, o)
	}
	if _, err := s.policy(); err != nil {
		return s, d.failf("policy: %v", err)
	}
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
		if size == 0 || size > uint64(d.maxKeyBytes) {
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
		if b.Tokens, err = d.int(0, "tokens"); err != nil {
			return s, err
		}
		if b.Units, err = d.int(0, "units"); err != nil {
			return s, err
		}
		if b.Units >= policy.UnitsPerToken {
			return s, d.failf("units %d", b.Units)
		}
		if b.Last, err = d.varint("last"); err != nil {
			return s, err
		}
		if b.Last < 0 {
			return s, d.failf("negative last")
		}
		if b.Capacity, err = d.int(1, "bucket capacity"); err != nil {
			return s, err
		}
		if b.Rate, err = d.int(1, "bucket rate"); err != nil {
			return s, err
		}
		if b.Tokens > b.Capacity || (b.Tokens == b.Capacity && b.Units != 0) {
			return s, d.failf("balance above capacity")
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

// policy builds the snapshot's policy, with its overrides.
func (s rawSnap) policy() (policy.Policy, error) {
	var os []policy.Override
	for _, o := range s.Overrides {
		os = append(os, policy.Override{Match: o.Match, Capacity: int64(o.Capacity), TokensPerSecond: int64(o.Rate)})
	}
	set, err := policy.NewOverrideSet(os...)
	if err != nil {
		return policy.Policy{}, err
	}
	p := policy.Policy{Version: int64(s.Version), Capacity: int64(s.Capacity), TokensPerSecond: int64(s.Rate), Overrides: set}
	return p, p.Validate()
}

var bigUnit = big.NewInt(policy.UnitsPerToken)

// restoredUnits is what a restore at reading now of a Manual clock (whose
// wall is the reading) under next owes b: its balance brought forward, under
// its old limit, by the time from its last update to the restore, then
// clamped to the capacity its key resolves to under next. That time is the
// wall time from the snapshot to the restore (zero if the wall went back,
// at most MaxInt64 ns, as RestoreReport.Elapsed), plus the snapshot's
// reading less the bucket's last update. The last term is negative for a
// bucket its shard served after the snapshot began and copied later: that
// much of the wall time since the snapshot had already passed when it was
// copied, and counting it again would mint tokens. The sum is clamped to
// [0, MaxInt64] ns; the rest is exact.
func restoredUnits(s rawSnap, b rawBucket, next policy.Policy, now int64) *big.Int {
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
	units := new(big.Int).Mul(new(big.Int).SetUint64(b.Tokens), bigUnit)
	units.Add(units, new(big.Int).SetUint64(b.Units))
	units.Add(units, owed.Mul(owed, new(big.Int).SetUint64(b.Rate)))
	for _, c := range []int64{int64(b.Capacity), model.LimitOf(next, b.Key).Capacity} {
		if capUnits := new(big.Int).Mul(big.NewInt(c), bigUnit); units.Cmp(capUnits) > 0 {
			units = capUnits
		}
	}
	return units
}

// decisionFor is the Decision for a request of cost on a bucket holding
// units under lim, in force as version, by the formulas of the package doc's
// Decisions section.
func decisionFor(units *big.Int, lim policy.Limit, version, cost int64) engine.Decision {
	ceilDiv := func(x *big.Int) time.Duration {
		q, r := new(big.Int).QuoRem(x, big.NewInt(lim.TokensPerSecond), new(big.Int))
		if r.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if !q.IsInt64() {
			return math.MaxInt64
		}
		return time.Duration(q.Int64())
	}
	u := new(big.Int).Set(units)
	need := new(big.Int).Mul(big.NewInt(cost), bigUnit)
	d := engine.Decision{Version: version, Limit: lim.Capacity}
	if u.Cmp(need) >= 0 {
		d.Allowed = true
		u.Sub(u, need)
	} else {
		d.RetryAfter = ceilDiv(new(big.Int).Sub(need, u))
	}
	d.Remaining = new(big.Int).Quo(u, bigUnit).Int64()
	d.ResetAfter = ceilDiv(new(big.Int).Sub(new(big.Int).Mul(big.NewInt(lim.Capacity), bigUnit), u))
	return d
}

// Fuzz configuration: small bounds, so the fuzzer reaches them.
const (
	fuzzMaxKeys     = 4
	fuzzMaxKeyBytes = 16
	fuzzNow         = int64(5 * time.Second)
)

var fuzzPolicy = policy.Policy{Version: 3, Capacity: 10, TokensPerSecond: 2}

// fuzzSeeds returns real snapshots, small enough for the fuzzer to mutate:
// an empty engine, a few keys at various balances after a cutover with
// overrides, and one over fuzzMaxKeys keys.
func fuzzSeeds(tb testing.TB) map[string][]byte {
	seeds := map[string][]byte{}
	snap := func(name string, keys int, cutover bool) {
		set, err := policy.NewOverrideSet(policy.Override{Match: "a*", Capacity: 4, TokensPerSecond: 1}, policy.Override{Match: "k1", Capacity: 30, TokensPerSecond: 5})
		require.NoError(tb, err)
		clk := clock.NewManual(int64(time.Second))
		e, err := engine.New(engine.Config{Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2, Overrides: set}, Shards: 2, Clock: clk})
		require.NoError(tb, err)
		defer func() { _ = e.Close() }()
		for i := range keys {
			_, _ = e.Allow(tb.Context(), fmt.Sprintf("k%d", i), int64(1+i%4))
			_, _ = e.Allow(tb.Context(), fmt.Sprintf("a%d", i), 3)
		}
		clk.Advance(1500 * time.Millisecond)
		if cutover {
			require.NoError(tb, e.ReplacePolicy(tb.Context(), policy.Policy{Version: 2, Capacity: 6, TokensPerSecond: 3, Overrides: set}, 1))
		}
		clk.Advance(250 * time.Millisecond)
		_, _ = e.Allow(tb.Context(), "k0", 1)
		var buf bytes.Buffer
		require.NoError(tb, e.Snapshot(tb.Context(), &buf))
		seeds[name] = buf.Bytes()
	}
	snap("empty", 0, false)
	snap("two", 1, false)
	snap("cutover", 2, true)
	snap("over-max-keys", 3, true)
	seeds["wall-far-back"] = rawSnap{Version: 1, Capacity: 10, Rate: 2, Wall: math.MinInt64, Reading: 7,
		Buckets: []rawBucket{{Key: "k", Tokens: 1, Units: 5, Last: 3, Capacity: 10, Rate: 2}}}.encode()
	return seeds
}

// FuzzRestore feeds Restore arbitrary bytes, as they are and with their last
// 8 bytes replaced by the right checksum (so mutations get past it and
// reach the checks behind it), and compares it with the test decoder:
//   - it never panics;
//   - it fails, with no engine, exactly when the test decoder rejects the
//     input (ErrInvalidSnapshot, with a message past the sentinel's) or the
//     input holds more than MaxKeys keys (ErrKeyCapacity);
//   - when it succeeds, the engine tracks exactly the snapshot's keys, each
//     with the balance Restore's doc comment promises, to the unit.
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
	want, wantErr := decodeSnap(data, fuzzMaxKeyBytes)
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
	require.Equal(t, fuzzPolicy, e.Policy())
	require.GreaterOrEqual(t, rep.Elapsed, time.Duration(0), "elapsed wall time is never negative (wall %d, now %d)", want.Wall, fuzzNow)
	require.Zero(t, rep.Dropped)
	for _, b := range want.Buckets {
		lim := model.LimitOf(fuzzPolicy, b.Key)
		units := restoredUnits(want, b, fuzzPolicy, fuzzNow)
		d, err := e.Allow(t.Context(), b.Key, 1)
		require.NoError(t, err)
		require.Equal(t, decisionFor(units, lim, fuzzPolicy.Version, 1), d, "key %q: bucket %+v, snapshot wall %d reading %d", b.Key, b, want.Wall, want.Reading)
	}
}
