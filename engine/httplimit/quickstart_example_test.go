package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// The code a service writes first: an engine on the real clock, the
// middleware in front of its routes, one bucket per client IP. Each client
// may burst 3 requests, then 10 a minute; the fourth request in a burst is
// answered 429 with Retry-After and the RateLimit fields. A server passes
// mw.Handler(mux) to http.ListenAndServe; this one is httptest's, so the
// example runs.
func Example_quickstart() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 3, Refill: policy.PerMinute(10)},
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	mw, err := httplimit.New(e) // behind a proxy: httplimit.WithTrustedProxies
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	srv := httptest.NewServer(mw.Handler(mux)) // http.ListenAndServe(":8080", mw.Handler(mux))
	defer srv.Close()
	for range 4 {
		resp, err := http.Get(srv.URL + "/hello")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%d Retry-After: %q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// Output:
	// 200 Retry-After: ""
	// 200 Retry-After: ""
	// 200 Retry-After: ""
	// 429 Retry-After: "6"
}
