package expvarstats_test

import (
	"expvar"
	"fmt"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/expvarstats"
	"github.com/tokenshard/tokenshard/policy"
)

// Publish an engine's Stats as "ratelimit" in /debug/vars, which any server
// serving http.DefaultServeMux (or expvar.Handler) answers.
func Example() {
	e, err := engine.New(engine.Config{Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10}})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	if err := expvarstats.Publish("ratelimit", e); err != nil { // expvar names are process-wide
		panic(err)
	}
	fmt.Println(expvar.Get("ratelimit") != nil)
	// Output: true
}
