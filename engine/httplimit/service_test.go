package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// loopbackProxies holds the peer of every request a test server's client sends.
var loopbackProxies = []netip.Prefix{mustPrefix("127.0.0.0/8"), mustPrefix("::1/128")}

// A login route limited by two keys at once, the route's and the client's,
// through a real server behind a trusted proxy: the WithKeys function is
// given the client from X-Forwarded-For, grouped, and the route's pattern;
// a login the route's key refuses spends nothing from the client's.
func TestWithKeysClientBehindProxy(t *testing.T) {
	ov, err := policy.NewOverrideSet(policy.Override{Match: "login:*", Capacity: 2, TokensPerSecond: 1, Name: "login"})
	require.NoError(t, err)
	e, _ := newEngine(t, engine.Config{Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1, Overrides: ov}})
	var mu sync.Mutex
	var clients []string
	mw, err := httplimit.New(e,
		httplimit.WithTrustedProxies(httplimit.XForwardedFor, loopbackProxies...),
		httplimit.WithKeys(func(r *http.Request, client string) ([]engine.Request, error) {
			mu.Lock()
			clients = append(clients, client)
			mu.Unlock()
			if r.Pattern == "POST /login" {
				return []engine.Request{{Key: "login:" + client, Cost: 1}, {Key: client, Cost: 1}}, nil
			}
			return []engine.Request{{Key: client, Cost: 1}}, nil
		}))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /login", mw.Handler(ok))
	mux.Handle("GET /", mw.Handler(ok))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	send := func(method, path, xff string) *http.Response {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("X-Forwarded-For", xff)
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		return res
	}
	var got []string
	for _, c := range []struct{ method, path, xff string }{
		{"POST", "/login", "6.6.6.6, 203.0.113.7"}, // forged left of the client
		{"POST", "/login", "203.0.113.7"},
		{"POST", "/login", "203.0.113.7"}, // the login key is empty
		{"GET", "/", "203.0.113.7"},
		{"POST", "/login", "2001:db8:1:2::a"},
	} {
		res := send(c.method, c.path, c.xff)
		got = append(got, fmt.Sprint(c.method, " ", res.StatusCode, " ", res.Header.Get("RateLimit")))
	}
	assert.Equal(t, []string{
		`POST 200 "login";r=1;t=1`,
		`POST 200 "login";r=0;t=2`,
		`POST 429 "login";r=0;t=1`,
		`GET 200 "default";r=2;t=3`, // the refused login spent none of the client's 5
		`POST 200 "login";r=1;t=1`,
	}, got)
	assert.Equal(t, []string{"203.0.113.7", "203.0.113.7", "203.0.113.7", "203.0.113.7", "2001:db8:1:2::/64"}, clients)
	assert.Equal(t, int64(0), remaining(t, e, "login:203.0.113.7"))
	assert.Equal(t, int64(2), remaining(t, e, "203.0.113.7"))
	assert.Equal(t, int64(4), remaining(t, e, "2001:db8:1:2::/64"))
}

// Under WithKeys, the function is called for a request whose client
// cannot be found, with client "", as under WithClientKey: it decides the
// request's keys (here none, answered with 500).
func TestWithKeysNoClientIP(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	var clients []string
	mw, err := httplimit.New(e, httplimit.WithKeys(func(_ *http.Request, client string) ([]engine.Request, error) {
		clients = append(clients, client)
		return nil, nil
	}))
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "@"
	rec := httptest.NewRecorder()
	mw.Handler(ok).ServeHTTP(rec, r)
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Equal(t, []string{""}, clients)
}

// errorCase is one request the middleware cannot answer with a decision.
type errorCase struct {
	name string
	a    func(t *testing.T) engine.Admitter // nil: a fresh engine, capacity 5, one key
	opts []httplimit.Option
	req  func(r *http.Request) *http.Request // nil: as is
	code int
	is   []error // what the error given to OnError wraps
}

