package promstats

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/promstats/internal/vocab"
)

// Namespace starts the name of every metric the Collector exports.
const Namespace = vocab.Namespace

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

// metrics gives each metric its family (name after the namespace, help
// text and labels; those storestats exports too come from vocab); a
// perShard one takes the "shard" label under WithShardLabels.
var metrics = [numMetrics]struct {
	vocab.Family
	perShard bool
}{
	decisions:        {vocab.Decisions, false},
	peeks:            {vocab.Peeks, false},
	refunds:          {vocab.Refunds, false},
	errorsByKind:     {vocab.Errors, false},
	keys:             {vocab.Family{Name: "keys", Help: "Keys tracked."}, true},
	keysMax:          {vocab.Family{Name: "keys_max", Help: "The bound on keys tracked (MaxKeys)."}, false},
	mailboxDepth:     {vocab.Family{Name: "mailbox_depth", Help: "Single requests and batch parts waiting for the shards, in their mailboxes or kept aside behind an AllowAll."}, true},
	mailboxHighWater: {vocab.Family{Name: "mailbox_high_water", Help: "The most single requests found waiting for one shard at once."}, true},
	shardCutovers:    {vocab.Family{Name: "shard_cutovers_total", Help: "Policy cutovers taken part in, summed over the shards."}, false},
	shardSweeps:      {vocab.Family{Name: "shard_sweeps_total", Help: "Sweeps run, summed over the shards."}, false},
	pressureSweeps:   {vocab.Family{Name: "pressure_sweeps_total", Help: "Background sweeps run because a new key found the key table full."}, false},
	sweepFailures:    {vocab.Family{Name: "sweep_failures_total", Help: "Background sweeps that ended with an error."}, false},
	evictions:        {vocab.Family{Name: "evictions_total", Help: "Keys evicted by sweeps."}, false},
	eventsDropped:    {vocab.Family{Name: "events_dropped_total", Help: "Sampled decisions dropped on a full event buffer."}, false},
	allowAllCalls:    {vocab.AllowAllCalls, false},
	allowAllErrors:   {vocab.AllowAllErrors, false},
	holds:            {vocab.Family{Name: "holds_total", Help: "AllowAll parts the shards held for, summed over the shards."}, false},
	holdsAborted:     {vocab.Family{Name: "holds_aborted_total", Help: "Holds given up for a cutover, sweep, snapshot or Close, summed over the shards."}, false},
}

// New returns a Collector of e's Stats. It returns ErrInvalidOption
// (wrapped) for a nil e or a nil Option. A zero Engine's metrics are all
// 0; it has no shards, so under WithShardLabels it sends no per-shard
// gauge.
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
		f := d.Family
		if d.perShard && c.shardLabels {
			f.Labels = []string{"shard"}
		}
		c.desc[m] = f.Desc()
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
	// Prometheus samples are float64: the integer counts convert at the
	// exporter's edge (vocab.Counter), exactly up to 2^53. No decision is
	// made here.
	counter := func(m metric, v uint64, labels ...string) {
		vocab.Counter(ch, c.desc[m], v, labels...)
	}
	gauge := func(m metric, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.desc[m], prometheus.GaugeValue, float64(v), labels...)
	}

	counter(decisions, t.Allowed, vocab.Allowed)
	counter(decisions, t.Denied, vocab.Denied)
	counter(peeks, t.Peeks)
	counter(refunds, t.Refunds)
	vocab.CollectErrors(ch, c.desc[errorsByKind], t.Errors)
	if c.shardLabels {
		for i, s := range st.Shards {
			shard := strconv.Itoa(i)
			gauge(keys, s.Keys, shard)
			gauge(mailboxDepth, s.MailboxDepth+s.Waiting, shard)
			gauge(mailboxHighWater, s.MailboxHighWater, shard)
		}
	} else {
		gauge(keys, t.Keys)
		gauge(mailboxDepth, t.MailboxDepth+t.Waiting)
		gauge(mailboxHighWater, t.MailboxHighWater)
	}
	gauge(keysMax, int64(c.e.MaxKeys()))
	counter(shardCutovers, t.Cutovers)
	counter(shardSweeps, t.Sweeps)
	counter(pressureSweeps, st.PressureSweeps)
	counter(sweepFailures, st.SweepFailures)
	counter(evictions, t.Evicted)
	counter(eventsDropped, t.EventsDropped)
	counter(allowAllCalls, st.AllowAll.Admitted, vocab.Admitted)
	counter(allowAllCalls, st.AllowAll.Refused, vocab.Refused)
	vocab.CollectErrors(ch, c.desc[allowAllErrors], st.AllowAll.Errors)
	counter(holds, t.Holds)
	counter(holdsAborted, t.HoldsAborted)
}
