package httplimit_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMain fails the package if any test leaves a goroutine behind: no
// ignores, because closed engines, closed servers and clients whose idle
// connections are closed own none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pol builds a policy without field names cluttering every call.
func pol(capacity, rate int64) policy.Policy {
	return policy.Policy{Version: 1, Capacity: capacity, TokensPerSecond: rate}
}

// newEngine starts an engine on a Manual clock at 0 (unless cfg has a clock)
// and closes it when the test ends.
func newEngine(t *testing.T, cfg engine.Config) (*engine.Engine, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(0)
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	e, err := engine.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, clk
}

// ok is the wrapped handler of most tests: 200 with body "ok".
var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "ok")
})

// serve starts a real HTTP server running h behind a middleware built from
// e and opts, and closes it (and its client's idle connections) when the
// test ends.
func serve(t *testing.T, e *engine.Engine, h http.Handler, opts ...httplimit.Option) *httptest.Server {
	t.Helper()
	mw, err := httplimit.New(e, opts...)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(h))
	t.Cleanup(srv.Close)
	return srv
}

// response is what a test checks of one answer.
type response struct {
	status int
	header http.Header
	body   string
}

// get sends one GET with the given header lines through srv's client.
func get(t *testing.T, srv *httptest.Server, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, res.Header, string(body)}
}
