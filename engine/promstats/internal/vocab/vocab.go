// Package vocab is the metric vocabulary tokenshard's Prometheus
// collectors share: the families that engine/promstats exports for an
// engine and engine/promstats/storestats for a Redis store, each defined
// once here, names, help and labels alike, so that one dashboard reads
// both backends and a registry that wraps them with a distinguishing
// label (prometheus.WrapRegistererWith) finds them consistent.
package vocab

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenshard/tokenshard/engine"
)

// Namespace starts the name of every metric (promstats.Namespace).
const Namespace = "tokenshard"

// Family is one metric family: its name after the namespace, help text and
// variable labels.
type Family struct {
	Name, Help string
	Labels     []string
}

// Desc returns f's descriptor.
func (f Family) Desc() *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", f.Name), f.Help, f.Labels, nil)
}

// The families both collectors export.
var (
	Decisions = Family{"decisions_total", "Requests answered with a decision, by outcome; each request of an AllowAll counts, with its call's outcome.", []string{"outcome"}}
	Peeks     = Family{"peeks_total", "Peek calls answered.", nil}
	Refunds   = Family{"refunds_total", "Refund calls answered.", nil}
	Errors    = Family{"errors_total", "Calls and batch requests that ended with an error, by kind, including those refused on the caller's side; not AllowAll calls.", []string{"kind"}}
	// AllowAllCalls and AllowAllErrors count AllowAll calls, one per call.
	AllowAllCalls  = Family{"allowall_calls_total", "AllowAll calls decided, by outcome.", []string{"outcome"}}
	AllowAllErrors = Family{"allowall_errors_total", "AllowAll calls that ended with an error, by kind.", []string{"kind"}}
)

// The values of Decisions' outcome label: a decision, and (a store's only)
// an answer of the failure rule, marked engine.Decision.Degraded.
const (
	Allowed         = "allowed"
	Denied          = "denied"
	DegradedAllowed = "degraded_allowed"
	DegradedDenied  = "degraded_denied"
)

// The values of AllowAllCalls' outcome label.
const (
	Admitted = "admitted"
	Refused  = "refused"
)

// ErrorKinds are the values of the kind label of Errors and AllowAllErrors,
// in engine.Errors order, each with its count.
var ErrorKinds = [...]struct {
	Label string
	Count func(engine.Errors) uint64
}{
	{"invalid_key", func(e engine.Errors) uint64 { return e.InvalidKey }},
	{"invalid_cost", func(e engine.Errors) uint64 { return e.InvalidCost }},
	{"closed", func(e engine.Errors) uint64 { return e.Closed }},
	{"context", func(e engine.Errors) uint64 { return e.Context }},
	{"clock_regression", func(e engine.Errors) uint64 { return e.ClockRegression }},
	{"key_capacity", func(e engine.Errors) uint64 { return e.KeyCapacity }},
	{"other", func(e engine.Errors) uint64 { return e.Other }},
}

// Counter sends a counter of d with value v. Prometheus samples are
// float64: the integer counts convert here, exactly up to 2^53.
func Counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// CollectErrors sends one counter of d per kind of e.
func CollectErrors(ch chan<- prometheus.Metric, d *prometheus.Desc, e engine.Errors) {
	for _, k := range ErrorKinds {
		Counter(ch, d, k.Count(e), k.Label)
	}
}
