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

// With leases, a request whose descriptors name two buckets is decided by
// Redis without the tokens the replica's leases hold, as envoyrls's and
// -leases's docs say: once Redis's bucket for user=a is spent by such
// requests, they are refused, while a request naming user=a alone is still
// admitted from the lease. The clock stands still: nothing refills.
func TestLeasedSeveralBucketsGoToRedisWithoutTheLease(t *testing.T) {
	h := rlstest.Start(t, leasedStore, `
domain: leased
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 1000
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 100000
`)
	s := h.A.(*redisstore.Store)
	one := rlstest.Req("leased", 0, rlstest.D("user=a"))
	two := rlstest.Req("leased", 0, rlstest.D("user=a"), rlstest.D("route=r"))
	for i := 0; s.Stats().Local < 2; i++ { // a lease on user=a, which has decided a request
		if i == 1000 {
			t.Fatalf("no lease on user=a: %+v", s.Stats())
		}
		if code := h.Ask(one).OverallCode; code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a request of user=a alone: %v", code)
		}
	}
	local := s.Stats().Local
	refused := false
	for range 1000 {
		if h.Ask(two).OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			refused = true
			break
		}
	}
	if !refused {
		t.Fatal("1000 requests of two buckets were all admitted")
	}
	if st := s.Stats(); st.Local != local {
		t.Fatalf("a lease decided a request of two buckets: %+v", st)
	}
	if code := h.Ask(one).OverallCode; code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("user=a alone, after a request of two buckets was refused: %v, want OK from the lease", code)
	}
	if st := s.Stats(); st.Local != local+1 {
		t.Fatalf("user=a alone was not decided by the lease: %+v", st)
	}
}
