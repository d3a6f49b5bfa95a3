package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"time"

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

// Without engine/httplimit, a handler tells an outage from a limit by
// Decision.Degraded: the store's failure rule answered, not the key's
// bucket, so the refusal is the server's fault (503), not the client's
// (429). (It needs a Redis, so `go test` compiles it without running it.)
func ExampleStore_Allow() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, DialerRetries: 1})
	defer rdb.Close()
	store, err := redisstore.New(context.Background(), redisstore.Config{
		Client: rdb,
		Prefix: "api-limits:",
		Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		if key == "" {
			http.Error(w, "no API key", http.StatusUnauthorized)
			return
		}
		d, err := store.Allow(r.Context(), key, 1)
		switch {
		case err != nil: // a key too long, a closed store, the request's end
			http.Error(w, "rate limiter failed", http.StatusInternalServerError)
			return
		case !d.Allowed:
			secs := d.RetryAfter / time.Second // whole seconds, rounded up, at least 1
			if secs == 0 || d.RetryAfter%time.Second != 0 {
				secs++
			}
			w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
			if d.Degraded { // Redis unreachable, failing closed
				http.Error(w, "try again later", http.StatusServiceUnavailable)
			} else {
				http.Error(w, "slow down", http.StatusTooManyRequests)
			}
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// With Leases, each process takes tokens of a busy key from Redis in
// advance and decides the requests they cover in-process, without a round
// trip to Redis; the limit stays exact across processes, since every token
// admitted was first taken from the key's bucket. Close gives what is left
// back. (It needs a Redis, so `go test` compiles it without running it.)
func ExampleConfig_leases() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, DialerRetries: 1})
	defer rdb.Close()
	store, err := redisstore.New(ctx, redisstore.Config{
		Client: rdb,
		Prefix: "api-limits:",
		Policy: policy.Policy{Version: 1, Capacity: 10_000, TokensPerSecond: 1_000},
		Leases: &redisstore.Leases{}, // the defaults (see Leases)
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // gives every lease back

	admitted := 0
	for range 1_000 {
		if d, err := store.Allow(ctx, "tenant-42", 1); err == nil && d.Allowed {
			admitted++
		}
	}
	st := store.Stats()
	fmt.Printf("admitted %d, %d of the decisions without Redis\n", admitted, st.Local)
}
