package engine

import (
	"fmt"
	"runtime"
	"time"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/policy"
)

// Defaults applied by New to zero Config fields, and fixed sizes.
const (
	// DefaultMaxKeys is the key bound when Config.MaxKeys is 0.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxKeyBytes is the key length bound when Config.MaxKeyBytes is 0.
	DefaultMaxKeyBytes = 256
	// MailboxSize is how many single requests, and separately how many batch
	// parts, may wait for one shard; a caller that finds it full blocks until
	// there is room, its context ends or the engine closes.
	MailboxSize = 1024
)

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
	// positive count is used as given.
	Shards int
	// Clock is the time source; nil means clock.NewMonotonic().
	Clock clock.Clock
	// MaxKeyBytes bounds len(key) in bytes; 0 means DefaultMaxKeyBytes (256).
	// A key of exactly MaxKeyBytes is valid. Worst-case key memory is
	// MaxKeys x MaxKeyBytes.
	MaxKeyBytes int
	// SweepEvery runs EvictFull in the background at this period; 0 means
	// never. The period is measured in real time, not by Clock.
	SweepEvery time.Duration
}

// withDefaults validates c and fills its defaults.
func (c Config) withDefaults() (Config, error) {
	if err := c.Policy.Validate(); err != nil {
		return c, err
	}
	switch {
	case c.MaxKeys < 0:
		return c, fmt.Errorf("%w: MaxKeys %d is negative", ErrInvalidConfig, c.MaxKeys)
	case c.Shards < 0:
		return c, fmt.Errorf("%w: Shards %d is negative", ErrInvalidConfig, c.Shards)
	case c.MaxKeyBytes < 0:
		return c, fmt.Errorf("%w: MaxKeyBytes %d is negative", ErrInvalidConfig, c.MaxKeyBytes)
	case c.SweepEvery < 0:
		return c, fmt.Errorf("%w: SweepEvery %v is negative", ErrInvalidConfig, c.SweepEvery)
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
	return c, nil
}
