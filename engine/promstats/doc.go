// Package promstats exports an engine's counters to Prometheus: a Collector
// turns each reading of engine.Engine.Stats into constant metrics, so a
// registry scrape reads the engine's published counters and nothing else.
//
// Collecting never blocks admission. Stats reads counters the shards publish
// with atomic stores; it takes no lock and sends no message to a shard, so a
// scrape neither waits for a busy shard nor makes a request wait. A reading
// may lag a busy shard by a few messages (engine.Stats says how many) and
// is exact once the engine is closed.
//
// # Metrics
//
// Every name starts with the namespace "tokenshard". Counters end in _total;
// the rest are gauges. Without options only decisions_total, errors_total
// and the two allowall_ counters have a label, which says what was counted:
//
//	tokenshard_decisions_total{outcome}   counter  requests decided; outcome is "allowed" or "denied"
//	tokenshard_peeks_total                counter  Peek calls answered
//	tokenshard_refunds_total              counter  Refund calls answered
//	tokenshard_errors_total{kind}         counter  calls that ended with an error, caller-side ones included
//	tokenshard_keys                       gauge    keys tracked
//	tokenshard_keys_max                   gauge    the bound on keys tracked (engine.Engine.MaxKeys)
//	tokenshard_mailbox_depth              gauge    single requests and batch parts waiting for the shards
//	tokenshard_mailbox_high_water         gauge    most single requests found waiting for one shard at once
//	tokenshard_shard_cutovers_total       counter  cutovers taken part in, summed over the shards
//	tokenshard_shard_sweeps_total         counter  sweeps run, summed over the shards
//	tokenshard_pressure_sweeps_total      counter  background sweeps run because the key table was full
//	tokenshard_sweep_failures_total       counter  background sweeps that ended with an error
//	tokenshard_evictions_total            counter  keys evicted by sweeps
//	tokenshard_events_dropped_total       counter  sampled decisions dropped on a full event buffer
//	tokenshard_allowall_calls_total{outcome} counter AllowAll calls decided; outcome is "admitted" or "refused"
//	tokenshard_allowall_errors_total{kind}   counter AllowAll calls that ended with an error
//	tokenshard_holds_total                counter  AllowAll parts held, summed over the shards
//	tokenshard_holds_aborted_total        counter  holds given up for a cutover, sweep, snapshot or Close
//
// The error kinds are "invalid_key", "invalid_cost", "closed", "context",
// "clock_regression", "key_capacity" and "other", as in engine.Errors, and
// every kind and outcome is exported from the start, at 0, so rate() sees
// the first one. The two shard_ counters count once per shard: a cutover
// of an engine of 4 shards adds 4, which is why their names say shard.
//
// WithShardLabels gives tokenshard_keys, tokenshard_mailbox_depth and
// tokenshard_mailbox_high_water a "shard" label ("0" to the shard count
// less one) in place of their engine-wide value, to find a hot or stuck
// shard; sum() and max() over the label give the engine-wide values back.
// The number of series stays bounded by the shard count. The counters are
// never labelled by shard: keys are spread by a seeded hash, so their
// per-shard split says nothing a caller can act on.
//
// Counts are exported as float64, as Prometheus stores them: exact up to
// 2^53.
//
// The Collector covers an engine.Engine only. engine/redisstore's Store
// keeps different counters (redisstore.Stats); package
// engine/promstats/storestats exports them, as tokenshard_store_*_total,
// so that this package does not import Redis's client and redisstore does
// not import Prometheus.
//
// # Ownership
//
// A Collector is immutable after New: its descriptors are built once, and
// each Collect reads the engine's Stats into metrics it does not keep.
package promstats
