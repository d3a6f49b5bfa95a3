// Package storestats exports an engine/redisstore Store's counters to
// Prometheus: a Collector turns each reading of redisstore.Store.Stats into
// constant metrics.
//
// It is a package of its own so that neither side pays for the other:
// engine/promstats does not import Redis's client (go-redis), and
// engine/redisstore does not import Prometheus. Only a program that imports
// this package links both.
//
// Collecting reads four atomic counters (redisstore.Store.Stats loads
// them) and nothing else: it takes no lock and sends nothing to Redis, so a
// scrape neither waits for Redis nor makes a request wait, and it works the
// same while Redis is down.
//
// # Metrics
//
// Every name starts with the namespace "tokenshard" (promstats.Namespace);
// all are counters, as redisstore.Stats defines them, and only
// degraded_total has a label:
//
//	tokenshard_store_decisions_total                    counter  requests decided by Redis
//	tokenshard_store_failures_total                     counter  requests answered by the fail-open or fail-closed rule
//	tokenshard_store_degraded_total{outcome="allowed"}  counter  of those, admitted (fail open)
//	tokenshard_store_degraded_total{outcome="denied"}   counter  of those, denied (fail closed)
//	tokenshard_store_retries_total                      counter  script calls repeated for a newer policy or a bucket's history
//
// The degraded_total series are the answers marked engine.Decision.Degraded
// (including those of a store that has not yet reached Redis since New):
// they add up to failures_total, split by what they told the caller, so a
// dashboard can show how much traffic went unlimited, or was turned away,
// because Redis could not decide it.
//
// The store_ names do not meet promstats' engine metrics, so one registry
// may hold both Collectors, for example in a program that keeps a local
// engine beside a shared store. Counts are exported as float64, exact up
// to 2^53.
//
// There is no runnable Example, since it would need a Redis server; the
// package's test TestCollectRealStore registers a Collector of a real Store
// and scrapes it through promhttp, the way a program would:
//
//	c, err := storestats.New(store)
//	if err != nil { ... }
//	prometheus.MustRegister(c)
//
// # Ownership
//
// A Collector is immutable after New: its descriptors are built once, and
// each Collect reads the store's Stats into metrics it does not keep. It is
// safe for concurrent use and may be registered with any number of
// registries.
package storestats