// errorCases is every class of error, under Allow and under AllowAll.
func errorCases() []errorCase {
	failing := errors.New("no user")
	keyFails := httplimit.WithKey(func(*http.Request) (string, error) { return "", failing })
	keysFail := httplimit.WithKeys(func(*http.Request, string) ([]engine.Request, error) { return nil, failing })
	keys := func(reqs ...engine.Request) httplimit.Option {
		return httplimit.WithKeys(func(*http.Request, string) ([]engine.Request, error) { return reqs, nil })
	}
	closed := func(t *testing.T) engine.Admitter {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
		require.NoError(t, e.Close())
		return e
	}
	full := func(t *testing.T) engine.Admitter {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
		_, err := e.Allow(t.Context(), "someone else", 1)
		require.NoError(t, err)
		return e
	}
	degradedDenial := func(*testing.T) engine.Admitter {
		return degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 10}}
	}
	badIndexed := func(t *testing.T) engine.Admitter {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
		return badIndex{e}
	}
	noIP := func(r *http.Request) *http.Request { r.RemoteAddr = "@"; return r }
	canceled := func(r *http.Request) *http.Request {
		ctx, cancel := context.WithCancel(r.Context())
		cancel()
		return r.WithContext(ctx)
	}
	return []errorCase{
		{"WithKey fails", nil, []httplimit.Option{keyFails}, nil, 500, []error{httplimit.ErrKeyFunc, failing}},
		{"WithClientKey fails", nil, []httplimit.Option{httplimit.WithClientKey(func(*http.Request, string) (string, error) { return "", failing })}, nil, 500, []error{httplimit.ErrKeyFunc, failing}},
		{"WithKeys fails", nil, []httplimit.Option{keysFail}, nil, 500, []error{httplimit.ErrKeyFunc, failing}},
		{"no client IP", nil, nil, noIP, 500, []error{httplimit.ErrNoClientIP}},
		{"no client IP, WithKeys refuses it", nil, []httplimit.Option{httplimit.WithKeys(func(_ *http.Request, client string) ([]engine.Request, error) {
			if client == "" {
				return nil, httplimit.ErrNoClientIP
			}
			return []engine.Request{{Key: client, Cost: 1}}, nil
		})}, noIP, 500, []error{httplimit.ErrKeyFunc, httplimit.ErrNoClientIP}},
		{"no client IP, WithKeys keys by it", nil, []httplimit.Option{httplimit.WithKeys(func(_ *http.Request, client string) ([]engine.Request, error) {
			return []engine.Request{{Key: client, Cost: 1}}, nil
		})}, noIP, 500, []error{engine.ErrInvalidKey}},
		{"blank key", nil, []httplimit.Option{httplimit.WithKey(func(*http.Request) (string, error) { return "", nil })}, nil, 500, []error{engine.ErrInvalidKey}},
		{"cost below 1", nil, []httplimit.Option{httplimit.WithCost(func(*http.Request) int64 { return 0 })}, nil, 500, []error{httplimit.ErrCostBelowOne}},
		{"cost below 1, WithKeys", nil, []httplimit.Option{keys(engine.Request{Key: "a", Cost: 0})}, nil, 500, []error{httplimit.ErrCostBelowOne, engine.ErrInvalidCost}},
		{"no requests", nil, []httplimit.Option{keys()}, nil, 500, []error{engine.ErrAllowAllSize}},
		{"cost above capacity", nil, []httplimit.Option{httplimit.WithCost(func(*http.Request) int64 { return 6 })}, nil, 413, []error{engine.ErrCostExceedsCapacity}},
		{"cost above capacity, WithKeys", nil, []httplimit.Option{keys(engine.Request{Key: "a", Cost: 3}, engine.Request{Key: "a", Cost: 3})}, nil, 413, []error{engine.ErrCostExceedsCapacity}},
		{"key table full", full, nil, nil, 503, []error{engine.ErrKeyCapacity}},
		{"engine closed", closed, nil, nil, 503, []error{engine.ErrClosed}},
		{"engine closed, WithKeys", closed, []httplimit.Option{keys(engine.Request{Key: "a", Cost: 1})}, nil, 503, []error{engine.ErrClosed}},
		{"context canceled", nil, nil, canceled, 503, []error{context.Canceled}},
		{"degraded denial", degradedDenial, nil, nil, 503, []error{httplimit.ErrDegraded}},
		{"degraded denial, WithKeys", degradedDenial, []httplimit.Option{keys(engine.Request{Key: "a", Cost: 1})}, nil, 503, []error{httplimit.ErrDegraded}},
		{"admitter out of contract", badIndexed, []httplimit.Option{keys(engine.Request{Key: "a", Cost: 1})}, nil, 500, []error{httplimit.ErrAdmitterContract}},
	}
}

// WithOnError's function is called once, with the error, for every class
// of error the middleware answers; an enforcing middleware answers with the
// error's status, a shadow one passes the request on. Each is counted in
// Stats().Errors, but a degraded denial, which is decided, in Degraded.
func TestOnError(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		for _, c := range errorCases() {
			t.Run(fmt.Sprintf("%s/shadow=%v", c.name, shadow), func(t *testing.T) {
				var a engine.Admitter
				if c.a != nil {
					a = c.a(t)
				} else {
					a, _ = newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
				}
				var got []error
				opts := append([]httplimit.Option{httplimit.WithOnError(func(r *http.Request, err error) {
					require.NotNil(t, r)
					got = append(got, err)
				})}, c.opts...)
				if shadow {
					opts = append(opts, httplimit.WithShadow())
				}
				mw, err := httplimit.New(a, opts...)
				require.NoError(t, err)
				reached := false
				h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					reached = true
					w.WriteHeader(http.StatusNoContent)
				}))
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if c.req != nil {
					r = c.req(r)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)

				require.Len(t, got, 1, "OnError called once")
				for _, target := range c.is {
					assert.ErrorIs(t, got[0], target)
				}
				if shadow {
					assert.True(t, reached, "a shadow middleware passes the request on")
					assert.Equal(t, http.StatusNoContent, rec.Code)
				} else {
					assert.False(t, reached)
					assert.Equal(t, c.code, rec.Code)
				}
				assert.Empty(t, rec.Header().Values("RateLimit"))
				if errors.Is(got[0], httplimit.ErrDegraded) {
					assert.Equal(t, httplimit.Stats{Decided: 1, Degraded: 1}, mw.Stats())
				} else {
					assert.Equal(t, httplimit.Stats{Errors: 1}, mw.Stats())
				}
			})
		}
	}
}

