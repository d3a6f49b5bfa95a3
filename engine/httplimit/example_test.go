package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/expvarstats"
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

// A per-route limit: every client gets 2 requests on each route, refilled
// at 1 a second. The key is the route's pattern, never the raw path, so
// /users/42 and /users/43 spend from one budget: wrapping each route's
// handler inside the ServeMux gives the key function r.Pattern. (With the
// middleware outside the mux, `_, pattern := mux.Handler(r)` finds it.)
// The key function is given the client already found (through
// WithTrustedProxies, when given) and grouped: an IPv6 client is its /64,
// however many addresses it uses.
func ExampleWithClientKey() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	mw, err := httplimit.New(e, httplimit.WithClientKey(func(r *http.Request, client string) (string, error) {
		if r.Pattern == "" {
			return "", errors.New("not routed by a ServeMux")
		}
		return r.Pattern + " " + client, nil
	}))
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", mw.Handler(ok))
	mux.Handle("GET /search", mw.Handler(ok))

	for _, req := range []struct{ path, from string }{
		{"/users/42", "192.0.2.1:1234"},
		{"/users/43", "192.0.2.1:1234"},
		{"/users/44", "192.0.2.1:1234"}, // the route's bucket is empty, whatever the id
		{"/search", "192.0.2.1:1234"},   // another route, another bucket
		{"/search", "[2001:db8:1:2::a]:443"},
		{"/search", "[2001:db8:1:2::b]:443"},
		{"/search", "[2001:db8:1:2:ffff::1]:443"}, // the same /64, the same client
	} {
		r := httptest.NewRequest(http.MethodGet, req.path, nil)
		r.RemoteAddr = req.from
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		fmt.Println(req.path, req.from, rec.Code)
	}
	d, _ := e.Peek(context.Background(), "GET /search 2001:db8:1:2::/64")
	fmt.Println(e.KeyCount(), "keys;", d.Remaining, "left on GET /search for 2001:db8:1:2::/64")
	// Output:
	// /users/42 192.0.2.1:1234 200
	// /users/43 192.0.2.1:1234 200
	// /users/44 192.0.2.1:1234 429
	// /search 192.0.2.1:1234 200
	// /search [2001:db8:1:2::a]:443 200
	// /search [2001:db8:1:2::b]:443 200
	// /search [2001:db8:1:2:ffff::1]:443 429
	// 3 keys; 0 left on GET /search for 2001:db8:1:2::/64
}

// Only the API is limited: /debug/vars, where expvar serves the engine's
// Stats, is on the outer mux, beside mw.Handler rather than behind it, so
// monitoring is never refused and spends no client's tokens.
func ExampleMiddleware_Handler() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	if err := expvarstats.Publish("ratelimit", e); err != nil { // expvar names are process-wide
		panic(err)
	}
	mw, err := httplimit.New(e)
	if err != nil {
		panic(err)
	}

	api := http.NewServeMux()
	api.HandleFunc("GET /api/hello", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello\n")
	})
	root := http.NewServeMux()
	root.Handle("GET /debug/vars", expvar.Handler()) // outside the limiter
	root.Handle("/", mw.Handler(api))

	for _, path := range []string{"/api/hello", "/api/hello", "/debug/vars", "/debug/vars"} {
		rec := httptest.NewRecorder()
		root.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Printf("%s %d %q\n", path, rec.Code, rec.Header().Get("RateLimit"))
		if path == "/debug/vars" {
			var vars map[string]json.RawMessage
			_ = json.Unmarshal(rec.Body.Bytes(), &vars)
			fmt.Println("ratelimit published:", vars["ratelimit"] != nil)
		}
	}
	// Output:
	// /api/hello 200 "\"default\";r=0;t=1"
	// /api/hello 429 "\"default\";r=0;t=1"
	// /debug/vars 200 ""
	// ratelimit published: true
	// /debug/vars 200 ""
	// ratelimit published: true
}

// One request limited by three keys: its user (3 requests, 1 a second),
// its tenant (4, 1 a second) and the whole service (100, 50 a second),
// admitted only if all three hold a token and then paid from each. The
// overrides' names say in the fields which quota bound: the tenant's
// fourth request empties it, so the fifth is refused by "tenant" and
// neither erin nor the global bucket pays for it.
func ExampleWithKeys() {
	ov, err := policy.NewOverrideSet(
		policy.Override{Match: "tenant:*", Capacity: 4, TokensPerSecond: 1, Name: "tenant"},
		policy.Override{Match: "global", Capacity: 100, TokensPerSecond: 50, Name: "global"},
	)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Overrides: ov},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	mw, err := httplimit.New(e,
		httplimit.WithPolicyName("user"),
		httplimit.WithKeys(func(r *http.Request, _ string) ([]engine.Request, error) {
			user, tenant := r.Header.Get("X-User"), r.Header.Get("X-Tenant")
			if user == "" || tenant == "" {
				return nil, errors.New("no user or tenant")
			}
			return []engine.Request{
				{Key: "user:" + user, Cost: 1},
				{Key: "tenant:" + tenant, Cost: 1},
				{Key: "global", Cost: 1},
			}, nil
		}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	for _, who := range [][2]string{{"alice", "acme"}, {"bob", "acme"}, {"carol", "acme"}, {"dave", "acme"}, {"erin", "acme"}, {"alice", "zeta"}} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", who[0])
		r.Header.Set("X-Tenant", who[1])
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(who[0], who[1], rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
	}
	erin, _ := e.Peek(context.Background(), "user:erin")
	global, _ := e.Peek(context.Background(), "global")
	fmt.Println("erin", erin.Remaining, "global", global.Remaining)
	// Output:
	// alice acme 200 "user";q=3;w=3 "user";r=2;t=1
	// bob acme 200 "user";q=3;w=3 "user";r=2;t=1
	// carol acme 200 "tenant";q=4;w=4 "tenant";r=1;t=3
	// dave acme 200 "tenant";q=4;w=4 "tenant";r=0;t=4
	// erin acme 429 "tenant";q=4;w=4 "tenant";r=0;t=1
	// alice zeta 200 "user";q=3;w=3 "user";r=1;t=2
	// erin 3 global 95
}
