package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// TestKeyFuncContextEnded: a key function that fails because the request's
// own context ended (an API-key lookup made with r.Context() when the
// client went away) is the client going away, answered as when the context
// ends before the engine decides: 503 with no body, and not ErrKeyFunc, so
// a dashboard of 500s does not count disconnects, whatever error the
// function returns once that context has ended. A key function's own
// deadline passing while the request lives is still the server failing.
func TestKeyFuncContextEnded(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  func(f func(r *http.Request) error) httplimit.Option
	}{
		{"WithKey", func(f func(r *http.Request) error) httplimit.Option {
			return httplimit.WithKey(func(r *http.Request) (string, error) { return "k", f(r) })
		}},
		{"WithClientKey", func(f func(r *http.Request) error) httplimit.Option {
			return httplimit.WithClientKey(func(r *http.Request, c string) (string, error) { return c, f(r) })
		}},
		{"WithKeys", func(f func(r *http.Request) error) httplimit.Option {
			return httplimit.WithKeys(func(r *http.Request, c string) ([]engine.Request, error) {
				return []engine.Request{{Key: c, Cost: 1}}, f(r)
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			serve := func(ctx context.Context, f func(r *http.Request) error) (*httptest.ResponseRecorder, error) {
				var got error
				mw, err := httplimit.New(e, c.opt(f), httplimit.WithOnError(func(_ *http.Request, err error) { got = err }))
				require.NoError(t, err)
				rec := httptest.NewRecorder()
				mw.Handler(ok).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
				return rec, got
			}

			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			rec, got := serve(ctx, func(r *http.Request) error { return fmt.Errorf("lookup: %w", r.Context().Err()) })
			assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
			assert.Empty(t, rec.Body.String())
			assert.ErrorIs(t, got, context.Canceled)
			assert.NotErrorIs(t, got, httplimit.ErrKeyFunc)
			// A lookup over gRPC under the request's context gets a
			// status, which wraps no context error: the same.
			rec, got = serve(ctx, func(*http.Request) error { return grpcCanceled{} })
			assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
			assert.Empty(t, rec.Body.String())
			assert.ErrorIs(t, got, context.Canceled)
			assert.ErrorIs(t, got, grpcCanceled{}, "the key function's error, for WithOnError")
			assert.NotErrorIs(t, got, httplimit.ErrKeyFunc)
			// Nor does an error the answer would otherwise be chosen
			// by, such as ErrNoClientIP, which a function may return to
			// answer 500 while the request lives.
			rec, got = serve(ctx, func(*http.Request) error { return httplimit.ErrNoClientIP })
			assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
			assert.Empty(t, rec.Body.String())
			assert.ErrorIs(t, got, context.Canceled)
			assert.ErrorIs(t, got, httplimit.ErrNoClientIP, "the key function's error, for WithOnError")

			rec, got = serve(t.Context(), func(*http.Request) error { return context.DeadlineExceeded })
			assert.Equal(t, http.StatusInternalServerError, rec.Code, "the lookup's own deadline, the request alive")
			assert.ErrorIs(t, got, httplimit.ErrKeyFunc)
		})
	}
}

// grpcCanceled is shaped as grpc-go's status error for a call canceled by
// its context: it says so in its text and wraps no context error.
type grpcCanceled struct{}

func (grpcCanceled) Error() string { return "rpc error: code = Canceled desc = context canceled" }
