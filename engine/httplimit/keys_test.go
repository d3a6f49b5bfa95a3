package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// keysHeader reads the requests of the "Keys" header: "a=1,b=2"; a key
// without "=n" costs 1, and "fail" makes the function fail.
func keysHeader(r *http.Request, _ string) ([]engine.Request, error) {
	v := r.Header.Get("Keys")
	if v == "fail" {
		return nil, errors.New("no keys")
	}
	var out []engine.Request
	for _, kv := range strings.Split(v, ",") {
		if kv == "-" {
			continue // no request at all
		}
		k, c, found := strings.Cut(kv, "=")
		cost := int64(1)
		if found {
			var err error
			if cost, err = strconv.ParseInt(c, 10, 64); err != nil {
				return nil, err
			}
		}
		out = append(out, engine.Request{Key: k, Cost: cost})
	}
	return out, nil
}

// served is one answer of a middleware, and whether the wrapped handler ran.
type served struct {
	code    int
	body    string
	header  http.Header
	reached bool
}

// serveOnce sends one request with the given header lines through mw.
func serveOnce(t *testing.T, mw *httplimit.Middleware, ctx context.Context, header ...string) served {
	t.Helper()
	var s served
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.reached = true
		w.WriteHeader(http.StatusNoContent)
	}))
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	s.code, s.body, s.header = rec.Code, rec.Body.String(), rec.Header()
	return s
}

func newKeys(t *testing.T, a engine.Admitter, opts ...httplimit.Option) *httplimit.Middleware {
	t.Helper()
	mw, err := httplimit.New(a, append([]httplimit.Option{httplimit.WithKeys(keysHeader)}, opts...)...)
	require.NoError(t, err)
	return mw
}

// TestWithKeysExcludes: WithKeys gives the keys and the costs, so WithKey,
// WithClientKey and WithCost, in either order, are ErrInvalidOption, as is
// WithKeys(nil); the options that shape other things combine with it.
func TestWithKeysExcludes(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	keys := httplimit.WithKeys(keysHeader)
	for name, other := range map[string]httplimit.Option{
		"WithKey":       httplimit.WithKey(userKey),
		"WithClientKey": httplimit.WithClientKey(func(_ *http.Request, c string) (string, error) { return c, nil }),
		"WithCost":      httplimit.WithCost(costHeader),
	} {
		_, err := httplimit.New(e, keys, other)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "WithKeys, %s", name)
		_, err = httplimit.New(e, other, keys)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "%s, WithKeys", name)
	}
	_, err := httplimit.New(e, httplimit.WithKeys(nil))
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	_, err = httplimit.New(e, keys, httplimit.WithPolicyName("api"), httplimit.WithOverloadRetryAfter(time.Second),
		httplimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, _ engine.Decision) { w.WriteHeader(http.StatusTeapot) }))
	require.NoError(t, err)
}

// TestWithKeysAllOrNothing: capacity 5 at 1 a second. a 3 and b 1 are
// paid together (a binds with 2 left, 3 s to full); then b 1 and a 3 are
// refused, a one token short (1 s), and b pays nothing for it: b still
// holds 4. A key's costs add up.
func TestWithKeysAllOrNothing(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	mw := newKeys(t, e)
	s := serveOnce(t, mw, t.Context(), "Keys", "a=3,b=1")
	require.Equal(t, http.StatusNoContent, s.code)
	require.True(t, s.reached)
	assert.Equal(t, `"default";r=2;t=3`, s.header.Get("RateLimit"))

	s = serveOnce(t, mw, t.Context(), "Keys", "b=1,a=3")
	require.Equal(t, http.StatusTooManyRequests, s.code)
	require.False(t, s.reached)
	assert.Equal(t, `"default";r=2;t=1`, s.header.Get("RateLimit"))
	assert.Equal(t, "1", s.header.Get("Retry-After"))
	b, err := e.Peek(t.Context(), "b")
	require.NoError(t, err)
	require.Equal(t, int64(4), b.Remaining, "b paid for the admitted request only")

	s = serveOnce(t, mw, t.Context(), "Keys", "b=2,c=1,b=2")
	require.Equal(t, http.StatusNoContent, s.code, "b's 2+2 of its 4")
	assert.Equal(t, `"default";r=0;t=5`, s.header.Get("RateLimit"))
}

