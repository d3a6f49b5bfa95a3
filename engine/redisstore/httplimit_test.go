package redisstore_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
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
