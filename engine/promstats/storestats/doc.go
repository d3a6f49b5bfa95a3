// Package storestats exports an engine/redisstore Store's counters to
// Prometheus: a Collector turns each reading of redisstore.Store.Stats into
// constant metrics.
//
// It is a package of its own so that neither side pays for the other:
// engine/promstats does not import Redis's client (go-redis), and
// engine/redisstore does not import Prometheus. Only a program that imports
// this package links both.
//
// Collecting reads the store's atomic counters (redisstore.Store.Stats
// loads them) and nothing else: it takes no lock and sends nothing to
// Redis, so a scrape neither waits for Redis nor makes a request wait, and
// it works the same while Redis is down.
//
// # Metrics
//
// Every name starts with the namespace "tokenshard" (promstats.Namespace);
// all are counters, as redisstore.Stats defines them. The first six
// families are engine/promstats' own, under the same names, help and
// labels, counted by the same rules, so that one dashboard serves an
// engine and a store; the last six are the store's alone:
//
//	tokenshard_decisions_total{outcome}       counter  requests answered, AllowAll's included; outcome is "allowed", "denied", "degraded_allowed" or "degraded_denied"
//	tokenshard_peeks_total                    counter  Peek calls answered
//	tokenshard_refunds_total                  counter  Refund calls answered
//	tokenshard_errors_total{kind}             counter  calls and batch requests that ended with an error, caller-side ones included
//	tokenshard_allowall_calls_total{outcome}  counter  AllowAll calls answered; outcome is "admitted" or "refused"
//	tokenshard_allowall_errors_total{kind}    counter  AllowAll calls that ended with an error
//	tokenshard_store_decisions_total          counter  requests the Redis script decided, those it answered with an error included
//	tokenshard_store_retries_total            counter  script calls sent again: a newer policy or a cutover under way, a bucket's history, a script Redis lacked, an FCALL refused for memory, a slot being migrated
//	tokenshard_store_local_decisions_total    counter  requests a lease decided in the process, without Redis (redisstore.Config.Leases)
//	tokenshard_store_leased_tokens_total      counter  tokens Redis granted as leases
//	tokenshard_store_returned_tokens_total    counter  leased tokens given back unspent
//	tokenshard_store_forfeited_tokens_total   counter  leased tokens given up unspent
//
// decisions_total counts every request once, as promstats does: each
// Allow, each Charge ("allowed", or "degraded_allowed" when Redis could
// not take it), each request of an AllowBatch, and each request of an AllowAll
// that returned a Decision, all with the call's outcome. "allowed" and
// "denied" are Redis's decisions, and with redisstore.Config.Leases also
// those a lease made in the process (redisstore.Stats.Allowed and Denied);
// "degraded_allowed" and "degraded_denied" are the answers of the failure
// rule, marked engine.Decision.Degraded, when Redis could not decide
// (fail open and fail closed; redisstore.Stats.DegradedAllowed and
// DegradedDenied, which add up to Failures), including those of a store
// that has not yet reached Redis since New. An engine never degrades and
// exports only the first two outcomes, so sum(rate(...)) by outcome shows
// all traffic on either backend, and an outage shows as degraded_ traffic
// rather than as a drop. An AllowAll answered by the failure rule counts
// as "admitted" or "refused" in allowall_calls_total, as its Decision says.
//
// The error kinds are promstats': "invalid_key", "invalid_cost" (an
// engine.ErrCostExceedsCapacity too), "closed", "context",
// "clock_regression" (always 0: Redis's TIME is the store's clock),
// "key_capacity" (Redis out of memory) and "other" (engine.ErrNilContext,
// ErrUnavailable from a Peek or Refund Redis did not answer,
// ErrCrossShard); see redisstore.Stats.Errors. Every kind and outcome is
// exported from the start, at 0.
//
// store_decisions_total is the Redis side of the work: it counts the
// requests Redis decided as decisions_total's "allowed" and "denied" do,
// and also those it answered with an error, such as a cost above every
// capacity; with leases, the leases Redis decided too, and not the
// requests a lease decided in the process.
//
// The four lease families are redisstore.Stats' Local, LeasedTokens,
// ReturnedTokens and ForfeitedTokens, 0 for a store without leases. The
// share of traffic decided without Redis is local_decisions_total over the
// "allowed" and "denied" decisions_total; forfeited tokens are quota no
// request will use until the bucket refills them (see the redisstore
// package doc's Leases section).
//
// Since the names are promstats', one registry holds an engine's Collector
// and a store's only under a label that tells them apart, for example a
// program that keeps a local engine beside a shared store:
//
//	prometheus.WrapRegistererWith(prometheus.Labels{"backend": "engine"}, reg).MustRegister(engineCollector)
//	prometheus.WrapRegistererWith(prometheus.Labels{"backend": "redis"}, reg).MustRegister(storeCollector)
//
// Counts are exported as float64, exact up to 2^53.
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
