package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// loopback is the key of every request a test client sends: its address.
const loopback = "127.0.0.1"

// costHeader lets a test client choose its cost.
func costHeader(r *http.Request) int64 {
	n, err := strconv.ParseInt(r.Header.Get("Cost"), 10, 64)
	if err != nil {
		return 1
	}
	return n
}

// userKey keys a request by its X-User header, which may be blank.
func userKey(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

// Admitted requests reach the handler and carry both fields: q the capacity,
// w = ceil(10 / 2) = 5 s, r the tokens left, t = ceil(ResetAfter).
func TestAdmittedHeaders(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(10, 2)})
	srv := serve(t, e, ok)
	steps := []struct {
		advance   time.Duration
		rateLimit string // ResetAfter in the comment
	}{
		{0, `"default";r=9;t=1`},                      // 0.5 s
		{0, `"default";r=8;t=1`},                      // 1 s exactly
		{0, `"default";r=7;t=2`},                      // 1.5 s
		{250 * time.Millisecond, `"default";r=6;t=2`}, // 7.5 tokens spent 1 -> 6.5: 1.75 s
		{10 * time.Second, `"default";r=9;t=1`},       // full again, spent 1
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		res := get(t, srv)
		require.Equal(t, http.StatusOK, res.status, "step %d", i)
		assert.Equal(t, "ok", res.body, "step %d", i)
		assert.Equal(t, []string{`"default";q=10;w=5`}, res.header.Values("RateLimit-Policy"), "step %d", i)
		assert.Equal(t, []string{s.rateLimit}, res.header.Values("RateLimit"), "step %d", i)
		assert.Empty(t, res.header.Values("Retry-After"), "step %d", i)
	}
}

// A key with an override advertises its own capacity and its own window,
// under a name of its own: unnamed, it is derived from its quota.
func TestOverrideHeaders(t *testing.T) {
	set, err := policy.NewOverrideSet(policy.Override{Match: loopback, Capacity: 7, TokensPerSecond: 2})
	require.NoError(t, err)
	p := pol(100, 1)
	p.Overrides = set
	e, _ := newEngine(t, engine.Config{Policy: p})
	srv := serve(t, e, ok)

	res := get(t, srv)
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, `"default-7-2";q=7;w=4`, res.header.Get("RateLimit-Policy")) // ceil(7 / 2)
	assert.Equal(t, `"default-7-2";r=6;t=1`, res.header.Get("RateLimit"))        // 0.5 s
}

// A denial is a 429 whose Retry-After is the retry estimate rounded up to
// whole seconds, with t equal to it, and the handler never runs.
func TestDeniedHeaders(t *testing.T) {
	cases := []struct {
		name           string
		capacity, rate int64
		spend          int64         // at t=0
		advance        time.Duration // then
		cost           int64
		retryAfter     string // the estimate in the comment
		policy, limit  string
	}{
		{"fraction rounds up", 2, 1, 2, 800 * time.Millisecond, 2, "2", `"default";q=2;w=2`, `"default";r=0;t=2`}, // 1.2 s
		{"whole seconds stay", 2, 1, 2, 0, 2, "2", `"default";q=2;w=2`, `"default";r=0;t=2`},                      // 2 s
		{"one ns over a second", 1, 3, 1, 0, 1, "1", `"default";q=1;w=1`, `"default";r=0;t=1`},                    // 333,333,334 ns
		{"t is Retry-After, not reset", 10, 1, 10, 0, 1, "1", `"default";q=10;w=10`, `"default";r=0;t=1`},         // 1 s; reset 10 s
		{"tokens left but too few", 10, 1, 7, 0, 5, "2", `"default";q=10;w=10`, `"default";r=3;t=2`},              // 2 s
		{"just under a second", 10, 1, 10, 1, 1, "1", `"default";q=10;w=10`, `"default";r=0;t=1`},                 // 999,999,999 ns
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, clk := newEngine(t, engine.Config{Policy: pol(c.capacity, c.rate)})
			reached := 0
			srv := serve(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached++
				ok(w, r)
			}), httplimit.WithCost(costHeader))
			d, err := e.Allow(context.Background(), loopback, c.spend)
			require.NoError(t, err)
			require.True(t, d.Allowed)
			clk.Advance(c.advance)

			cost := strconv.FormatInt(c.cost, 10)
			res := get(t, srv, "Cost", cost)
			require.Equal(t, http.StatusTooManyRequests, res.status)
			assert.Equal(t, "httplimit: too many requests\n", res.body)
			assert.Equal(t, []string{c.retryAfter}, res.header.Values("Retry-After"))
			assert.Equal(t, []string{c.policy}, res.header.Values("RateLimit-Policy"))
			assert.Equal(t, []string{c.limit}, res.header.Values("RateLimit"))
			assert.Equal(t, 0, reached)

			ra, err := strconv.Atoi(c.retryAfter)
			require.NoError(t, err)
			clk.Advance(time.Duration(ra) * time.Second)
			res = get(t, srv, "Cost", cost)
			assert.Equal(t, http.StatusOK, res.status, "after Retry-After")
			assert.Equal(t, 1, reached)
		})
	}
}

