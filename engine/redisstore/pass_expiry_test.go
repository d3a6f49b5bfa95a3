package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestPassExpiryAfterConcurrentAllow: EvictFull reads the server's TIME
// (T0), then a request on another store spends from a bucket 30 ms later,
// then the pass reaches that bucket. The pass must not give it an expiry
// before it is full (as counting from T0 would), or the bucket would be
// dropped early and a burst admitted that the exact rule denies.
func TestPassExpiryAfterConcurrentAllow(t *testing.T) {
	addr := redisAddr(t)
	p := prefix(t)
	cfg := redisstore.Config{Prefix: p, Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 100}, Timeout: 10 * time.Second}
	stores := realStores(t, addr, 1, cfg)
	user := stores[0]
	c := client(t, addr)
	// The first decide call of the evictor (its pass, after it read the
	// server's TIME) waits for release.
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ec := client(t, addr)
	ec.AddHook(decideHook(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
		once.Do(func() { close(reached); <-release })
		return next(ctx, cmds)
	}))
	cfg.Client = ec
	evictor, err := redisstore.New(context.Background(), cfg)
	require.NoError(t, err)
	ctx := context.Background()

	_, err = user.Allow(ctx, "k", 10) // the bucket exists, empty
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := evictor.EvictFull(ctx); done <- err }()
	<-reached // TIME read, the pass about to run
	t0 := serverTime(t, c)
	for serverTime(t, c).Sub(t0) < 30*time.Millisecond {
		// the server's clock is the one that matters: poll it, 30 ms on
	}
	d, err := user.Allow(ctx, "k", 1) // at least 3 tokens refilled
	require.NoError(t, err)
	require.True(t, d.Allowed)
	readBucket(t, c, redisstore.BucketKey(p, "k")).checkExpiry(t, "after the Allow")
	close(release)
	require.NoError(t, <-done)
	b := readBucket(t, c, redisstore.BucketKey(p, "k"))
	b.checkExpiry(t, "after the pass")
}

// serverTime is the Redis server's clock, the one the script reads.
func serverTime(t *testing.T, c *redis.Client) time.Time {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return tm
}
