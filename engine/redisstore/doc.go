// Package redisstore is an engine.Admitter whose buckets live in Redis, for
// a service whose replicas must share one quota per key: with per-process
// buckets, N replicas admit N times the limit.
//
// A Store answers Allow, AllowBatch, EvictFull and ReplacePolicy with the
// engine's meaning (the contract in package engine's doc), and passes the
// same behaviour suite (engine/admissiontest). Code written against
// engine.Admitter, such as the engine/httplimit middleware, moves between the
// two unchanged:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
//	store, err := redisstore.New(ctx, redisstore.Config{
//		Client: rdb,
//		Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10},
//	})
//	if err != nil { ... }
//	mw, err := httplimit.New(store)
//
// # One script per decision
//
// A Lua script refills, decides and writes atomically (EVALSHA, loaded once
// and again after NOSCRIPT). AllowBatch sends about ChunkSize requests per
// script call and pipelines the calls: one round trip per batch. A script
// call is never sent twice: go-redis retries commands whose reply was lost,
// which for a script that may have run would take tokens twice, so the
// store sends its scripts as commands go-redis does not retry, and answers
// a lost reply by the failure rule below.
//
// The time authority is the Redis server's TIME, read inside the script, so
// replicas with skewed clocks cannot mint tokens. A server clock that steps
// back counts as no time at all: a bucket never moves its last update back,
// and there is no ErrClockRegression. Tests that need deterministic time set
// Config.Clock instead, which also turns expiries off.
//
// Lua numbers are doubles, exact only below 2^53, while units (tokens times
// 10^9) and their products reach 2^126. The script therefore computes on
// decimal strings split into base-10^7 limbs, exactly, over the engine's
// whole range: every valid Policy and cost. The tests compare it with the
// policy package on random and extreme values through a real server.
//
// # Eviction is expiry
//
// Each bucket expires at its exact time-to-full under its own limit (rounded
// up to the millisecond, plus 2 ms): a bucket is only ever dropped when it is
// full, as the engine's eviction rule requires, so EvictFull is only needed
// to reclaim memory at once. A cutover that could lengthen some bucket's
// time-to-full (a higher capacity, or a lower rate for its capacity) would
// let such a bucket expire early, so it clears every expiry before it
// publishes and sets each bucket's new one before it returns; a cutover that
// cannot (a higher rate, a lower capacity) needs no pass. See
// Store.ReplacePolicy.
//
// The store does not enforce a MaxKeys bound: expiry removes full buckets
// but cannot bound the number of partly filled ones. Bound memory with
// Redis's maxmemory and maxmemory-policy noeviction; a decision whose write
// Redis refuses for lack of memory returns engine.ErrKeyCapacity. Unlike the
// engine's key bound, that refuses existing keys too: Redis refuses every
// write once it is full. Any other maxmemory-policy lets Redis evict
// depleted buckets, which hands their owners a fresh burst.
//
// # Policies
//
// The policy in force, its cutover history and each bucket live under
// Config.Prefix. ReplacePolicy is a compare-and-set in Redis under a lock,
// and the script refuses a request sent under any other version, so every
// decision is made under the version in force; a store that meets a newer
// one reloads it and sends again. A bucket is brought up to date when it is
// next touched: it refills under the limit of the version it was last
// written under up to each cutover it missed, and is clamped at each. Keys
// under overrides are resolved by the client, per version when needed.
// HistoryVersions versions are retained; the cutover that would retain more
// first brings every bucket up to the version in force.
//
// If Redis loses everything (a restart without persistence), buckets start
// full again and the first store to call reinstalls the newest policy it
// knows, which may be older than the one in force before (a store that had
// not yet seen the last cutover). A failover to a replica that missed the
// last writes (replication is asynchronous) loses their decisions the same
// way. Run Redis with persistence (appendonly) where that matters. A
// bucket whose version Redis no longer retains (only if the policy keys
// alone were lost) restarts empty at the current cutover: a denial too
// many, never a free burst.
//
// Keys are Prefix + "policy", "history", "blobs", "lock", "pending", and
// Prefix + "k:" + key for each bucket. No store's prefix may begin with
// another's ("a:" and "a:k:" would see each other's keys).
//
// # Failures
//
// A decision that Redis cannot give by the call's deadline (the context's,
// or Config.Timeout if sooner) is answered by the rule the Config chooses:
// fail closed (the default: denied, RetryAfter Config.FailRetryAfter) or
// fail open (allowed), with a nil error; Config.OnError and Stats see every
// such answer. A decision never waits past its deadline, and service
// resumes by itself when Redis returns. Calls that are not decisions return
// an error wrapping ErrUnavailable instead; a pass over the keyspace bounds
// each exchange, not the whole pass.
//
// The store needs one Redis, 6.2 or later (tested with 7.0), or a primary
// behind Sentinel through redis.NewFailoverClient: one script touches the policy keys and every
// bucket of its chunk, which Redis Cluster only allows within one hash
// slot.
package redisstore