// TestWithKeysHeadersOfBindingKey: the fields of a request limited by
// several keys are those a one-key middleware writes for the binding key
// alone, in the same state: its limit's bands and names, its band's r and
// t, Retry-After. Keys "d*" have a named limit with a daily band; the
// others the default.
func TestWithKeysHeadersOfBindingKey(t *testing.T) {
	ov, err := policy.NewOverrideSet(policy.Override{Match: "d*", Capacity: 5, TokensPerSecond: 5, Name: "pro",
		Bands: mustBands(t, policy.Band{Name: "daily", Capacity: 20, Refill: policy.PerDay(20)})})
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1, Overrides: ov}
	many, manyClk := newEngine(t, engine.Config{Policy: p})
	one, oneClk := newEngine(t, engine.Config{Policy: p})
	multi := newKeys(t, many)
	single, err := httplimit.New(one, httplimit.WithKey(userKey), httplimit.WithCost(costHeader))
	require.NoError(t, err)
	// d1 spends its daily 20 over 4 s on both engines.
	for s := range int64(4) {
		manyClk.Set(s * int64(time.Second))
		oneClk.Set(s * int64(time.Second))
		for _, e := range []*engine.Engine{many, one} {
			d, err := e.Allow(t.Context(), "d1", 5)
			require.NoError(t, err)
			require.True(t, d.Allowed)
		}
	}
	manyClk.Set(4 * int64(time.Second))
	oneClk.Set(4 * int64(time.Second))
	for _, tc := range []struct {
		keys     string // for the several-key middleware
		key      string // the binding key
		cost     int64  // its summed cost
		wantCode int
	}{
		{"x=1,d1=1", "d1", 1, http.StatusTooManyRequests}, // daily is empty
		{"x=9,d2=1", "x", 9, http.StatusNoContent},        // x keeps 1, d2 4
		{"w=1,d3=5", "d3", 5, http.StatusNoContent},       // d3's primary keeps 0
		{"y=9,z=1,y=1", "y", 10, http.StatusNoContent},    // y's 9+1 of 10
		{"d4=1,x=2", "x", 2, http.StatusTooManyRequests},  // x holds 1 on both
	} {
		got := serveOnce(t, multi, t.Context(), "Keys", tc.keys)
		want := serveOnce(t, single, t.Context(), "X-User", tc.key, "Cost", strconv.FormatInt(tc.cost, 10))
		require.Equal(t, tc.wantCode, got.code, tc.keys)
		require.Equal(t, want.code, got.code, tc.keys)
		for _, f := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			require.Equal(t, want.header.Values(f), got.header.Values(f), "%s: %s", tc.keys, f)
		}
		t.Logf("%s: %d %s %s", tc.keys, got.code, got.header.Get("RateLimit-Policy"), got.header.Get("RateLimit"))
	}
}

// badIndex is an Admitter whose AllowAll names a request it was not given.
type badIndex struct{ engine.Admitter }

func (b badIndex) AllowAll(ctx context.Context, reqs []engine.Request) (engine.Decision, int, error) {
	d, _, err := b.Admitter.AllowAll(ctx, reqs)
	return d, len(reqs), err
}

// TestWithKeysStatuses: every failure of a request limited by several keys,
// none of which reaches the handler or carries RateLimit fields, and none
// of which spends a token.
func TestWithKeysStatuses(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tooMany := strings.Repeat("k,", engine.MaxAllowAll) + "k"
	closed, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	require.NoError(t, closed.Close())
	for _, tc := range []struct {
		name string
		keys string
		e    engine.Admitter // nil: a fresh engine of capacity 5 and one key
		ctx  context.Context
		code int
		body string
	}{
		{"the function fails", "fail", nil, nil, http.StatusInternalServerError, "httplimit: the server could not derive the rate-limit keys for this request\n"},
		{"no requests", "-", nil, nil, http.StatusInternalServerError, "httplimit: the server could not derive the rate-limit keys for this request\n"},
		{"more than MaxAllowAll", tooMany, nil, nil, http.StatusInternalServerError, "httplimit: the server could not derive the rate-limit keys for this request\n"},
		{"a blank key", "a, ", nil, nil, http.StatusInternalServerError, "httplimit: the server could not derive a rate-limit key for this request\n"},
		{"a cost below 1", "a=6,b=0", nil, nil, http.StatusInternalServerError, "httplimit: the server could not derive a rate-limit cost for this request\n"},
		{"a sum above capacity", "a=3,b=1,a=3", nil, nil, http.StatusRequestEntityTooLarge, "httplimit: the request costs more than its rate limit can ever admit\n"},
		{"no room for both keys", "a,b", nil, nil, http.StatusServiceUnavailable, "httplimit: the rate limiter is at capacity; retry later\n"},
		{"closed", "a", closed, nil, http.StatusServiceUnavailable, "httplimit: the rate limiter is shut down\n"},
		{"canceled", "a", nil, canceled, http.StatusServiceUnavailable, ""},
		{"an index out of range", "a", badIndex{}, nil, http.StatusInternalServerError, "httplimit: the rate limiter failed\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fresh, _ := newEngine(t, engine.Config{Policy: pol(5, 1), MaxKeys: 1})
			a := tc.e
			switch v := a.(type) {
			case nil:
				a = fresh
			case badIndex:
				v.Admitter = fresh
				a = v
			}
			ctx := tc.ctx
			if ctx == nil {
				ctx = t.Context()
			}
			s := serveOnce(t, newKeys(t, a), ctx, "Keys", tc.keys)
			require.Equal(t, tc.code, s.code)
			require.Equal(t, tc.body, s.body)
			require.False(t, s.reached, "the handler ran")
			require.Empty(t, s.header.Get("RateLimit"), "fields without a decision")
			if tc.name != "an index out of range" {
				require.Zero(t, fresh.KeyCount(), "nothing spent")
			}
		})
	}
}
