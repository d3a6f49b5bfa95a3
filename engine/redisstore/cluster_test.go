package redisstore_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
)

// clusterClient connects to the shared Redis Cluster redistest provides
// (or skips loudly), closed when the test ends.
func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestAdmissionCluster runs the behaviour suite on a Redis Cluster of three
// masters, every virtual shard in a slot of its own. The suite's AllowAll
// calls take keys without a shared hash tag, which a cluster refuses
// (ErrCrossShard, TestAllowAllCrossShard): its AllowAll tests run on a
// prefix of one virtual shard, where every key is co-located as a {tag}
// would put them.
func TestAdmissionCluster(t *testing.T) {
	c := clusterClient(t, redistest.ClusterAddrs(t))
	admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
		cfg := redisstore.Config{Client: c, Policy: s.Policy}
		if strings.Contains(t.Name(), "/AllowAll/") {
			cfg.VirtualShards = 1
		}
		return newStore(t, cfg, s.Clock)
	})
}
