package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
	"github.com/tokenshard/tokenshard/engine/envoyrls/rlstest"
)

// BenchmarkShouldRateLimit is one in-process request of one or three
// limited descriptors on the engine, every request admitted.
func BenchmarkShouldRateLimit(b *testing.B) {
	const y = "domain: b\ndescriptors:\n" +
		"  - {key: user, rate_limit: {unit: second, requests_per_unit: 1000000000}}\n" +
		"  - {key: route, value: /api, rate_limit: {unit: second, requests_per_unit: 1000000000}}\n" +
		"  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1000000000}}\n"
	c, err := envoyrls.ParseConfig([]byte(y))
	if err != nil {
		b.Fatal(err)
	}
	p, err := envoyrls.Policy(1, c)
	if err != nil {
		b.Fatal(err)
	}
	e, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	srv, err := envoyrls.NewServer(e, c)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		reqs := make([]*rlsv3.RateLimitRequest, 1000)
		for i := range reqs {
			descs := rlstest.D("user=" + strconv.Itoa(i))
			if n == 1 {
				reqs[i] = rlstest.Req("b", 0, descs)
			} else {
				reqs[i] = rlstest.Req("b", 0, descs, rlstest.D("route=/api"), rlstest.D("tenant="+strconv.Itoa(i%37)))
			}
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := srv.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
