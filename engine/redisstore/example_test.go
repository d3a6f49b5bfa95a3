package redisstore_test

import (
	"context"
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// Every replica of a service builds the same store on the same Redis: they
// share one bucket per client, so the limit holds for the whole fleet. (It
// needs a Redis, so `go test` compiles this example without running it.)
func ExampleNew() {
	ctx := context.Background()
	// DialerRetries 1: while Redis is down, answer by the failure rule at
	// once, not after go-redis's five dials 100 ms apart (see Failures).
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, DialerRetries: 1})
	defer rdb.Close()
	store, err := redisstore.New(ctx, redisstore.Config{
		Client: rdb,
		Prefix: "api-limits:",
		Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10},
		// FailOpen: true would admit while Redis is unreachable.
		OnError: func(err error) { log.Printf("rate limiter degraded: %v", err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	mw, err := httplimit.New(store) // the same middleware as for the in-process engine
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	log.Fatal(http.ListenAndServe(":8080", mw.Handler(mux)))
}
