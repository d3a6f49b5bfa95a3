package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

func TestNewFields(t *testing.T) {
	for _, bad := range []string{"tab\there", "é", "\x7f"} {
		_, err := httplimit.NewFields(bad)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "%q", bad)
	}

	// Fields writes what the middleware writes, for the same decision;
	// "" is the default name.
	p := policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1}
	for _, name := range []string{"", "api"} {
		e, err := engine.New(engine.Config{Policy: p, Clock: clock.NewManual(0)})
		require.NoError(t, err)
		var opts []httplimit.Option
		if name != "" {
			opts = append(opts, httplimit.WithPolicyName(name))
		}
		mw, err := httplimit.New(e, opts...)
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		mw.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))

		d, err := e.Peek(context.Background(), "192.0.2.1")
		require.NoError(t, err)
		f, err := httplimit.NewFields(name)
		require.NoError(t, err)
		buf, end := f.Append([]byte("prefix"), e.Policy(), "192.0.2.1", d)
		require.Equal(t, "prefix"+rec.Header().Get("RateLimit-Policy"), string(buf[:end]))
		require.Equal(t, rec.Header().Get("RateLimit"), string(buf[end:]))
		require.NoError(t, e.Close())
	}
}
