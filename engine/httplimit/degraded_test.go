package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// degradedAdmitter answers every Allow and AllowAll with d, as a store's
// failure rule would, under a policy of 10 tokens at 1 a second; the
// embedded Admitter (nil) is never called.
type degradedAdmitter struct {
	engine.Admitter
	d engine.Decision
}

func (a degradedAdmitter) Allow(context.Context, string, int64) (engine.Decision, error) {
	return a.d, nil
}

func (degradedAdmitter) Policy() policy.Policy {
	return policy.Policy{Version: 1, Capacity: 10, TokensPerSecond: 1}
}

func (a degradedAdmitter) AllowAll(context.Context, []engine.Request) (engine.Decision, int, error) {
	return a.d, 0, nil
}

// A denial by a store's failure rule is the server's outage: 503 with
// Retry-After its RetryAfter rounded up to whole seconds (at least 1), no
// RateLimit fields, the handler never run and the WithDenied function never
// called. A degraded admission reaches the handler without RateLimit
// fields. Both through Allow and, under WithKeys, AllowAll.
func TestDegradedDecisions(t *testing.T) {
	keys := func(*http.Request, string) ([]engine.Request, error) {
		return []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}}, nil
	}
	deniedCalled := false
	denied := httplimit.WithDenied(func(w http.ResponseWriter, _ *http.Request, _ engine.Decision) {
		deniedCalled = true
		w.WriteHeader(http.StatusTeapot)
	})
	for _, c := range []struct {
		name       string
		d          engine.Decision
		status     int
		retryAfter []string
	}{
		{"fail closed, 1s", engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 10}, http.StatusServiceUnavailable, []string{"1"}},
		{"fail closed, 1.2s", engine.Decision{Degraded: true, RetryAfter: 1200 * time.Millisecond, Version: 1, Limit: 10}, http.StatusServiceUnavailable, []string{"2"}},
		{"fail closed, 0", engine.Decision{Degraded: true, Version: 1, Limit: 10}, http.StatusServiceUnavailable, []string{"1"}},
		{"fail open", engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 10}, http.StatusNoContent, nil},
	} {
		for _, mode := range []string{"Allow", "AllowAll"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				opts := []httplimit.Option{denied}
				if mode == "AllowAll" {
					opts = append(opts, httplimit.WithKeys(keys))
				}
				mw, err := httplimit.New(degradedAdmitter{d: c.d}, opts...)
				require.NoError(t, err)
				deniedCalled = false
				reached := false
				h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					reached = true
					w.WriteHeader(http.StatusNoContent)
				}))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				require.Equal(t, c.status, rec.Code, rec.Body.String())
				assert.Equal(t, c.d.Allowed, reached, "handler reached")
				assert.False(t, deniedCalled, "WithDenied's function called for a degraded denial")
				assert.Equal(t, c.retryAfter, rec.Header().Values("Retry-After"))
				assert.Empty(t, rec.Header().Values("RateLimit"))
				assert.Empty(t, rec.Header().Values("RateLimit-Policy"))
			})
		}
	}
}

// The same denial without Degraded is a limit: 429 (here WithDenied's
// status) with the RateLimit fields, so the 503 above comes from Degraded
// alone.
func TestNotDegradedIsALimit(t *testing.T) {
	mw, err := httplimit.New(degradedAdmitter{d: engine.Decision{RetryAfter: time.Second, Version: 1, Limit: 10}})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	mw.Handler(ok).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.NotEmpty(t, rec.Header().Values("RateLimit"))
	assert.Equal(t, []string{"1"}, rec.Header().Values("Retry-After"))
}

// TestErrorAnswersCarryNoOuterFields: an answer that is no bucket's
// decision (a full key table's 503, a degraded denial's 503) has no
// RateLimit fields, even under a middleware that set its own first, a
// shadow one or an enforcing one: they would describe another quota than
// the one that answered. A degraded admission keeps the outer fields: the
// request passed that limit.
func TestErrorAnswersCarryNoOuterFields(t *testing.T) {
	full, _ := newEngine(t, engine.Config{Policy: pol(10, 1), MaxKeys: 1})
	_, err := full.Allow(context.Background(), "someone-else", 1) // the key table is now full
	require.NoError(t, err)
	denying := degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 10}}
	admitting := degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 10}}
	for _, c := range []struct {
		name   string
		inner  engine.Admitter
		code   int
		fields bool
	}{
		{"a full key table", full, http.StatusServiceUnavailable, false},
		{"a degraded denial", denying, http.StatusServiceUnavailable, false},
		{"a degraded admission", admitting, http.StatusOK, true},
	} {
		for _, shadow := range []bool{false, true} {
			outerEngine, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
			opts := []httplimit.Option{httplimit.WithPolicyName("outer")}
			if shadow {
				opts = append(opts, httplimit.WithShadow())
			}
			outer, err := httplimit.New(outerEngine, opts...)
			require.NoError(t, err)
			inner, err := httplimit.New(c.inner)
			require.NoError(t, err)
			w := httptest.NewRecorder()
			outer.Handler(inner.Handler(ok)).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			require.Equal(t, c.code, w.Code, "%s, shadow outer %v", c.name, shadow)
			if c.fields {
				require.Equal(t, []string{`"outer";r=9;t=1`}, w.Header().Values("RateLimit"), "%s, shadow outer %v", c.name, shadow)
			} else {
				require.Empty(t, w.Header().Values("RateLimit"), "%s, shadow outer %v", c.name, shadow)
				require.Empty(t, w.Header().Values("RateLimit-Policy"), "%s, shadow outer %v", c.name, shadow)
			}
		}
	}
}
