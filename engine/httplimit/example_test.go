package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"

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
		if client == "" { // no client address (a Unix socket): refused, 500
			return "", httplimit.ErrNoClientIP
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

// A login route limited by two keys at once: the route's key for the
// client, 2 logins refilled at 1 a second, and the client's own key, 5
// requests at 1 a second, which every route spends. The function is given
// the client already found (here behind a load balancer) and grouped. A
// login the route's limit refuses spends nothing from the client's key, so
// a client locked out of /login keeps its budget for the rest of the API.
func ExampleWithKeys() {
	ov, err := policy.NewOverrideSet(policy.Override{Match: "login:*", Capacity: 2, TokensPerSecond: 1, Name: "login"})
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1, Overrides: ov},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	mw, err := httplimit.New(e,
		httplimit.WithPolicyName("client"),
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, netip.MustParsePrefix("10.0.0.0/8")),
		httplimit.WithKeys(func(r *http.Request, client string) ([]engine.Request, error) {
			if client == "" { // no client address (a Unix socket): refused, 500
				return nil, httplimit.ErrNoClientIP
			}
			if r.Pattern == "POST /login" {
				return []engine.Request{{Key: "login:" + client, Cost: 1}, {Key: client, Cost: 1}}, nil
			}
			return []engine.Request{{Key: client, Cost: 1}}, nil
		}))
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("POST /login", mw.Handler(ok)) // inside the mux: r.Pattern is set
	mux.Handle("GET /api/", mw.Handler(ok))

	for _, req := range []string{"POST /login", "POST /login", "POST /login", "GET /api/orders"} {
		method, path, _ := strings.Cut(req, " ")
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = "10.0.0.5:52000" // the load balancer
		r.Header.Set("X-Forwarded-For", "203.0.113.7")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		fmt.Println(req, rec.Code, rec.Header().Get("RateLimit"))
	}
	client, _ := e.Peek(context.Background(), "203.0.113.7")
	fmt.Println("203.0.113.7 has", client.Remaining, "left")
	// Output:
	// POST /login 200 "login";r=1;t=1
	// POST /login 200 "login";r=0;t=2
	// POST /login 429 "login";r=0;t=1
	// GET /api/orders 200 "client";r=2;t=3
	// 203.0.113.7 has 2 left
}

// Errors the middleware answers itself (a key it cannot derive, a full key
// table, a store it cannot reach) are given to the WithOnError function,
// here logged with log/slog; the package itself never logs. A limit's 429
// is not an error. The handler drops the time so the output is fixed; a
// server would use slog.Default() or its own Logger.
func ExampleWithOnError() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	mw, err := httplimit.New(e,
		httplimit.WithKey(func(r *http.Request) (string, error) {
			token := r.Header.Get("X-API-Token")
			if token == "" {
				return "", errors.New("no X-API-Token")
			}
			return token, nil
		}),
		httplimit.WithOnError(func(r *http.Request, err error) {
			logger.LogAttrs(r.Context(), slog.LevelWarn, "rate limit not applied",
				slog.String("path", r.URL.Path), slog.Any("err", err),
				slog.Bool("key", errors.Is(err, httplimit.ErrKeyFunc)))
		}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	for _, token := range []string{"t1", "t1", ""} {
		r := httptest.NewRequest(http.MethodGet, "/orders", nil)
		if token != "" {
			r.Header.Set("X-API-Token", token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(rec.Code)
	}
	// Output:
	// 200
	// 429
	// level=WARN msg="rate limit not applied" path=/orders err="httplimit: the key function failed: no X-API-Token" key=true
	// 500
}

// A candidate limit tried in shadow beside the enforced one: the enforced
// limit, "api", 4 requests at 1 a second, refuses; the candidate, 2 at 1 a
// second on an engine of its own, is decided and spends as if enforced,
// its items follow the enforced ones in the fields, and Stats counts what
// it would have refused, but it refuses nothing. The shadow middleware is
// inside the enforcing one, so it decides what the enforced limit admits.
func ExampleWithShadow() {
	enforced, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 4, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	defer enforced.Close()
	candidate, _ := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	defer candidate.Close()

	enforcing, err := httplimit.New(enforced, httplimit.WithPolicyName("api"))
	if err != nil {
		panic(err)
	}
	shadow, err := httplimit.New(candidate, httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	if err != nil {
		panic(err)
	}
	h := enforcing.Handler(shadow.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))

	for range 5 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	fmt.Printf("%+v\n", shadow.Stats())
	// Output:
	// 200 "api";r=3;t=1, "candidate";r=1;t=1
	// 200 "api";r=2;t=2, "candidate";r=0;t=2
	// 200 "api";r=1;t=3, "candidate";r=0;t=1
	// 200 "api";r=0;t=4, "candidate";r=0;t=1
	// 429 "api";r=0;t=1
	// {Decided:4 Refused:2 Degraded:0 Errors:0}
}

// A JSON API answers a limit's denial in JSON: the function sets the
// Content-Type, then writes the status, then the body. It must write the
// status itself; a body written without it goes out as 200. The header
// fields are already on w when it is called, so the RateLimit fields and
// Retry-After go out with its answer unchanged.
func ExampleWithDenied() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 1, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	mw, err := httplimit.New(e, httplimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, d engine.Decision) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"error":       "rate_limited",
			"retry_after": w.Header().Get("Retry-After"),
		})
	}))
	if err != nil {
		panic(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "{}\n")
	}))

	for range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/orders", nil))
		fmt.Print(rec.Code, " ", rec.Header().Get("RateLimit"), " ", rec.Body.String())
		if rec.Code == http.StatusTooManyRequests {
			fmt.Println(rec.Header().Get("Content-Type"), "Retry-After:", rec.Header().Get("Retry-After"))
		}
	}
	// Output:
	// 200 "default";r=0;t=1 {}
	// 429 "default";r=0;t=1 {"error":"rate_limited","retry_after":"1"}
	// application/json Retry-After: 1
}
