package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// Every client IP gets a bucket of 2 requests refilled at 1 per second. The
// Manual clock and the recorder make the output deterministic; a server
// leaves Clock nil and passes mw.Handler(mux) to http.Server.
func ExampleNew() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello\n")
	})
	mw, err := httplimit.New(e) // key: the client IP; no forwarded header is trusted
	if err != nil {
		panic(err)
	}
	h := mw.Handler(mux)

	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/hello", nil)) // from 192.0.2.1
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Println("Retry-After:", ra)
		}
	}
	d, _ := e.Peek(context.Background(), "192.0.2.1") // the key is the client IP
	fmt.Println(e.KeyCount(), d.Remaining)
	// Output:
	// 200 "default";r=1;t=1
	// 200 "default";r=0;t=2
	// 429 "default";r=0;t=1
	// Retry-After: 1
	// 1 0
}

// Behind a load balancer, name it and the header it writes: the client is
// the right-most address the trusted proxies report, so the address a
// client forged in front of its own is never used.
func ExampleWithTrustedProxies() {
	e, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	defer e.Close()

	lb := netip.MustParsePrefix("10.0.0.0/8")
	mw, err := httplimit.New(e, httplimit.WithTrustedProxies(httplimit.XForwardedFor, lb))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.NotFoundHandler())

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.5:52000"                         // the load balancer
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.7") // forged, then real
	h.ServeHTTP(httptest.NewRecorder(), r)

	ip, _ := httplimit.ClientIP(r, httplimit.XForwardedFor, []netip.Prefix{lb})
	d, _ := e.Peek(r.Context(), "203.0.113.7")
	fmt.Println(ip, d.Remaining)
	// Output:
	// 203.0.113.7 9
}

// Expensive routes can cost more than one token; the fields then count
// tokens, not requests.
func ExampleWithCost() {
	e, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 2},
		Clock:  clock.NewManual(0),
	})
	defer e.Close()

	mw, _ := httplimit.New(e,
		httplimit.WithPolicyName("api"),
		httplimit.WithCost(func(r *http.Request) int64 {
			if r.URL.Path == "/export" {
				return 5
			}
			return 1
		}))
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	for _, path := range []string{"/export", "/export", "/search", "/export"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
	}
	// Output:
	// /export 200 "api";q=10;w=5 "api";r=5;t=3
	// /export 200 "api";q=10;w=5 "api";r=0;t=5
	// /search 429 "api";q=10;w=5 "api";r=0;t=1
	// /export 429 "api";q=10;w=5 "api";r=0;t=3
}