// OnError is not called for an admission, a limit's denial (whatever
// WithDenied writes) or a degraded admission.
func TestOnErrorNotForDecisions(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	var calls int
	onError := httplimit.WithOnError(func(*http.Request, error) { calls++ })
	srv := serve(t, e, ok, onError, httplimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, _ engine.Decision) {
		w.WriteHeader(http.StatusServiceUnavailable) // a limit still, though a 5xx
	}))
	assert.Equal(t, http.StatusOK, get(t, srv).status)
	assert.Equal(t, http.StatusServiceUnavailable, get(t, srv).status)

	mw, err := httplimit.New(degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 10}}, onError)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	mw.Handler(ok).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, httplimit.Stats{Decided: 1, Degraded: 1}, mw.Stats())
	assert.Zero(t, calls)
}

// A shadow middleware through a real server: every request is admitted,
// spends as an enforcing one would, and carries the fields an enforcing
// one would send (but Retry-After); Stats counts exactly the requests an
// enforcing middleware over a twin engine refuses, each at the same step.
func TestShadowNeverRefuses(t *testing.T) {
	shadowE, shadowClk := newEngine(t, engine.Config{Policy: pol(3, 1)})
	enforceE, enforceClk := newEngine(t, engine.Config{Policy: pol(3, 1)})
	shadowMW, err := httplimit.New(shadowE, httplimit.WithShadow(), httplimit.WithKey(userKey))
	require.NoError(t, err)
	shadowSrv := httptest.NewServer(shadowMW.Handler(ok))
	t.Cleanup(shadowSrv.Close)
	enforceSrv := serve(t, enforceE, ok, httplimit.WithKey(userKey))

	var refusals uint64
	for i := range 30 {
		user := []string{"a", "b", "a", "a", "c"}[i%5]
		s := get(t, shadowSrv, "X-User", user)
		en := get(t, enforceSrv, "X-User", user)
		require.Equal(t, http.StatusOK, s.status, "request %d: shadow mode never refuses", i)
		require.Equal(t, "ok", s.body)
		assert.Equal(t, en.header.Values("RateLimit"), s.header.Values("RateLimit"), "request %d", i)
		assert.Equal(t, en.header.Values("RateLimit-Policy"), s.header.Values("RateLimit-Policy"))
		assert.Empty(t, s.header.Values("Retry-After"))
		checkDraftFields(t, s.header, s.status)
		if en.status == http.StatusTooManyRequests {
			refusals++
		}
		if i%6 == 5 {
			shadowClk.Advance(time.Second)
			enforceClk.Advance(time.Second)
		}
	}
	require.Positive(t, refusals)
	assert.Equal(t, httplimit.Stats{Decided: 30, Refused: refusals}, shadowMW.Stats())
	assert.Equal(t, remaining(t, enforceE, "a"), remaining(t, shadowE, "a"), "spent as enforcement spends")
}

// Counted exactly under concurrency: 4 clients of 10 requests each against
// a bucket of 5 that never refills, so 20 would be refused.
func TestShadowCountsConcurrent(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	mw, err := httplimit.New(e, httplimit.WithShadow(), httplimit.WithKey(userKey))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(ok))
	t.Cleanup(srv.Close)
	t.Cleanup(srv.Client().CloseIdleConnections)
	var wg sync.WaitGroup
	codes := make(chan int, 40)
	for c := range 4 {
		wg.Go(func() {
			for range 10 {
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				req.Header.Set("X-User", strconv.Itoa(c))
				res, err := srv.Client().Do(req)
				if !assert.NoError(t, err) {
					return
				}
				_ = res.Body.Close()
				codes <- res.StatusCode
			}
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusOK, c)
	}
	assert.Equal(t, httplimit.Stats{Decided: 40, Refused: 20}, mw.Stats())
}

