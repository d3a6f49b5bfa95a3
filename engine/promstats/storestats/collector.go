package storestats

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenshard/tokenshard/engine/promstats"
	"github.com/tokenshard/tokenshard/engine/redisstore"
)

// Collector is a prometheus.Collector of one redisstore.Store's Stats.
// Create it with New: the zero Collector has no descriptors and is not
// usable.
type Collector struct {
	s                                    *redisstore.Store
	decisions, failures, degraded, retry *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a Collector of s's Stats. It returns an error wrapping
// promstats.ErrInvalidOption for a nil s.
func New(s *redisstore.Store) (*Collector, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", promstats.ErrInvalidOption)
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(promstats.Namespace, "store", name), help, nil, nil)
	}
	return &Collector{
		s:         s,
		decisions: desc("decisions_total", "Requests decided by Redis."),
		failures:  desc("failures_total", "Requests answered by the fail-open or fail-closed rule because Redis could not decide them."),
		degraded: prometheus.NewDesc(prometheus.BuildFQName(promstats.Namespace, "store", "degraded_total"),
			"Requests answered by the failure rule (Decision.Degraded), by outcome: allowed (fail open) or denied (fail closed).",
			[]string{"outcome"}, nil),
		retry: desc("retries_total", "Script calls repeated for a newer policy or a bucket's history."),
	}, nil
}

// Describe sends the descriptors of the four metrics Collect sends.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.decisions
	ch <- c.failures
	ch <- c.degraded
	ch <- c.retry
}

// Collect sends one reading of the store's Stats. It reads atomics only and
// never talks to Redis (see the package doc).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	// Prometheus samples are float64: exact up to 2^53 (see promstats).
	ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(st.Decisions))
	ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(st.Failures))
	ch <- prometheus.MustNewConstMetric(c.degraded, prometheus.CounterValue, float64(st.DegradedAllowed), "allowed")
	ch <- prometheus.MustNewConstMetric(c.degraded, prometheus.CounterValue, float64(st.DegradedDenied), "denied")
	ch <- prometheus.MustNewConstMetric(c.retry, prometheus.CounterValue, float64(st.Retries))
}