// A limit's denial never says "retry now", whatever the Admitter's
// RetryAfter: an Admitter (a store, a wrapper) that denies with a
// RetryAfter of 0 or below gets Retry-After 1 and a RateLimit t of 1, and
// so does the same denial under WithShadow, which reports t and sends no
// Retry-After. A client reading 0 would retry at once, in a loop.
func TestDeniedNeverRetryNow(t *testing.T) {
	for _, retryAfter := range []time.Duration{0, -time.Second} {
		d := engine.Decision{RetryAfter: retryAfter, Version: 1, Limit: 10} // denied, not Degraded
		for _, shadow := range []bool{false, true} {
			var opts []httplimit.Option
			if shadow {
				opts = append(opts, httplimit.WithShadow())
			}
			mw, err := httplimit.New(degradedAdmitter{d: d}, opts...)
			require.NoError(t, err)
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			name := fmt.Sprintf("RetryAfter %v, shadow %v", retryAfter, shadow)
			if shadow {
				require.Equal(t, http.StatusNoContent, rec.Code, name)
				assert.Empty(t, rec.Header().Values("Retry-After"), name)
			} else {
				require.Equal(t, http.StatusTooManyRequests, rec.Code, name)
				assert.Equal(t, []string{"1"}, rec.Header().Values("Retry-After"), name)
			}
			assert.Equal(t, []string{`"default";q=10;w=10`}, rec.Header().Values("RateLimit-Policy"), name)
			assert.Equal(t, []string{`"default";r=0;t=1`}, rec.Header().Values("RateLimit"), name)
		}
	}
}

// WithDenied writes the denial; the header fields are already set when it
// runs.
func TestCustomDenied(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	var seen engine.Decision
	srv := serve(t, e, ok, httplimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, d engine.Decision) {
		seen = d
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("X-Seen", w.Header().Get("Retry-After")+" "+w.Header().Get("RateLimit"))
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"status":429}`)
	}))
	require.Equal(t, http.StatusOK, get(t, srv).status)
	res := get(t, srv)
	require.Equal(t, http.StatusTooManyRequests, res.status)
	assert.Equal(t, `{"status":429}`, res.body)
	assert.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	assert.Equal(t, `1 "default";r=0;t=1`, res.header.Get("X-Seen"))
	assert.Equal(t, engine.Decision{Allowed: false, RetryAfter: time.Second, Version: 1, Limit: 1, ResetAfter: time.Second}, seen)
}

// The wrapped handler sees the fields on its writer before it writes.
func TestHeadersSetBeforeNext(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(3, 1)})
	srv := serve(t, e, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, w.Header().Get("RateLimit-Policy")+" "+w.Header().Get("RateLimit"))
	}))
	res := get(t, srv)
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, `"default";q=3;w=3 "default";r=2;t=1`, res.body)
}

// A policy name is serialised as a structured-field String.
func TestPolicyName(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	srv := serve(t, e, ok, httplimit.WithPolicyName(`per "ip" \ v1`))
	res := get(t, srv)
	assert.Equal(t, `"per \"ip\" \\ v1";q=2;w=2`, res.header.Get("RateLimit-Policy"))
	assert.Equal(t, `"per \"ip\" \\ v1";r=1;t=1`, res.header.Get("RateLimit"))
}

// Integers beyond the structured-field range are sent as its maximum.
func TestHugeValuesSaturate(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(math.MaxInt64, 1)})
	srv := serve(t, e, ok)
	res := get(t, srv)
	require.Equal(t, http.StatusOK, res.status)
	assert.Equal(t, `"default";q=999999999999999;w=999999999999999`, res.header.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=999999999999999;t=1`, res.header.Get("RateLimit"))
}

