package promstats_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/policy"
)

// Register a Collector and serve it with promhttp; each scrape reads the
// engine's Stats. The engine is closed before the scrape only so that its
// counts are final and the output exact: a live engine is scraped the same
// way.
func Example() {
	e, err := engine.New(engine.Config{
		Policy:  policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		MaxKeys: 1000,
		Clock:   clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	for range 3 {
		_, _ = e.Allow(context.Background(), "user:42", 1) // two allowed, then denied
	}
	_ = e.Close()

	c, err := promstats.New(e)
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	for sc := bufio.NewScanner(res.Body); sc.Scan(); {
		if line := sc.Text(); strings.HasPrefix(line, "tokenshard_decisions_total") || strings.HasPrefix(line, "tokenshard_keys") {
			fmt.Println(line)
		}
	}
	// Output:
	// tokenshard_decisions_total{outcome="allowed"} 2
	// tokenshard_decisions_total{outcome="denied"} 1
	// tokenshard_keys 1
	// tokenshard_keys_max 1000
}
