package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// leasedStore is a suite factory of Redis stores with leases on, each on a
// prefix of its own.
func leasedStore(t *testing.T, p policy.Policy, clk clock.Clock) engine.Admitter {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	prefix := fmt.Sprintf("envoyrls-test:%d:%d:", time.Now().UnixNano(), prefixes.Add(1))
	deleteKeys(t, c, prefix) // after the store's Close (cleanups run last first), which gives leases back
	s, err := redisstore.New(context.Background(), redisstore.Config{
		Client: c, Prefix: prefix, Policy: p, Clock: clk, Leases: &redisstore.Leases{}, Timeout: answersTimeout,
	})
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestSuiteRedisLeased(t *testing.T) { rlstest.Run(t, leasedStore) }

// A limit large enough to be leased still admits exactly requests_per_unit
// on a fresh key, alone (Allow, decided from the lease) and beside another
// descriptor (AllowAll, decided by Redis).
func TestLeasedFreshKeyAdmitsExactlyTheLimit(t *testing.T) {
	h := rlstest.Start(t, leasedStore, `
domain: leased
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 1000
`)
	for _, req := range []*rlsv3.RateLimitRequest{
		rlstest.Req("leased", 0, rlstest.D("user=a")),
		rlstest.Req("leased", 0, rlstest.D("user=b"), rlstest.D("route=r")),
	} {
		n := 0
		for range 1100 {
			if h.Ask(req).OverallCode == rlsv3.RateLimitResponse_OK {
				n++
			}
		}
		if n != 1000 {
			t.Errorf("%v: %d of 1100 admitted, want exactly 1000", req.Descriptors, n)
		}
	}
	if st := h.A.(*redisstore.Store).Stats(); st.Local == 0 {
		t.Errorf("no decision came from a lease: %+v", st)
	}
}
