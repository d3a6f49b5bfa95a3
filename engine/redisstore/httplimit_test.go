package redisstore_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMiddlewareOnStore: the HTTP middleware runs on a store as it does on
// the engine, with the same statuses and header fields.
func TestMiddlewareOnStore(t *testing.T) {
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1}}, clock.NewManual(0))
	mw, err := httplimit.New(s)
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	var codes []int
	for range 3 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "192.0.2.7:1234"
		h.ServeHTTP(rec, req)
		codes = append(codes, rec.Code)
		require.NotEmpty(t, rec.Header().Get("RateLimit"), "the RateLimit field on every decided request")
	}
	require.Equal(t, []int{http.StatusNoContent, http.StatusNoContent, http.StatusTooManyRequests}, codes)
}

// TestMiddlewareWithKeysOnStore: a request limited by several keys runs on
// a store as on the engine: admitted only if every key holds its cost, the
// fields those of the binding key, and a refused request pays nothing.
func TestMiddlewareWithKeysOnStore(t *testing.T) {
	s := newStore(t, redisstore.Config{Policy: policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1}}, clock.NewManual(0))
	mw, err := httplimit.New(s, httplimit.WithKeys(func(r *http.Request, _ string) ([]engine.Request, error) {
		return []engine.Request{{Key: "user:" + r.Header.Get("X-User"), Cost: 1}, {Key: "global", Cost: 1}}, nil
	}))
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	var got []string
	for _, user := range []string{"a", "a", "b", "c", "a"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-User", user)
		h.ServeHTTP(rec, req)
		got = append(got, fmt.Sprint(user, " ", rec.Code, " ", rec.Header().Get("RateLimit")))
	}
	require.Equal(t, []string{
		`a 204 "default";r=2;t=1`, // a and global keep 2: a binds, first
		`a 204 "default";r=1;t=2`, // a and global keep 1
		`b 204 "default";r=0;t=3`, // global keeps 0
		`c 429 "default";r=0;t=1`, // global is empty
		`a 429 "default";r=0;t=1`,
	}, got)
	d, err := s.Peek(context.Background(), "user:c")
	require.NoError(t, err)
	require.Equal(t, int64(3), d.Remaining, "c paid nothing")
	d, err = s.Peek(context.Background(), "user:a")
	require.NoError(t, err)
	require.Equal(t, int64(1), d.Remaining, "a paid for its admitted requests only")
}

// TestMiddlewareOnStoreWithoutRedis: through the HTTP middleware, a store
// started with no server listening answers by its failure rule: failing
// closed, 503 with Retry-After its FailRetryAfter in whole seconds and no
// RateLimit fields, the handler not run; failing open, the handler runs,
// without RateLimit fields.
func TestMiddlewareOnStoreWithoutRedis(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	srv := startPrivate(t)
	srv.Kill()
	for _, failOpen := range []bool{false, true} {
		s, err := redisstore.New(context.Background(), redisstore.Config{Client: client(t, srv.Addr()), Prefix: prefix(t),
			Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1}, FailOpen: failOpen, FailRetryAfter: 2500 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		mw, err := httplimit.New(s)
		require.NoError(t, err)
		reached := false
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reached = true
			w.WriteHeader(http.StatusNoContent)
		}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if failOpen {
			require.Equal(t, http.StatusNoContent, rec.Code)
			require.True(t, reached)
			require.Empty(t, rec.Header().Values("Retry-After"))
		} else {
			require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
			require.False(t, reached)
			require.Equal(t, []string{"3"}, rec.Header().Values("Retry-After"))
		}
		require.Empty(t, rec.Header().Values("RateLimit"))
		require.Empty(t, rec.Header().Values("RateLimit-Policy"))
	}
}

// TestSettleOnStoreRedisGone: a request Redis admitted, whose handler then
// settles an under-estimate after Redis has gone, is told so: the charge,
// which the store's failure rule answers (Degraded, with a nil error), is
// ErrDegraded, not nil, which would say the key was settled.
func TestSettleOnStoreRedisGone(t *testing.T) {
	srv := startPrivate(t)
	ctx := context.Background()
	s, err := redisstore.New(ctx, redisstore.Config{Client: quickClient(t, srv.Addr()), Prefix: prefix(t),
		Policy: policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}, Clock: clock.NewManual(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	mw, err := httplimit.New(s, httplimit.WithKey(func(*http.Request) (string, error) { return "u", nil }),
		httplimit.WithCost(func(*http.Request) int64 { return 3 }))
	require.NoError(t, err)
	var settled error
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Kill()
		settled = httplimit.Settle(r, 5)
		w.WriteHeader(http.StatusNoContent)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusNoContent, rec.Code, "Redis admitted the request")
	require.ErrorIs(t, settled, httplimit.ErrDegraded)
	require.Equal(t, uint64(1), s.Stats().DegradedAllowed, "the charge, answered by the failure rule")

	srv.Restart(t) // so that go-redis's dialer, retrying in the background, ends
	untilDecided(t, s, "u", engine.Decision{Version: 1, Limit: 10, RetryAfter: redisstore.DefaultFailRetryAfter, Degraded: true})
}
