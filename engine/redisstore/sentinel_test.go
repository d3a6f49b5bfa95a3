package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestSentinelFailover runs the store behind Redis Sentinel, through
// redis.NewFailoverClient, across a failover (SENTINEL FAILOVER) under
// load: every call is answered with a nil error (those on the connections
// the switch closes by the failure rule, marked Degraded); a key drained
// before, and replicated, stays drained on the new primary; and decisions
// come from the new primary within a few seconds of the switch.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // waits on a failover; on servers of its own
	const capacity = 5
	rs := redistest.StartSentinel(t)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster,
		SentinelAddrs: []string{rs.Addr()}, ContextTimeoutEnabled: true, DialerRetries: 1,
		ReadTimeout: time.Second, DialTimeout: time.Second}) // a hung sentinel costs a call no more (see the package doc)
	t.Cleanup(func() { _ = fc.Close() })
	ctx := context.Background()
	cfg := redisstore.Config{Client: fc, Prefix: prefix(t), Timeout: slowMachine,
		Policy: policy.Policy{Version: 1, Capacity: capacity, Refill: policy.PerHour(1)}}
	if leaseMode {
		cfg.Leases = &redisstore.Leases{}
	}
	s, err := redisstore.New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	d, err := s.Allow(ctx, "drained", capacity)
	require.NoError(t, err)
	require.True(t, d.Allowed && !d.Degraded, "%+v", d)
	require.Equal(t, int64(1), fc.Do(ctx, "WAIT", 1, 10_000).Val(), "the replica holds the drained bucket")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // before the store's Close, after a failure's stop
	halt := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(halt)
	for w := range 2 { // calls in flight at the switch
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.Allow(ctx, fmt.Sprint("busy", w, i%4), 1)
				if !assert.NoError(t, err, "a failover is answered by the failure rule, never an error") {
					return
				}
			}
		})
	}
	from, to := rs.Failover(t)
	switched := time.Now()
	onNew := client(t, to)
	for i := 0; ; i++ { // a fresh key each time: a decision the old primary took is lost
		key := fmt.Sprint("probe", i)
		d, err := s.Allow(ctx, key, 1)
		require.NoError(t, err)
		n, err := onNew.Exists(ctx, redisstore.BucketKey(cfg.Prefix, key)).Result()
		require.NoError(t, err)
		if !d.Degraded && n == 1 {
			require.True(t, d.Allowed, "a new key's first token")
			break
		}
		require.Less(t, time.Since(switched), 10*time.Second, "no decision from the new primary %s", to)
	}
	t.Logf("failed over from %s to %s; decided on the new primary %v after the switch", from, to, time.Since(switched))
	halt()
	wg.Wait()
	d, err = s.Allow(ctx, "drained", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed || d.Degraded, "the key drained before the failover, %+v", d)
}
