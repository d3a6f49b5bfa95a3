package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// BenchmarkHandler measures the middleware's own work for an admitted
// request, the wrapped handler doing nothing: with the default options
// (the client's key, cost 1), with WithKey and WithCost (an estimate the
// handler may settle), and that handler settling it with Settle.
func BenchmarkHandler(b *testing.B) {
	e, err := engine.New(engine.Config{Policy: pol(1<<50, 1<<40)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	settle := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if err := httplimit.Settle(r, 3); err != nil {
			b.Fatal(err)
		}
	})
	for _, c := range []struct {
		name string
		opts []httplimit.Option
		h    http.Handler
	}{
		{"path=default", nil, nop},
		{"path=cost", []httplimit.Option{httplimit.WithKey(userKey), httplimit.WithCost(costHeader)}, nop},
		{"path=settle", []httplimit.Option{httplimit.WithKey(userKey), httplimit.WithCost(costHeader)}, settle},
	} {
		b.Run(c.name, func(b *testing.B) {
			mw, err := httplimit.New(e, c.opts...)
			if err != nil {
				b.Fatal(err)
			}
			h := mw.Handler(c.h)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-User", "u")
			r.Header.Set("Cost", "2")
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
	}
}
