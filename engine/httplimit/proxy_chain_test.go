package httplimit_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// TestRealProxyRotatingClient puts a real reverse proxy (httputil's, at
// 127.0.0.1, the one trusted address) between the server and a client at
// 127.0.0.2 that rotates the address it forges: each request's header
// ends in an open quote (Forwarded) or another address (X-Forwarded-For),
// and the proxy appends the peer it saw, on the client's line for
// Forwarded and as httputil does for X-Forwarded-For. The client is one
// key, whatever it writes: capacity 3 admits 3 of 50.
func TestRealProxyRotatingClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on this host: %v", err)
	}
	_ = ln.Close()
	for _, h := range []httplimit.ProxyHeader{httplimit.Forwarded, httplimit.XForwardedFor} {
		t.Run(h.String(), func(t *testing.T) {
			const capacity, requests = 3, 50
			e, _ := newEngine(t, engine.Config{Policy: pol(capacity, 1)})
			srv := serve(t, e, ok, httplimit.WithTrustedProxies(h, mustPrefix("127.0.0.1/32")))
			target, err := url.Parse(srv.URL)
			require.NoError(t, err)
			proxyTransport := &http.Transport{}
			t.Cleanup(proxyTransport.CloseIdleConnections)
			proxy := httptest.NewServer(&httputil.ReverseProxy{Transport: proxyTransport, Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				if h == httplimit.XForwardedFor {
					pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
					pr.SetXForwarded()
					return
				}
				peer, _, _ := net.SplitHostPort(pr.In.RemoteAddr)
				lines := pr.In.Header.Values("Forwarded")
				if len(lines) == 0 {
					lines = []string{"for=" + peer}
				} else {
					lines[len(lines)-1] += ", for=" + peer
				}
				pr.Out.Header["Forwarded"] = lines
			}})
			t.Cleanup(proxy.Close)
			client := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
			t.Cleanup(client.CloseIdleConnections)

			count := map[int]int{}
			for i := range requests {
				req, err := http.NewRequest(http.MethodGet, proxy.URL, nil)
				require.NoError(t, err)
				forged := fmt.Sprintf("198.51.100.%d", i+1)
				if h == httplimit.Forwarded {
					req.Header.Set("Forwarded", "for="+forged+`;x="`)
				} else {
					req.Header.Set("X-Forwarded-For", forged)
				}
				resp, err := client.RoundTrip(req)
				require.NoError(t, err)
				_ = resp.Body.Close()
				count[resp.StatusCode]++
			}
			assert.Equal(t, map[int]int{http.StatusOK: capacity, http.StatusTooManyRequests: requests - capacity}, count)
			assert.Equal(t, 1, e.KeyCount())
			assert.Equal(t, int64(0), remaining(t, e, "127.0.0.2"))
		})
	}
}
