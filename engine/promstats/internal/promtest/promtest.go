// Package promtest is test support for tokenshard's Prometheus
// collectors: it scrapes a collector the way a Prometheus server would.
package promtest

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Scrape serves c through promhttp from a fresh pedantic registry, which
// checks every metric against the descriptors Describe sent, and parses the
// text exposition it answers with.
func Scrape(t testing.TB, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	return Parse(t, ScrapeText(t, c))
}

// ScrapeText is Scrape's exposition, as the server answered it.
func ScrapeText(t testing.TB, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, expfmt.TypeTextPlain, expfmt.ResponseFormat(rec.Result().Header).FormatType())
	return rec.Body.String()
}

// Parse parses a text exposition.
func Parse(t testing.TB, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	return mfs
}

// Promtool runs "promtool check metrics" on a text exposition, which must
// pass without a word, if promtool is installed; if not, it logs so and
// checks nothing (testutil.CollectAndLint runs the same linter in process).
func Promtool(t testing.TB, text string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed: the exposition was not checked by it")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "promtool check metrics")
}
