package engine

import (
	"fmt"
	"runtime"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultMaxKeys is the key bound when Config.MaxKeys is 0.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxKeyBytes is the key length bound when Config.MaxKeyBytes is 0.
	DefaultMaxKeyBytes = 256
	// DefaultEventEvery is the sampling period of Config.Events when
	// Config.EventEvery is 0.
	DefaultEventEvery = 1000
	// DefaultEventBuffer is the event buffer when Config.EventBuffer is 0.
	DefaultEventBuffer = 1024
)

// mailboxSize is how many single requests, and separately how many batch
// parts, may wait for one shard; a caller that finds it full blocks until
// there is room, its context ends or the engine closes. A single request
// counts until the shard has served the group it was taken with.
const mailboxSize = 1024

// Config configures New. The zero value of every field but Policy has a
// documented default; Policy must be valid. A Config is a plain value: New
// copies it.
type Config struct {
	// Policy is the limit every key starts under. Required.
	Policy policy.Policy
	// MaxKeys bounds the keys tracked by all shards together; 0 means
	// DefaultMaxKeys (1<<20). Memory is allocated as keys arrive, not up
	// front, so a large bound costs nothing until it is used.
	MaxKeys int
	// Shards is the number of shard goroutines; 0 means GOMAXPROCS. Any
	// positive count up to 65536 is used as given. Each shard's mailbox
	// holds up to 1024 single requests and, apart from them, 1024 batch
	// parts; a caller that finds it full blocks until there is room, its
	// context ends or the engine closes. New allocates about 22 KiB per
	// shard on 64-bit platforms (1.4 GiB at 65536) and 12 KiB on 32-bit
	// ones, most of it for the mailbox, and nothing in proportion to MaxKeys.
	Shards int
	// Clock is the time source; nil means clock.NewMonotonic().
	Clock clock.Clock
	// MaxKeyBytes bounds len(key) in bytes; 0 means DefaultMaxKeyBytes (256).
	// A key of exactly MaxKeyBytes is valid. Worst-case key memory is
	// MaxKeys x MaxKeyBytes.
	MaxKeyBytes int
	// SweepEvery is the period of the background sweep, which evicts full
	// buckets as EvictFull does (and never any other). With a sweeper
	// running, a new key that finds MaxKeys keys tracked also triggers a
	// pressure sweep, at most one at a time and spaced as PressureSweepGap
	// says, so a full key table recovers by itself once buckets refill;
	// ReclaimAfter estimates when.
	//
	// 0 means the default: with the real clock (Clock nil, or a
	// *clock.Monotonic) a sweep every DefaultSweepEvery plus pressure
	// sweeps; with any other clock (clock.Manual, a clock of your own) no
	// background sweep at all, so tests stay deterministic. A positive
	// period runs both on any clock; a negative one turns background sweeps
	// off. A period you set is measured in real time; the default one on
	// Clock, noticed as requests are decided (see DefaultSweepEvery); the
	// spacing of pressure sweeps on Clock.
	SweepEvery time.Duration

	// Events, if set, is called with one decision in every EventEvery,
	// sampled by the shards, as an audit trail: from one goroutine of the
	// engine, one event at a time, through a buffer of EventBuffer events.
	// Each shard counts its own decisions and samples every EventEvery-th:
	// those of Allow (Wait's included), Charge and AllowBatch's requests,
	// and the errors the shard answers them with (ErrCostExceedsCapacity,
	// ErrClockRegression, ErrKeyCapacity). Nothing else is sampled: not
	// Peek or Refund, not AllowAll's decisions (Stats counts them), not the
	// errors raised before a request reaches a shard (a bad key or cost, a
	// done context, ErrClosed).
	//
	// Admission never waits for it: when the buffer is full the event is
	// dropped and counted in Stats. Close delivers what is still buffered
	// (up to EventBuffer calls) before it returns, so f must not block for
	// long; it must not call Close. It may call the engine's other methods.
	// A panic in f is not recovered: it ends the program.
	Events func(Event)
	// EventEvery is the sampling period; 0 means DefaultEventEvery.
	EventEvery int
	// EventBuffer is how many sampled events may wait for Events; 0 means
	// DefaultEventBuffer. At most 1<<24. With Events set, New allocates the
	// buffer whole: 112 bytes an event on 64-bit platforms (1.75 GiB at
	// 1<<24) and 84 on 32-bit ones.
	EventBuffer int
}

// Event is one sampled decision (Config.Events): the request, its answer
// (Decision.Version is the policy's), the shard that decided it and that
// shard's clock reading.
type Event struct {
	Key      string
	Cost     int64
	Decision Decision
	Err      error
	Shard    int
	Reading  int64
}

// The bounds of Config.Shards and Config.EventBuffer: far above any use,
// and below what make refuses (a panic, where New promises an error).
const (
	maxShards      = 1 << 16
	maxEventBuffer = 1 << 24
)

// errNoPolicy is New's error for a Config without a Policy: Validate's
// "version 0" would send the reader looking for a version they never set.
var errNoPolicy = fmt.Errorf("%w: Config.Policy is not set, and it is required", ErrInvalidPolicy)

// withDefaults validates c and fills its defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Policy == (policy.Policy{}) {
		return c, errNoPolicy
	}
	if err := c.Policy.Validate(); err != nil {
		return c, err
	}
	switch {
	case c.MaxKeys < 0:
		return c, fmt.Errorf("%w: MaxKeys %d is negative", ErrInvalidConfig, c.MaxKeys)
	case c.Shards < 0 || c.Shards > maxShards:
		return c, fmt.Errorf("%w: Shards %d is not in [0, %d]", ErrInvalidConfig, c.Shards, maxShards)
	case c.MaxKeyBytes < 0:
		return c, fmt.Errorf("%w: MaxKeyBytes %d is negative", ErrInvalidConfig, c.MaxKeyBytes)
	case c.EventEvery < 0:
		return c, fmt.Errorf("%w: EventEvery %d is negative", ErrInvalidConfig, c.EventEvery)
	case c.EventBuffer < 0 || c.EventBuffer > maxEventBuffer:
		return c, fmt.Errorf("%w: EventBuffer %d is not in [0, %d]", ErrInvalidConfig, c.EventBuffer, maxEventBuffer)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.Shards == 0 {
		c.Shards = runtime.GOMAXPROCS(0)
	}
	if c.Clock == nil {
		c.Clock = clock.NewMonotonic()
	}
	if c.MaxKeyBytes == 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if c.EventEvery == 0 {
		c.EventEvery = DefaultEventEvery
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = DefaultEventBuffer
	}
	return c, nil
}