// A full key table is the server's overload: 503, and the keys already
// tracked go on working. An engine that sweeps nothing in the background
// (SweepEvery 0 on a Manual clock) frees no slot by itself, so there is no
// Retry-After unless WithOverloadRetryAfter gives one; overload_test.go
// covers an engine that estimates it.
func TestKeyCapacity(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []httplimit.Option
		retry []string
	}{
		{"no sweep, no retry", nil, nil},
		{"configured retry", []httplimit.Option{httplimit.WithOverloadRetryAfter(1500 * time.Millisecond)}, []string{"2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
			srv := serve(t, e, ok, append(c.opts, httplimit.WithKey(userKey))...)

			require.Equal(t, http.StatusOK, get(t, srv, "X-User", "alice").status)
			res := get(t, srv, "X-User", "bob")
			require.Equal(t, http.StatusServiceUnavailable, res.status)
			assert.Equal(t, c.retry, res.header.Values("Retry-After"))
			assert.Equal(t, "httplimit: the rate limiter is at capacity; retry later\n", res.body)
			assert.Empty(t, res.header.Values("RateLimit"))
			assert.Empty(t, res.header.Values("RateLimit-Policy"))

			res = get(t, srv, "X-User", "alice")
			require.Equal(t, http.StatusOK, res.status)
			assert.Equal(t, `"default";r=3;t=2`, res.header.Get("RateLimit"))
			assert.Equal(t, 1, e.KeyCount())
		})
	}
}

// A key function that fails, or a key the engine rejects, is the server's
// failure: 500 with a body that says so, and nothing spent.
func TestInvalidKey(t *testing.T) {
	const body = "httplimit: the server could not derive a rate-limit key for this request\n"
	failing := func(*http.Request) (string, error) { return "", errors.New("secret internal detail") }
	for _, c := range []struct {
		name   string
		key    httplimit.KeyFunc
		header []string
	}{
		{"key function error", failing, nil},
		{"blank key", userKey, []string{"X-User", "  "}},
		{"key too long", userKey, []string{"X-User", "abcdefghi"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeyBytes: 8})
			srv := serve(t, e, ok, httplimit.WithKey(c.key))
			res := get(t, srv, c.header...)
			assert.Equal(t, http.StatusInternalServerError, res.status)
			assert.Equal(t, body, res.body)
			assert.Equal(t, "text/plain; charset=utf-8", res.header.Get("Content-Type"))
			assert.Empty(t, res.header.Values("RateLimit"))
			assert.Empty(t, res.header.Values("Retry-After"))
			assert.Equal(t, 0, e.KeyCount())
		})
	}
}

// A cost below 1 is the server's failure (500); a cost above the key's
// capacity can never be admitted (413, no Retry-After).
func TestCostErrors(t *testing.T) {
	for _, c := range []struct {
		cost   string
		status int
		body   string
	}{
		{"0", http.StatusInternalServerError, "httplimit: the server could not derive a rate-limit cost for this request\n"},
		{"-3", http.StatusInternalServerError, "httplimit: the server could not derive a rate-limit cost for this request\n"},
		{"6", http.StatusRequestEntityTooLarge, "httplimit: the request costs more than its rate limit can ever admit\n"},
	} {
		t.Run(c.cost, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			srv := serve(t, e, ok, httplimit.WithCost(costHeader))
			res := get(t, srv, "Cost", c.cost)
			assert.Equal(t, c.status, res.status)
			assert.Equal(t, c.body, res.body)
			assert.Empty(t, res.header.Values("Retry-After"))
			assert.Empty(t, res.header.Values("RateLimit"))
			assert.Equal(t, 0, e.KeyCount())
		})
	}
}

// A closed engine answers 503, with Retry-After only when
// WithOverloadRetryAfter gives one: nobody knows when it comes back.
func TestClosedEngine(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []httplimit.Option
		retry []string
	}{
		{"no retry", nil, nil},
		{"configured retry", []httplimit.Option{httplimit.WithOverloadRetryAfter(3 * time.Second)}, []string{"3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			srv := serve(t, e, ok, c.opts...)
			require.NoError(t, e.Close())
			res := get(t, srv)
			assert.Equal(t, http.StatusServiceUnavailable, res.status)
			assert.Equal(t, "httplimit: the rate limiter is shut down\n", res.body)
			assert.Equal(t, c.retry, res.header.Values("Retry-After"))
			assert.Empty(t, res.header.Values("RateLimit"))
		})
	}
}

