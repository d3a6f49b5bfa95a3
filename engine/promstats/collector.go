package promstats

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenshard/tokenshard/engine"
)

// Namespace starts the name of every metric the Collector exports.
const Namespace = "tokenshard"

// Option configures New.
type Option func(*config)

// config is what the options set.
type config struct {
	shardLabels bool
}

// WithShardLabels exports the keys tracked and the mailbox depth and high
// water mark once per shard, with a "shard" label, instead of once for the
// engine (see the package doc).
func WithShardLabels() Option {
	return func(c *config) { c.shardLabels = true }
}

// Collector is a prometheus.Collector of one engine's Stats. It is safe for
// concurrent use, including concurrent Collect calls, and may be registered
// with any number of registries. It holds no mutable state, so it may be
// copied. Create it with New: the zero Collector has no descriptors and is
// not usable.
type Collector struct {
	e           *engine.Engine
	shardLabels bool
	desc        [numMetrics]*prometheus.Desc
}

// metric indexes the Collector's descriptors: each metric is defined once,
// in metrics.
type metric int

const (
	decisions metric = iota
	peeks
	refunds
	errorsByKind
	keys
	keysMax
	mailboxDepth
	mailboxHighWater
	shardCutovers
	shardSweeps
	pressureSweeps
	sweepFailures
	evictions
	eventsDropped
	allowAllCalls
	allowAllErrors
	holds
	holdsAborted
	numMetrics
)

// metrics gives each metric its name (after the namespace), help text and
// labels; a perShard one takes the "shard" label under WithShardLabels.
var metrics = [numMetrics]struct {
	name, help string
	labels     []string
	perShard   bool
}{
	decisions:        {"decisions_total", "Requests decided by the engine's shards, by outcome.", []string{"outcome"}, false},
	peeks:            {"peeks_total", "Peek calls answered.", nil, false},
	refunds:          {"refunds_total", "Refund calls answered.", nil, false},
	errorsByKind:     {"errors_total", "Calls that ended with an error, by kind, including those refused before reaching a shard.", []string{"kind"}, false},
	keys:             {"keys", "Keys tracked.", nil, true},
	keysMax:          {"keys_max", "The bound on keys tracked (MaxKeys).", nil, false},
	mailboxDepth:     {"mailbox_depth", "Single requests and batch parts waiting for the shards.", nil, true},
	mailboxHighWater: {"mailbox_high_water", "The most single requests found waiting for one shard at once.", nil, true},
	shardCutovers:    {"shard_cutovers_total", "Policy cutovers taken part in, summed over the shards.", nil, false},
	shardSweeps:      {"shard_sweeps_total", "Sweeps run, summed over the shards.", nil, false},
	pressureSweeps:   {"pressure_sweeps_total", "Background sweeps run because a new key found the key table full.", nil, false},
	sweepFailures:    {"sweep_failures_total", "Background sweeps that ended with an error.", nil, false},
	evictions:        {"evictions_total", "Keys evicted by sweeps.", nil, false},
	eventsDropped:    {"events_dropped_total", "Sampled decisions dropped on a full event buffer.", nil, false},
	allowAllCalls:    {"allowall_calls_total", "AllowAll calls decided, by outcome.", []string{"outcome"}, false},
	allowAllErrors:   {"allowall_errors_total", "AllowAll calls that ended with an error, by kind.", []string{"kind"}, false},
	holds:            {"holds_total", "AllowAll parts the shards held for, summed over the shards.", nil, false},
	holdsAborted:     {"holds_aborted_total", "Holds given up for a cutover, sweep, snapshot or Close, summed over the shards.", nil, false},
}

// errorKinds are the values of the kind label, in engine.Errors order.
var errorKinds = [...]struct {
	label string
	count func(engine.Errors) uint64
}{
	{"invalid_key", func(e engine.Errors) uint64 { return e.InvalidKey }},
	{"invalid_cost", func(e engine.Errors) uint64 { return e.InvalidCost }},
	{"closed", func(e engine.Errors) uint64 { return e.Closed }},
	{"context", func(e engine.Errors) uint64 { return e.Context }},
	{"clock_regression", func(e engine.Errors) uint64 { return e.ClockRegression }},
	{"key_capacity", func(e engine.Errors) uint64 { return e.KeyCapacity }},
	{"other", func(e engine.Errors) uint64 { return e.Other }},
}

// New returns a Collector of e's Stats. It returns ErrInvalidOption
// (wrapped) for a nil e or a nil Option. A zero Engine's metrics are all 0.
func New(e *engine.Engine, opts ...Option) (*Collector, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil engine", ErrInvalidOption)
	}
	var cfg config
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		o(&cfg)
	}
	c := &Collector{e: e, shardLabels: cfg.shardLabels}
	for m, d := range metrics {
		labels := d.labels
		if d.perShard && c.shardLabels {
			labels = []string{"shard"}
		}
		c.desc[m] = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", d.name), d.help, labels, nil)
	}
	return c, nil
}

// Describe sends the descriptor of every metric Collect sends.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.desc {
		ch <- d
	}
}

// Collect sends the metrics of one reading of the engine's Stats. It never
// blocks on the engine (see the package doc).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	t := &st.Total
	// Prometheus samples are float64: the integer counts convert here, at
	// the exporter's edge, exactly up to 2^53. No decision is made here.
	counter := func(m metric, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.desc[m], prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(m metric, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.desc[m], prometheus.GaugeValue, float64(v), labels...)
	}

	counter(decisions, t.Allowed, "allowed")
	counter(decisions, t.Denied, "denied")
	counter(peeks, t.Peeks)
	counter(refunds, t.Refunds)
	for _, k := range errorKinds {
		counter(errorsByKind, k.count(t.Errors), k.label)
	}
	if c.shardLabels {
		for i, s := range st.Shards {
			shard := strconv.Itoa(i)
			gauge(keys, s.Keys, shard)
			gauge(mailboxDepth, s.MailboxDepth, shard)
			gauge(mailboxHighWater, s.MailboxHighWater, shard)
		}
	} else {
		gauge(keys, t.Keys)
		gauge(mailboxDepth, t.MailboxDepth)
		gauge(mailboxHighWater, t.MailboxHighWater)
	}
	gauge(keysMax, int64(c.e.MaxKeys()))
	counter(shardCutovers, t.Cutovers)
	counter(shardSweeps, t.Sweeps)
	counter(pressureSweeps, st.PressureSweeps)
	counter(sweepFailures, st.SweepFailures)
	counter(evictions, t.Evicted)
	counter(eventsDropped, t.EventsDropped)
	counter(allowAllCalls, st.AllowAll.Admitted, "admitted")
	counter(allowAllCalls, st.AllowAll.Refused, "refused")
	for _, k := range errorKinds {
		counter(allowAllErrors, k.count(st.AllowAll.Errors), k.label)
	}
	counter(holds, t.Holds)
	counter(holdsAborted, t.HoldsAborted)
}