// A shadow middleware inside an enforcing one adds its items after the
// enforced ones, which are unchanged; it decides only what the enforced
// limit admitted.
func TestShadowInsideEnforcing(t *testing.T) {
	enforced, _ := newEngine(t, engine.Config{Policy: pol(4, 1)})
	candidate, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	shadow, err := httplimit.New(candidate, httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	require.NoError(t, err)
	srv := serve(t, enforced, shadow.Handler(ok), httplimit.WithPolicyName("api"))
	var got []string
	for range 5 {
		res := get(t, srv)
		checkDraftFields(t, res.header, res.status)
		got = append(got, fmt.Sprint(res.status, " ", strings.Join(res.header.Values("RateLimit-Policy"), "|"), " ", strings.Join(res.header.Values("RateLimit"), "|")))
	}
	assert.Equal(t, []string{
		`200 "api";q=4;w=4, "candidate";q=2;w=2 "api";r=3;t=1, "candidate";r=1;t=1`,
		`200 "api";q=4;w=4, "candidate";q=2;w=2 "api";r=2;t=2, "candidate";r=0;t=2`,
		`200 "api";q=4;w=4, "candidate";q=2;w=2 "api";r=1;t=3, "candidate";r=0;t=1`,
		`200 "api";q=4;w=4, "candidate";q=2;w=2 "api";r=0;t=4, "candidate";r=0;t=1`,
		`429 "api";q=4;w=4 "api";r=0;t=1`,
	}, got)
	assert.Equal(t, httplimit.Stats{Decided: 4, Refused: 2}, shadow.Stats())
}

// A store's failure rule denying in shadow mode: admitted, counted as
// degraded, given to OnError, and no fields.
func TestShadowDegradedDenial(t *testing.T) {
	var got []error
	mw, err := httplimit.New(degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 10}},
		httplimit.WithShadow(), httplimit.WithOnError(func(_ *http.Request, err error) { got = append(got, err) }))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(ok))
	t.Cleanup(srv.Close)
	res := get(t, srv)
	assert.Equal(t, http.StatusOK, res.status)
	assert.Empty(t, res.header.Values("RateLimit"))
	assert.Empty(t, res.header.Values("Retry-After"))
	require.Len(t, got, 1)
	assert.ErrorIs(t, got[0], httplimit.ErrDegraded)
	assert.Equal(t, httplimit.Stats{Decided: 1, Degraded: 1}, mw.Stats())
}

// WithTrustedProxies with no prefixes trusts nothing, as if not given: the
// header is not read, and the client is the peer; given after prefixes,
// it undoes them.
func TestTrustedProxiesNone(t *testing.T) {
	for name, opts := range map[string][]httplimit.Option{
		"no prefixes":       {httplimit.WithTrustedProxies(httplimit.XForwardedFor)},
		"no prefixes after": {httplimit.WithTrustedProxies(httplimit.XForwardedFor, loopbackProxies...), httplimit.WithTrustedProxies(httplimit.XForwardedFor)},
		"Forwarded":         {httplimit.WithTrustedProxies(httplimit.Forwarded)},
		"unset":             {httplimit.WithTrustedProxies(0)}, // a setting left empty: no if needed
	} {
		t.Run(name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			srv := serve(t, e, ok, opts...)
			res := get(t, srv, "X-Forwarded-For", "203.0.113.7", "Forwarded", "for=203.0.113.7")
			require.Equal(t, http.StatusOK, res.status)
			assert.Equal(t, int64(5), remaining(t, e, "203.0.113.7"), "the header was not read")
			assert.Equal(t, 1, e.KeyCount())
		})
	}
	_, err := httplimit.New(newEngineOnly(t), httplimit.WithTrustedProxies(0, loopbackProxies...))
	assert.ErrorIs(t, err, httplimit.ErrInvalidOption, "proxies trusted with no header to read")
}

func newEngineOnly(t *testing.T) *engine.Engine {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	return e
}

// A shadow middleware adds its items to the fields already on the
// response as one valid List each: a blank field line an outer handler
// left there is an empty List, not an empty member before the shadow's
// items (a leading comma no structured-field parser accepts).
func TestShadowAfterBlankField(t *testing.T) {
	candidate, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	shadow, err := httplimit.New(candidate, httplimit.WithShadow(), httplimit.WithPolicyName("candidate"))
	require.NoError(t, err)
	blank := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Ratelimit-Policy"] = []string{""}
			w.Header()["Ratelimit"] = []string{" "}
			next.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(blank(shadow.Handler(ok)))
	t.Cleanup(srv.Close)
	res := get(t, srv)
	require.Equal(t, http.StatusOK, res.status)
	checkDraftFields(t, res.header, res.status)
	assert.Equal(t, []string{`"candidate";q=2;w=2`}, res.header.Values("RateLimit-Policy"))
	assert.Equal(t, []string{`"candidate";r=1;t=1`}, res.header.Values("RateLimit"))
}
