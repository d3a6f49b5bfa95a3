package engine

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"

	"github.com/cespare/xxhash/v2"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// The snapshot format, version 2. Integers are varints (encoding/binary);
// every field is checked on the way in.
//
//	magic     "tokenshard-snapshot" and a newline (20 bytes)
//	version   uvarint, 2
//	policy    uvarint Version, Capacity; rate; bands; uvarint override
//	          count; per override: string Match, string Name, uvarint
//	          Capacity; rate; bands
//	wall      varint Unix nanoseconds once every shard has begun its copy
//	          (after reading: restore counts the downtime from it, so
//	          never more than there was)
//	reading   varint clock reading when the first shard began
//	buckets   per bucket: byte 1; string key; varint last update reading;
//	          uvarint the index of the key's limit in the policy's limit
//	          table (policy.Policy.Shapes: 0 the policy's own, then its
//	          overrides' distinct limits in order); per band of that
//	          limit, the primary first: whole tokens, uvarint units (<
//	          the band's period in ns). The whole tokens are the uvarint
//	          of their 64-bit two's complement: a balance of zero or more
//	          is its plain uvarint, a debt (a negative balance, down to
//	          minus the band's capacity, units counting up from the
//	          negative whole tokens) a uvarint of ten bytes.
//	end       byte 0; uvarint bucket count
//	checksum  8 bytes, little endian: xxhash64 of every byte before it
//
// and nothing after it. A string is a uvarint length and its bytes; a rate
// is uvarint TokensPerSecond, and if that is 0, uvarint Refill.Tokens and
// Refill.Per in ns; bands are a uvarint count and per band: string Name,
// uvarint Capacity, Refill.Tokens, Refill.Per.
//
// Version 1, which Restore still reads, had no bands and rates per second
// only: its policy was uvarint Version, Capacity, TokensPerSecond and
// overrides of string Match, uvarint Capacity, TokensPerSecond; its buckets
// were byte 1, string key, uvarint whole tokens, uvarint units (< 1e9),
// varint last update reading, uvarint Capacity, TokensPerSecond of the
// key's limit.
const (
	snapMagic   = "tokenshard-snapshot\n"
	snapVersion = 2

	// snapChunks is how many chunks (of about shard.SliceSize slots each)
	// a shard may have in flight to the writer.
	snapChunks = 2
)

// ErrInvalidSnapshot is returned (wrapped, saying what was wrong) by Restore
// for input it cannot read: a wrong magic, an unknown version, a truncated
// stream, a checksum mismatch, a bad key, limit or balance, a duplicate key,
// an invalid policy or trailing bytes.
var ErrInvalidSnapshot = errors.New("engine: invalid snapshot")

// The errors of a nil writer or reader: a caller's mistake, as an empty
// path is SnapshotFile's and RestoreFile's.
var (
	errNilWriter = fmt.Errorf("engine: Snapshot to a nil io.Writer: %w", fs.ErrInvalid)
	errNilReader = fmt.Errorf("%w: a nil io.Reader (%w)", ErrInvalidSnapshot, fs.ErrInvalid)
)

// Snapshot writes the state of every tracked key to w, in a versioned format
// that Restore reads, while the engine goes on serving.
//
// Each shard copies its buckets itself, a chunk at a time, between requests,
// and Snapshot writes the chunks to w as they come: a slow writer pauses the
// copying, never admission (an AllowAll whose hold the snapshot's start made
// a shard give up starts over at once; only one that the start interrupts
// twice waits for the coordinator, so for Snapshot to return: see AllowAll),
// and the state is never copied whole. Each bucket is copied as it is at the
// moment its shard copies it, so the snapshot is consistent per key; across
// keys it is not a single instant (requests served during the snapshot show
// in the buckets copied after them), and a key created while the snapshot
// runs may or may not be in it. Snapshot holds the coordinator, so no
// cutover or sweep runs meanwhile.
//
// A snapshot taken while requests are served misses what they spend after
// their keys are copied: for a restart, stop admitting (http.Server's
// Shutdown, say) before the final Snapshot, then Close.
//
// Errors: ErrNotInitialized (a zero Engine, first), an error wrapping
// fs.ErrInvalid for a nil w, ErrClosed (before or during), ErrNilContext or
// the context's error, or w's error; on an error what was written is
// incomplete and Restore rejects it. A Close or a context that ends once
// every shard has handed its last chunk to the writer may come too late to
// end the call: Snapshot may then finish writing and return nil, and what
// it wrote is complete.
func (e *Engine) Snapshot(ctx context.Context, w io.Writer) error {
	if e.uninitialized() {
		return ErrNotInitialized
	}
	if w == nil {
		return errNilWriter // not a panic with the coordinator held and the shards copying
	}
	if err := e.acquire(ctx); err != nil {
		return err
	}
	defer e.release()

	n := len(e.mailboxes)
	out := make(chan *msg.SnapChunk, n*snapChunks)
	cancel := make(chan struct{})
	defer close(cancel) // shards still copying stop; after success none is
	begun := int64(math.MaxInt64)
	for _, mb := range e.mailboxes {
		m := &msg.Snapshot{Begin: make(chan int64, 1), Free: make(chan *msg.SnapChunk, snapChunks), Out: out, Cancel: cancel}
		for range snapChunks {
			m.Free <- &msg.SnapChunk{Free: m.Free}
		}
		reading, err := mb.Snapshot(ctx, m)
		if err != nil {
			return err
		}
		begun = min(begun, reading)
	}

	sw := newSnapWriter(w)
	sw.header(*e.pol.Load(), clock.Wall(e.clk).UnixNano(), begun)
	count := uint64(0)
	for left := n; left > 0; {
		select {
		case c := <-out:
			for _, r := range c.Records {
				sw.bucket(c.Keys[r.KeyOff:r.KeyOff+r.KeyLen], r.Last, r.Limit, c.Levels[r.LevelOff:r.LevelOff+r.Shape.Len()])
			}
			count += uint64(len(c.Records))
			if c.Last {
				left--
			} else {
				c.Free <- c // room for it: it came from there
			}
			if sw.err != nil {
				return sw.err
			}
		case <-ctx.Done():
			return e.ctxErr(ctx)
		case <-e.closing:
			return ErrClosed
		}
	}
	return sw.end(count)
}

