package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// A request without a client address (RemoteAddr empty, or not an address,
// as over a Unix socket) has no default key and is answered with 500
// (ErrNoClientIP); a WithClientKey or WithKeys function is called with
// client "", as grpclimit's WithKey is for a peer without an IP address,
// so a key of its own (an API token) limits the request.
func TestNoClientIPKeyFunctions(t *testing.T) {
	byToken := func(r *http.Request) string { return "token:" + r.Header.Get("X-Token") }
	for _, tc := range []struct {
		name string
		opt  httplimit.Option // nil: the default key
	}{
		{"default key", nil},
		{"WithClientKey", httplimit.WithClientKey(func(r *http.Request, client string) (string, error) {
			if client == "" {
				return byToken(r), nil
			}
			return client, nil
		})},
		{"WithKeys", httplimit.WithKeys(func(r *http.Request, client string) ([]engine.Request, error) {
			if client == "" {
				return []engine.Request{{Key: byToken(r), Cost: 1}, {Key: "all", Cost: 1}}, nil
			}
			return []engine.Request{{Key: client, Cost: 1}}, nil
		})},
	} {
		for _, addr := range []string{"", "@", "/run/app.sock"} {
			t.Run(tc.name+"/"+addr, func(t *testing.T) {
				e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
				var errs []error
				opts := []httplimit.Option{httplimit.WithOnError(func(_ *http.Request, err error) { errs = append(errs, err) })}
				if tc.opt != nil {
					opts = append(opts, tc.opt)
				}
				mw, err := httplimit.New(e, opts...)
				require.NoError(t, err)
				h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
				codes := []int{}
				for range 3 {
					r := httptest.NewRequest(http.MethodGet, "/", nil)
					r.RemoteAddr = addr
					r.Header.Set("X-Token", "t1")
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, r)
					codes = append(codes, rec.Code)
				}
				if tc.opt == nil {
					assert.Equal(t, []int{500, 500, 500}, codes)
					require.Len(t, errs, 3)
					assert.ErrorIs(t, errs[0], httplimit.ErrNoClientIP)
					return
				}
				assert.Equal(t, []int{204, 204, 429}, codes, "the token's key limits the request")
				assert.Empty(t, errs)
			})
		}
	}
}
