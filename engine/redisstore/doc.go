// Package redisstore is an engine.Admitter whose buckets live in Redis, for
// a service whose replicas must share one quota per key: with per-process
// buckets, N replicas admit N times the limit.
//
// A Store answers Allow, AllowBatch, AllowAll, Peek, Refund, EvictFull and
// ReplacePolicy with the engine's meaning (the contract in package engine's
// doc), rates of any period and bands included, and passes the same
// behaviour suite (engine/admissiontest). Code written against
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
// Concurrent single Allows are merged into shared script calls, with no
// goroutine of the store's: a caller that finds fewer than two calls of
// single Allows in flight sends its own at once, so an idle store adds no
// latency; one that finds two waits, and when a call returns its caller
// hands every waiting request (up to ChunkSize) to one of theirs, which
// sends them as one call. A caller waits only until its own deadline: one
// whose deadline passes first gets the failure rule below, and one whose
// context is canceled returns its error, except the one sending the call,
// which waits for its answer (at most until its deadline) so as not to cut
// the call short for the others.
//
// AllowAll is one script call over all its keys (at most
// engine.MaxAllowAll), each with its requests' costs summed: the script
// decides every key at the call's one TIME and writes the buckets only if
// every key holds its cost, so a refusal writes nothing and no store on
// the prefix ever sees part of a call. It uses the decision path Allow
// does, in a mode that holds the writes back until every key is decided.
// When Redis cannot answer, the failure rule answers the call as a whole:
// denied (fail closed) or admitted (fail open), never some keys of it. See
// Store.AllowAll.
//
// The time authority is the Redis server's TIME, read inside the script, so
// replicas with skewed clocks cannot mint tokens. A server clock that steps
// back counts as no time at all: a bucket never moves its last update back,
// and there is no ErrClockRegression. Tests that need deterministic time set
// Config.Clock instead, which also turns expiries off.
//
// A band refilled at N tokens per P ns counts one token as P units, so a
// refill over e ns adds exactly e*N units (for a rate per second, one token
// is 10^9 units). Lua numbers are doubles, exact only below 2^53, while
// units and their products reach 2^126 and more. The script therefore
// computes on decimal strings split into base-10^7 limbs, exactly, over the
// engine's whole range: every valid Policy and cost. A key of one band
// whose capacity is below 2^52 units takes a fast path in doubles, exact
// there. The one rounding is the policy's own: a cutover that changes a
// band's period moves its balance to the new unit rounding down. A request
// is decided over every band of its key in the same script call, so it is
// atomic across bands as it is across keys of a batch. The tests compare
// the script with math/big on random and extreme values through a real
// server.
//
// # Eviction is expiry
//
// Each bucket expires at its exact time-to-full under its own limit, that of
// its slowest band (rounded up to the millisecond, plus 2 ms): a bucket is
// only ever dropped when every band is full, as the engine's eviction rule
// requires, so EvictFull is only needed to reclaim memory at once. A cutover
// that could lengthen some bucket's time-to-full (a higher capacity of a
// band it keeps, or a lower rate for its capacity) would let such a bucket
// expire early, so it clears every expiry before it publishes and sets each
// bucket's new one before it returns; a cutover that cannot (a higher rate,
// a lower capacity, a band added, which starts full, or dropped) needs no
// pass. See Store.ReplacePolicy.
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
// another's ("a:" and "a:k:" would see each other's keys). A bucket is a
// string of decimals: "units last version capacity rate" for its primary
// band, the rate "N" for N per second or "N/P" for N per P ns, then the
// units of each further band. A key of one band per second (every policy
// written with TokensPerSecond) has the layout it always had, byte for
// byte; each band adds a space and its units, up to 39 digits.
//
// # Rolling upgrades
//
// Stores built before rates of any period and bands existed cannot read a
// policy whose Refill (the policy's or an override's) is other than per
// second, or that has Bands, nor the buckets and history entries such a
// policy writes. Install one only once every store on the prefix has been
// upgraded. Plain policies (TokensPerSecond and no bands) are written as
// they always were, so older and newer stores may share a prefix while
// only plain policies are installed; an older store still reads an
// override Match that is not valid UTF-8 with U+FFFD in place of its
// invalid bytes, as it always did.
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
// behind Sentinel through redis.NewFailoverClient: one script touches the
// policy keys and every bucket of its chunk, which Redis Cluster only
// allows within one hash slot. Redis Cluster is not supported, so every
// key of an AllowAll is on the one server its script runs on.
package redisstore
