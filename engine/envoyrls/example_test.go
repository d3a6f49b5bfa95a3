package envoyrls_test

import (
	"context"
	"fmt"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/envoyrls"
)

// A server on the engine for one domain: each user may make 2 requests a
// minute, and a third is refused. Register srv with
// rlsv3.RegisterRateLimitServiceServer to serve it to Envoy.
func ExampleNewServer() {
	cfg, err := envoyrls.ParseConfig([]byte(`
domain: gateway
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		panic(err)
	}
	p, err := envoyrls.Policy(1, cfg)
	if err != nil {
		panic(err)
	}
	eng, err := engine.New(engine.Config{Policy: p, Clock: clock.NewManual(0)})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	srv, err := envoyrls.NewServer(eng, cfg)
	if err != nil {
		panic(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "gateway", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
	}}
	for range 3 {
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		st := resp.GetStatuses()[0]
		fmt.Println(resp.GetOverallCode(), st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
	}
	// Output:
	// OK 1 30s
	// OK 0 1m0s
	// OVER_LIMIT 0 1m0s
}