// snapWriter encodes a snapshot into a buffered writer, hashing as it goes.
// The first error sticks.
type snapWriter struct {
	w   io.Writer
	bw  *bufio.Writer // into w and sum
	sum *xxhash.Digest
	buf []byte
	err error
}

func newSnapWriter(w io.Writer) *snapWriter {
	sw := &snapWriter{w: w, sum: xxhash.New(), buf: make([]byte, 0, 64)}
	sw.bw = bufio.NewWriterSize(io.MultiWriter(w, sw.sum), 64<<10)
	return sw
}

func (sw *snapWriter) uvarint(v uint64) { sw.buf = binary.AppendUvarint(sw.buf, v) }
func (sw *snapWriter) varint(v int64)   { sw.buf = binary.AppendVarint(sw.buf, v) }

func (sw *snapWriter) flush(tail []byte) {
	if sw.err == nil {
		_, sw.err = sw.bw.Write(sw.buf)
	}
	if sw.err == nil && len(tail) > 0 {
		_, sw.err = sw.bw.Write(tail)
	}
	sw.buf = sw.buf[:0]
}

func (sw *snapWriter) header(p policy.Policy, wall, reading int64) {
	sw.buf = append(sw.buf, snapMagic...)
	sw.uvarint(snapVersion)
	sw.uvarint(uint64(p.Version))
	sw.uvarint(uint64(p.Capacity))
	sw.rate(p.TokensPerSecond, p.Refill)
	sw.bands(p.Bands)
	os := p.Overrides.Overrides()
	sw.uvarint(uint64(len(os)))
	for _, o := range os {
		sw.string(o.Match)
		sw.string(o.Name)
		sw.uvarint(uint64(o.Capacity))
		sw.rate(o.TokensPerSecond, o.Refill)
		sw.bands(o.Bands)
	}
	sw.varint(wall)
	sw.varint(reading)
	sw.flush(nil)
}

func (sw *snapWriter) string(s string) {
	sw.uvarint(uint64(len(s)))
	sw.flush([]byte(s))
}

func (sw *snapWriter) rate(perSecond int64, r policy.Rate) {
	sw.uvarint(uint64(perSecond))
	if perSecond == 0 {
		sw.uvarint(uint64(r.Tokens))
		sw.uvarint(uint64(r.Per))
	}
}

func (sw *snapWriter) bands(s *policy.BandSet) {
	sw.uvarint(uint64(s.Len()))
	for _, b := range s.Bands() {
		sw.string(b.Name)
		sw.uvarint(uint64(b.Capacity))
		sw.uvarint(uint64(b.Refill.Tokens))
		sw.uvarint(uint64(b.Refill.Per))
	}
}

func (sw *snapWriter) bucket(key []byte, last int64, limit policy.LimitIndex, lv []policy.Level) {
	sw.buf = append(sw.buf, 1)
	sw.uvarint(uint64(len(key)))
	sw.flush(key)
	sw.varint(last)
	sw.uvarint(uint64(limit))
	for _, v := range lv {
		sw.uvarint(uint64(v.Tokens)) // two's complement for a debt
		sw.uvarint(v.Frac)
	}
	sw.flush(nil)
}

func (sw *snapWriter) end(count uint64) error {
	sw.buf = append(sw.buf, 0)
	sw.uvarint(count)
	sw.flush(nil)
	if sw.err == nil {
		sw.err = sw.bw.Flush()
	}
	if sw.err != nil {
		return sw.err
	}
	// The checksum goes straight to w: it covers everything before it.
	var sum [8]byte
	binary.LittleEndian.PutUint64(sum[:], sw.sum.Sum64())
	_, err := sw.w.Write(sum[:])
	return err
}