// A request whose context has ended before the decision gets a bare 503,
// spends nothing, and never reaches the handler.
func TestContextDoneBeforeDecision(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	mw, err := httplimit.New(e)
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler reached") }))

	for _, done := range []func(context.Context) (context.Context, context.CancelFunc){
		context.WithCancel,
		func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithDeadline(ctx, time.Now().Add(-time.Second))
		},
	} {
		ctx, cancel := done(context.Background())
		cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Empty(t, rec.Body.String())
		assert.Empty(t, rec.Header().Values("Retry-After"))
	}
	assert.Equal(t, 0, e.KeyCount())
}

// A Middleware not built by New fails where the handlers are wired, not
// at a request in production.
func TestHandlerOfAnUnbuiltMiddleware(t *testing.T) {
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	assert.PanicsWithValue(t, "httplimit: Handler of a Middleware not built by New", func() { new(httplimit.Middleware).Handler(next) })
	var m *httplimit.Middleware
	assert.PanicsWithValue(t, "httplimit: Handler of a Middleware not built by New", func() { m.Handler(next) })
}

// New refuses what it cannot use, naming it.
func TestNewInvalid(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	_, err := httplimit.New(nil)
	assert.ErrorIs(t, err, httplimit.ErrInvalidOption)
	_, err = httplimit.New((*engine.Engine)(nil)) // a nil pointer in the interface, as a nil store would be
	assert.ErrorIs(t, err, httplimit.ErrInvalidOption)

	trusted := httplimit.WithTrustedProxies(httplimit.XForwardedFor, mustPrefix("10.0.0.0/8"))
	for name, opts := range map[string][]httplimit.Option{
		"nil option":               {nil},
		"nil key":                  {httplimit.WithKey(nil)},
		"nil cost":                 {httplimit.WithCost(nil)},
		"nil denied":               {httplimit.WithDenied(nil)},
		"empty policy name":        {httplimit.WithPolicyName("")},
		"control char in name":     {httplimit.WithPolicyName("a\nb")},
		"non-ASCII name":           {httplimit.WithPolicyName("café")},
		"zero overload retry":      {httplimit.WithOverloadRetryAfter(0)},
		"nil client key":           {httplimit.WithClientKey(nil)},
		"key and client key":       {httplimit.WithKey(userKey), httplimit.WithClientKey(routeKey)},
		"client key, then the key": {httplimit.WithClientKey(routeKey), httplimit.WithKey(userKey)},
		"IPv6 prefix 0":            {httplimit.WithIPv6Prefix(0)},
		"IPv6 prefix 31":           {httplimit.WithIPv6Prefix(httplimit.MinIPv6Prefix - 1)},
		"IPv6 prefix 129":          {httplimit.WithIPv6Prefix(129)},
		"no header":                {httplimit.WithTrustedProxies(0, mustPrefix("10.0.0.0/8"))},
		"unknown header":           {httplimit.WithTrustedProxies(3, mustPrefix("10.0.0.0/8"))},
		"invalid prefix":           {httplimit.WithTrustedProxies(httplimit.Forwarded, mustPrefix("10.0.0.0/8"), netipPrefixZero)},
	} {
		_, err := httplimit.New(e, opts...)
		assert.ErrorIs(t, err, httplimit.ErrInvalidOption, name)
	}
	// WithTrustedProxies used to be refused beside WithKey, when it
	// configured only the default key. It now sets how the client is found
	// for the default key and WithClientKey, so it combines with either key
	// option (TestClientKeyBehindProxy shows it applied).
	for name, opts := range map[string][]httplimit.Option{
		"trusted, name, cost":               {trusted, httplimit.WithPolicyName("x"), httplimit.WithCost(costHeader)},
		"key with trusted proxies":          {httplimit.WithKey(userKey), trusted},
		"trusted proxies, then the key":     {trusted, httplimit.WithKey(userKey)},
		"client key with trusted proxies":   {httplimit.WithClientKey(routeKey), trusted},
		"IPv6 prefix bounds, last one wins": {httplimit.WithIPv6Prefix(httplimit.MinIPv6Prefix), httplimit.WithIPv6Prefix(128)},
	} {
		_, err := httplimit.New(e, opts...)
		assert.NoError(t, err, name)
	}
}
