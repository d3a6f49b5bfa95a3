// Package promstats exports an engine's counters to Prometheus: a Collector
// turns each reading of engine.Engine.Stats into constant metrics, so a
// registry scrape reads the engine's published counters and nothing else.
//
// Collecting never blocks admission. Stats reads counters the shards publish
// with atomic stores; it takes no lock and sends no message to a shard, so a
// scrape neither waits for a busy shard nor makes a request wait. A scrape
// made after a call has returned counts it, and the keys it created; only
// the hold counts and the keys an AllowAll created may lag a busy shard by
// a few messages (engine.Stats says which and how many).
//
// # Metrics
//
// Every name starts with the namespace "tokenshard". Counters end in _total;
// the rest are gauges. Without options only decisions_total, errors_total
// and the two allowall_ counters have a label, which says what was counted:
//
//	tokenshard_decisions_total{outcome}       counter  requests decided, AllowAll's included; outcome is "allowed" or "denied"
//	tokenshard_peeks_total                    counter  Peek calls answered
//	tokenshard_refunds_total                  counter  Refund calls answered
//	tokenshard_errors_total{kind}             counter  calls and batch requests that ended with an error, caller-side ones included
//	tokenshard_keys                           gauge    keys tracked
//	tokenshard_keys_max                       gauge    the bound on keys tracked (engine.Engine.MaxKeys)
//	tokenshard_mailbox_depth                  gauge    single requests and batch parts waiting for the shards (kept aside behind an AllowAll too)
//	tokenshard_mailbox_high_water             gauge    most single requests found waiting for one shard at once
//	tokenshard_shard_cutovers_total           counter  cutovers taken part in, summed over the shards
//	tokenshard_shard_sweeps_total             counter  sweeps run, summed over the shards
//	tokenshard_pressure_sweeps_total          counter  background sweeps run because the key table was full
//	tokenshard_sweep_failures_total           counter  background sweeps that ended with an error
//	tokenshard_evictions_total                counter  keys evicted by sweeps
//	tokenshard_events_dropped_total           counter  sampled decisions dropped on a full event buffer
//	tokenshard_allowall_calls_total{outcome}  counter  AllowAll calls decided; outcome is "admitted" or "refused"
//	tokenshard_allowall_errors_total{kind}    counter  AllowAll calls that ended with an error
//	tokenshard_holds_total                    counter  AllowAll parts held, summed over the shards
//	tokenshard_holds_aborted_total            counter  holds given up for a cutover, sweep, snapshot or Close
//
// decisions_total counts every decision, whichever call made it, as
// engine.Stats does: each Allow (Wait's too), each Charge (never refused,
// so always "allowed": httplimit's Settle adds one per key it charges), each
// request of an AllowBatch, and each request of an AllowAll that returned
// a Decision, all "allowed" when the call was admitted and all "denied"
// when it was refused (it took nothing from any key); a request that names a key
// already named counts again. So an AllowAll of 3 requests adds 3, and a
// dashboard built on decisions_total sees the same traffic whether a
// program calls Allow per key or AllowAll over its keys. The call itself
// is counted once more, apart, in allowall_calls_total. A failed AllowAll
// counts no decision, and its error is in allowall_errors_total, not in
// errors_total.
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
// # One vocabulary with the Redis store
//
// The Collector covers an engine.Engine only. Package
// engine/promstats/storestats exports an engine/redisstore Store's counters
// (redisstore.Stats), so that this package does not import Redis's client
// and redisstore does not import Prometheus. It exports the same families
// under the same names, help and labels where they apply: decisions_total
// (counted alike, AllowAll's included), peeks_total, refunds_total,
// errors_total and the two allowall_ counters, with the same error kinds.
// So one dashboard serves both backends. decisions_total of a store has
// two more outcomes, "degraded_allowed" and "degraded_denied", for the
// answers of its failure rule when Redis cannot decide; an engine never
// gives one, and exports the two outcomes above only. The engine's other
// families (keys, mailboxes, shards, sweeps, holds) have no counterpart in
// a store, and the store's own are named tokenshard_store_*.
//
// Since the names are shared, one registry holds both Collectors only
// under a label that tells them apart, for example:
//
//	prometheus.WrapRegistererWith(prometheus.Labels{"backend": "engine"}, reg).MustRegister(engineCollector)
//	prometheus.WrapRegistererWith(prometheus.Labels{"backend": "redis"}, reg).MustRegister(storeCollector)
//
// So do two engines, or two stores, in one process: each under a label of
// its own ({"limiter": "api"}, {"limiter": "login"}). Registered bare, the
// second is refused with a prometheus.AlreadyRegisteredError whose
// ExistingCollector is the first one's; the usual recovery, using that
// collector, would export the first engine's counts for both.
//
// # Ownership
//
// A Collector is immutable after New: its descriptors are built once, and
// each Collect reads the engine's Stats into metrics it does not keep.
package promstats
