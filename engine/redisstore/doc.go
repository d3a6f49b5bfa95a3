// Package redisstore is an engine.Admitter whose buckets live in Redis, for
// a service whose replicas must share one quota per key: with per-process
// buckets, N replicas admit N times the limit.
//
// A Store answers Allow, AllowBatch, AllowAll, Peek, Refund, Charge,
// EvictFull and ReplacePolicy with the engine's meaning (the contract in
// package engine's doc), rates of any period, bands and debts included, and
// passes the same behaviour suite (engine/admissiontest). Code written against
// engine.Admitter, such as the engine/httplimit middleware, moves between the
// two unchanged:
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr:                  "redis:6379",
//		ContextTimeoutEnabled: true, // required: a call never outlives its deadline
//		DialerRetries:         1,    // while Redis is down, answer at once (see Failures)
//	})
//	store, err := redisstore.New(ctx, redisstore.Config{
//		Client: rdb,
//		Policy: policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 10},
//	})
//	if err != nil { ... }
//	mw, err := httplimit.New(store)
//
// # One script per decision
//
// A Lua script refills, decides and writes atomically. It is loaded as a
// Redis FUNCTION library (named after the script's hash, so stores of
// different versions on one server each call their own) and called with
// FCALL; where FUNCTION is missing (Redis 6) or refused, the store sends
// it with EVALSHA instead, as it does for one call that Redis refuses for
// lack of memory before it runs (a FUNCTION that may write is refused
// whole; a script only at its first write, so a call whose requests are
// all denials is still answered; in a call that also writes, every
// request answers engine.ErrKeyCapacity, concurrent single Allows shared
// into one call included).
// Either is loaded again after "Function not found" or NOSCRIPT. Every key
// the decide script touches is one of its declared keys, so it also runs
// where undeclared keys are refused (DragonflyDB, which has no FUNCTION and
// takes EVALSHA). FCALL is kept because it costs Redis less: the library's
// functions are made once, at load, where a script sent with EVALSHA makes
// them anew on every call. A call
// answers in a few integers and strings per request. AllowBatch sends about
// ChunkSize requests per script call and pipelines the calls: one round
// trip per batch, and one more for each further ChunkSize requests of a
// key repeated more often than that, so that no call holds Redis long (a
// call of ChunkSize requests on the fast path takes well under a
// millisecond; a request off it, on limbs or with bands, costs the script
// several times as much, and counts as several in that bound). A call of
// distinct keys reads their buckets in one MGET; a call in which a key of
// the fast path (below) repeats reads and writes its bucket once, and one
// off it reads and writes its bucket once per request. A script
// call is never sent twice: go-redis retries commands whose reply was lost,
// which for a script that may have run would take tokens twice, so the
// store sends its scripts as commands go-redis does not retry, and answers
// a lost reply by the failure rule below.
//
// Concurrent single Allows are merged into shared script calls. They
// queue per destination: on a cluster per virtual shard, so that a
// combined call touches one master and a slow master holds up only its own
// shards' calls; on one server in one queue. A caller that finds no
// request waiting in its queue and fewer than two of its calls in flight
// sends its own at once, so an idle store adds no latency; one that finds
// two waits, and when a call returns with requests waiting, a goroutine
// takes its place in flight and sends them, up to ChunkSize per call,
// until none is left, then exits. After each call it lets the callers it
// answered run before it takes the next batch, so that those that call
// again at once go in it rather than in the call after. A caller waits
// only until its own deadline: one whose deadline passes first gets the
// failure rule below (a request not yet sent is then not sent), and one
// whose context is canceled before its request is taken into a call
// returns its error (once taken, Redis may take its cost: it waits for the
// answer, as a call of its own does); neither cuts a shared call short for
// the others. Each request is answered and counted in Stats
// once: by Redis's answer if the call returns before its caller gives up,
// else by the failure rule.
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
// nor is it refilled up to a cutover instant its server's TIME has not
// reached, and there is no ErrClockRegression; a bucket last updated at an
// instant TIME has not reached refills nothing until then, and a denial's
// RetryAfter and a ResetAfter count that time too, so Wait sleeps through
// it. One that steps forward refills every bucket by the step's worth of
// tokens, up to its capacity. Tests that need deterministic time set
// Config.Clock instead, which also turns expiries off. On Redis Cluster
// each virtual shard decides at its master's TIME: keep the masters' clocks
// in step (NTP), since a slot that moves to a master whose clock is ahead
// refills its buckets by the difference.
//
// A band refilled at N tokens per P ns counts one token as P units, so a
// refill over e ns adds exactly e*N units (for a rate per second, one token
// is 10^9 units). Lua numbers are doubles, exact only below 2^53, while
// units and their products reach 2^126 and more. The script therefore
// computes on decimal strings split into base-10^7 limbs, exactly, over the
// engine's whole range: every valid Policy and cost. A key of one band
// with a capacity of at most 2^52 tokens and N*P below 2^52 (every rate up
// to 4.5 million a second, for instance) takes a fast path in doubles: its
// balance is kept as whole tokens and the fraction of a token in units,
// and a refill over e = q*P + r ns as q*N tokens and r*N units, so every
// value is an integer below 2^53, exact, or a product that passes 2^53,
// which compares above the capacity exactly. The fast path reads the
// server's TIME as seconds and microseconds without making a decimal of
// it, and writes nothing on a denial: the bucket it leaves refills to the
// same balance at the same instant, and its expiry stands. The one
// rounding is the policy's own: a cutover that changes a band's period
// moves its balance to the new unit rounding down. A request
// is decided over every band of its key in the same script call, so it is
// atomic across bands as it is across keys of a batch. The tests compare
// the script with math/big on random and extreme values through a real
// server.
//
// # Eviction is expiry
//
// Each bucket expires at its exact time-to-full under its own limit, that of
// its slowest band (rounded up to the millisecond, plus 2 ms), or later,
// never earlier: a bucket is only ever dropped when every band is full, as
// the engine's eviction rule requires, so EvictFull is only needed to
// reclaim memory at once. A bucket of one band (the compact format) gets a
// sixteenth of its time-to-full to spare, and records the expiry it was
// given; the writes that need no later one keep it, which spares Redis an
// update of its expiries on most writes, for keys that live at most that
// sixteenth longer. A cutover
// that could lengthen some bucket's time-to-full (a higher capacity of a
// band it keeps, or a lower rate for its capacity) would let such a bucket
// expire early, so it clears every expiry before it publishes and sets each
// bucket's new one before it returns; a cutover that cannot, from any
// balance a band may hold, a debt of a full capacity included (a band kept
// at a capacity no higher and a rate no lower, a band added, which starts
// full, or dropped), needs no pass. See Store.ReplacePolicy.
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
// Each version's policy is stored whole, about 60 bytes an override: a
// store reads and decodes it at New and when it meets the version, and the
// cutover that records it hands it to Redis in one script call, which
// holds Redis while it copies it (a policy of a million overrides, some 60
// MB, takes seconds of the process's CPU and a good part of a second of
// Redis's).
// HistoryVersions versions are retained (fewer while their overrides are
// many: see Store.ReplacePolicy); the cutover that would retain more first
// brings every bucket up to the version in force. A pass over the
// keyspace (such a cutover's, a lengthening one's, EvictFull's, KeyCount's)
// walks every key of the server's database with SCAN, other prefixes' and
// programs' too, so its time grows with all of them: a prefix of a
// thousand buckets on a server holding a million other keys takes ten to
// twenty times as long as it would alone. Give a store whose passes must be
// quick a database of its own.
//
// If Redis loses everything (a restart without persistence), buckets start
// full again and the first store to call reinstalls the newest policy it
// knows, which may be older than the one in force before (a store that had
// not yet seen the last cutover). A store made by New after the loss and
// before every running store has called again draws a new key map; each
// virtual shard holds a copy of the map in force and refuses a call whose
// keys another map placed, so a running store adopts the new map at its next
// call, and a key keeps one bucket. (A prefix set up anew with another
// number of virtual shards, Config.VirtualShards, or another
// Config.IgnoreKeyTags cannot be adopted: the running store's decisions are
// then answered by the failure rule, and OnError says why; restart the
// process with the prefix's settings.) A failover to a replica that missed
// the last writes (replication is asynchronous) loses their decisions as a
// restart without persistence does. Where that matters, run Redis with
// appendonly yes (a kill -9 then loses nothing with appendfsync everysec or
// always; without it, every bucket drained since the last snapshot is full
// again), and against a failover give the store a client passed to
// WaitForReplicas, so that no decision counts before a replica holds it
// (behind Sentinel, every replica: see Failures). The repository's README
// has the measured figures and the command that measures them. A bucket
// whose version Redis no longer retains (only if the policy keys alone were
// lost) restarts empty at the current cutover: a denial too many, never a
// free burst. The keys under a prefix are the stores' alone: a value no
// store wrote at a bucket's key (another program's, or one edited by hand)
// is outside what this package promises: a call that meets one may be
// answered by the failure rule, with every request of its script call, until
// the key is deleted. So is a value of another type at a policy key, which
// fails the calls that read it with Redis's WRONGTYPE until it is deleted.
//
// Keys are Prefix + "{" + tag + "}" + name. The prefix's global keys share
// one tag, "g" and a hash of the prefix: "policy" (the version in force,
// the number of virtual shards, the key map, a cluster cutover's record),
// "history" (every retained version, oldest first), "blobs" (the retained
// policies) and "lock" (the cutover lock). Each bucket belongs to one of
// Config.VirtualShards virtual shards (DefaultVirtualShards, 16, unless
// set; the first store on a prefix stores the number, and later stores
// use it), chosen by the prefix's key map: shard = SipHash-2-4(seed, key)
// mod the number, where a key holding a hash tag (its first "{...}", not
// empty) is hashed by the tag alone, so keys sharing a tag share a shard
// (unless the prefix ignores tags: see below). The seed is 16 random bytes
// (crypto/rand) that the first store on a prefix draws and stores in
// "policy", in the script call that installs the prefix's first policy, so
// only one is ever stored; every later store reads it at New, before it
// decides anything. So every process places a key alike, and nobody who
// cannot read Redis can tell which keys share a shard: a client that picks
// the text of its keys cannot crowd them into one shard (one master of a
// cluster) by trying keys against a known hash. A shard's keys share its
// own tag, chosen so that the shards' hash slots spread evenly over the
// 16384 (and so over the masters of a cluster whose slots are split
// evenly; for a prefix that leaves a "{" open, Redis hashes the prefix's
// text after it with each tag, and the tags are chosen for that text; a
// prefix holding a closed tag puts every key in that tag's slot): "p"
// (its copy of the version in force, and of the key map), "h" (its copy
// of the history, with the cutover instants the script replays), "n" (its
// pending flag) and "k:" + key for each bucket. On a
// cluster one script call touches one shard's keys, so one hash slot; on
// one server a call may hold buckets of any shards, and reads shard 0's
// copy of the policy state (every copy moves in the same pipelines).
//
// A hash tag lets whoever writes a key choose its shard. Keys built from
// text a client controls (an API token, a header, a path) would let that
// client put "{x}" in all of them and send its whole load to one shard:
// for such keys set Config.IgnoreKeyTags, and every key is hashed whole,
// braces and all. The price is co-location: keys then share a shard only
// by chance, so on a cluster AllowAll over more than one key mostly
// returns ErrCrossShard (on one server AllowAll takes keys of any shards
// either way). To keep AllowAll on a cluster with client text in the
// keys, leave IgnoreKeyTags off and start every key with a tag of text
// the client does not control ("{" + tenant + "}" + token): only a key's
// first "{...}" counts, so braces in the token after it change nothing,
// and each tenant's keys share one shard. The setting, like the seed, is
// stored with the prefix by its first store; a store set otherwise fails
// at New with ErrKeyTags.
// A prefix that holds a hash tag of its own puts every key in that tag's
// one slot: it works, nothing spreads. No store's prefix may begin with
// another's. A bucket of a key whose limit the fast path takes is written
// compact, by either path (so a bucket the general path brings through a
// cutover is on the fast path again at its next call): the byte 2, then
// its whole tokens, the fraction in units and the last update's seconds as
// three little-endian doubles, the update's ns and the expiry it was given
// (in ms after that update; 0 if none is recorded) as two little-endian
// 32-bit unsigned integers, then "version capacity rate" as text. Any
// other bucket is a string of decimals: "units last version capacity rate"
// for its primary band, the rate "N" for N per second or "N/P" for N per P
// ns, then the units of each further band (up to 39 digits each). The
// script reads both formats.
//
// # Redis Cluster
//
// Config.Client may be a *redis.ClusterClient (a *redis.Client pointed at
// one node of a cluster fails at New: CROSSSLOT or MOVED). A decision's
// script call runs in its key's virtual shard; AllowBatch sends each
// shard's requests as calls of their own, pipelined (go-redis sends each
// master its part in one round trip), so a batch of keys of many shards
// makes as many calls: fewer virtual shards make fewer, larger calls and
// spread less. AllowAll runs one script, so on a cluster its keys must
// be in one virtual shard (give them one {tag}; with IgnoreKeyTags they
// share one only by chance), else it returns ErrCrossShard; on one server
// its keys may be in any shards. Keyspace passes (EvictFull, KeyCount, a
// cutover's) scan every master, and the decide FUNCTION (or script) is
// loaded on each master by the first call there that finds it missing.
// Every command the store sends through a cluster client goes in a
// pipeline, one alone too (a hook on the client sees it in
// ProcessPipelineHook; the scans and the script loads go to each master's
// own client): go-redis reads the servers' command table before its first
// command outside a pipeline, under a 5 s timeout of its own whatever the
// caller's deadline, so a node that hangs would hold that command, and New
// or the call, for as long. The cost: a call on a master that refuses
// connections is retried by go-redis's pipeline (ClusterOptions.MaxRedirects
// times, with its backoff) before the failure rule answers it, where a
// lone command would fail at once; the call's deadline bounds that too. A
// cluster client that sends reads to replicas (ReadOnly, RouteByLatency,
// RouteRandomly) is refused: the store reads its policy and its cutover
// lock on the masters, and such a client reads the command table to route
// any command. On Redis 8.0 (and 7.2, as reported: redis/redis#13414)
// CLUSTER SHARDS, from which go-redis maps the slots, lists none for a
// master the cluster marks failed (Valkey 8.1 lists them), so go-redis
// sends a call on them to a live master and follows its MOVED to the dead
// one. A MOVED that go-redis could not follow is answered by the failure
// rule at once when a live node's CLUSTER SHARDS marks its target failed,
// and sent again otherwise (a migration's): such a call takes go-redis's
// redirects, about 100 ms, as on 7.0 or Valkey, whose slot map marks the
// master failed, but the dial of the dead node, which go-redis makes for
// it, costs as for any node that refuses connections (DialerRetries, see
// below) until the node's pool has failed PoolSize dials (go-redis then
// fails them at once, and probes the node every second). A master that
// hangs rather than dies, once marked failed, holds each call on its slots
// to its deadline on Redis 8.0 (go-redis follows the MOVED to it), where
// on 7.0 or Valkey go-redis refuses it after its redirects, as a dead one's.
//
// A script call is never sent twice, on a cluster too: go-redis follows
// MOVED and ASK (the script did not run) for these commands as for any,
// and never retries one whose reply was lost. While a slot migrates, Redis
// answers TRYAGAIN to a call some of whose keys it does not find on
// either side, and the script does not run; the store sends it again
// after a pause, within the call's deadline. A key that does not exist
// counts: a bucket not yet created, and the shard's pending flag, which
// exists only during a cutover, so calls on a shard wait while its slot
// migrates, and one that waits past its deadline is answered by the
// failure rule.
//
// A master that dies is replaced by its replica, where it has one, once the
// other masters agree that it failed (after the cluster's node timeout) and
// elect the replica: about two to three seconds in all with a node timeout
// of one second. Until then the failure rule answers the calls on its
// shards, and the other masters' shards decide as before, provided the
// cluster serves while some slots have no master: Redis's default cluster-
// require-full-coverage yes makes every master answer CLUSTERDOWN once a
// dead master's slots are uncovered (for good without a replica; about a
// second during a failover), and with it every shard answers by the failure
// rule. Set it to no on every node. go-redis moves a slot to a new master
// when a node answers MOVED, which a dead one never does, or at its periodic
// reload of the slot map (ClusterOptions.ClusterStateReloadInterval, a
// minute by default), and it neither marks failing nor reloads on a
// connection error of a command it does not retry, as every script call is.
// So when a call fails on a connection error (a dial refused or timed out, a
// connection reset or timed out), CLUSTERDOWN, go-redis's refusal of a
// master its slot map marks failed (from go-redis v9.24.0), or a deadline
// that passed without a reply (all a master that hangs rather than dies
// gives), the store asks the client to reload its slot map
// (ClusterClient.ReloadState), at most once per 100 ms however many calls
// fail, and go-redis reloads it on a goroutine of its own, at most once per
// 200 ms. Calls on the lost master's shards are decided again within a few
// hundred milliseconds of the promotion, under load; the first call after a
// quiet spell may still meet the old slot map, and the failure rule. A
// reload that asks a hung master first waits for the client's ReadTimeout
// (ClusterOptions.ReadTimeout, 5 s by default) before it asks another node:
// set it to a second or so to bound that. The call that failed is not sent
// again: its reply, not its request, may be what was lost. A replica that
// had not received its master's last writes (replication is asynchronous)
// gives their tokens again, as in a failover on one server (see Policies).
//
// A cutover moves every shard's copy of the version. On a cluster no
// script can move them all at once, so a cutover has four steps, each
// conditional and idempotent, on one server as on a cluster (there every
// call reads one shard's copy, so its calls pause only from that shard's
// prepare to its publish):
//
//  1. record: under the lock, if the expected version is in force and no
//     earlier cutover is left unfinished, the next policy and the cutover
//     to make are written to the global keys; from here on the cutover is
//     made, by this process or another;
//  2. prepare: every shard's version becomes "p" and the next, which the
//     decide script refuses to every caller;
//  3. commit: once every shard is prepared, the next version is in force
//     in the global keys, and the commit's TIME is recorded as the
//     cutover instant;
//  4. publish: each shard takes the next version as of that one instant,
//     however late it is published (a shard whose master was away is
//     converted as of the commit, never refilled under the old limit past
//     it, nor up to it while its own TIME reads earlier: such a bucket is
//     converted as of that TIME); once every shard is, the record is removed.
//
// No caller decides under the old version once any has decided under the
// next: every shard stops deciding under the old version (step 2) before
// any decides under the next (step 4 follows step 3, which follows step 2
// on every shard). A finisher never takes a shard it finds moved on for a
// commit: it reads the global keys again and goes on from what they say.
// A store whose call meets a prepared shard finishes the cutover itself
// (steps 2 to 4, or 4 alone once committed) and sends the call again, as
// do New and ReplacePolicy (the latter under the lock, before it records
// its own), so a process that dies mid-cutover blocks no one. (A record
// whose next policy the global keys do not hold, one written by hand, is
// never finished: New and ReplacePolicy fail, saying so, until it is
// removed.) A cutover starts only if every master answers; a master that
// fails between the steps leaves the prepared shards answering by the
// failure rule until it is back and a call finishes the cutover.
//
// A lengthening cutover (see Store.ReplacePolicy) says so in its record. On
// a cluster its pending flag is set in every shard after the lock is
// checked, not with it (a different slot): a holder whose lock expired in
// between adds a flag of its own, which costs memory (buckets written
// without expiry until the flag expires), never tokens. Every finisher also
// sets the cutover's own flag in each shard not yet published, before it
// prepares any, and each shard's publish removes that one token only; so a
// shard that has not met the cutover writes no expiry under the old version
// once anyone may finish it. That token keeps the shard's whole flag from
// expiring; the publish that removes it gives the flag, if holders' tokens
// remain in it, the lock's TTL again, so that a process that dies mid-
// cutover leaves no flag for good. The cutover's record stays until every
// bucket's expiry is set under the new version: by the process that made it,
// or else by the next ReplacePolicy on the prefix, which runs that pass
// first. A call or New that finishes such a cutover does not run the pass:
// until it runs, the buckets not touched since the cutover began keep no
// expiry (memory, never tokens). One gap remains: if the process that
// recorded a lengthening cutover dies before any finisher sets the cutover's
// flag and its own flags expire (after the lock's TTL), the shards not yet
// prepared write expiries under the old version meanwhile, and a bucket not
// touched again before that expiry is dropped before it is full under the
// new one.
//
// On a cluster a master may lose its data alone (a restart without
// persistence). Its shards are reinstalled at the version in force, and
// their buckets start full. (A shard's copy of the policy state, or the
// global policy hash, that lost only its version field, an operator's HDEL,
// is reinstalled in the same way, on one server too, and keeps its key map.)
// If it held the global keys, the first store to need them reinstalls them,
// with the key map the surviving shards hold a copy of (so their buckets
// keep their shards; a store that met no surviving copy draws a new seed),
// and never below the newest version a surviving shard holds: a store that
// does not know that version (one that never met the last cutover) fails
// instead, and its calls get the failure rule, until a store that knows it
// reinstalls them (its next call that reloads, or its next ReplacePolicy);
// New with an older Config.Policy fails the same way. A shard is raised to a
// committed version only if the global keys hold it. Limits: a shard left
// prepared ("p" and a next version) while the global keys, and so the
// cutover's record, were lost stays refused until an operator sets its
// version; and a shard reinstalled from a version read just before a commit
// is raised by the first call that meets it, so a call on it may decide
// under the old version after another decided under the new.
//
// # Versions
//
// The layout of a prefix's keys and buckets belongs to this package's
// version: stores of different versions must not share a prefix. Give a
// new version a prefix of its own, or stop the older stores first. A store
// that reads a stored policy with a field it does not know (a newer
// version's) fails, with ErrUnavailable, rather than limit less than the
// policy says: New, ReplacePolicy, and a call that reloads the policy (by
// the failure rule). Each version loads its own decide FUNCTION (named
// after the script's hash), so stores of different versions may share a
// server on different prefixes.
//
// # Leases
//
// With Config.Leases set, a store takes whole tokens of a busy key's
// bucket in advance, as a lease, and spends them in the process: a request
// its lease covers is decided there, with no Redis call on its path, at
// about the in-memory engine's cost (the leases live in goroutine-owned
// shards, as the engine's buckets do, and a leased decision allocates
// nothing). The protocol:
//
//   - Grant. A lease is an Allow of n tokens decided by the bucket like any
//     other, so it takes n tokens of every band, under the version in
//     force. A request the lease cannot cover takes what the lease holds and
//     asks Redis for the rest of its cost, under the lease's version only
//     (one that meets a cutover puts the tokens back, and is asked again
//     once the lease has ended; the eighth try of a call that met seven is
//     sent as it is); the same script call may ask for the next lease.
//   - Top-up. When a lease falls below half its size, the next one is
//     asked for in the background, so a key of steady demand does not wait
//     on Redis.
//   - Sizing. A lease holds what the process admitted on the key over the
//     last Leases.Horizon (100 ms), at most the key's smallest band capacity
//     divided by Leases.Divisor (16), and is asked for only while the
//     bucket, at its last answer, keeps half its capacity besides (a key
//     with no answer yet under the version in force counts as full); never
//     fewer than 2 tokens, so a key of capacity under 32 is never leased.
//     P processes hold at most P*capacity/Divisor of a key together.
//   - Give-back. Unspent tokens are credited back exactly (a Refund, capped
//     at capacity) once the key has had no request for two Horizons, or
//     its lease no grant for Leases.MaxAge (1 s) (by a periodic sweep, or
//     by the key's next request if it comes first: that request gives the
//     lease back before Redis decides it; if the process's queue to Redis
//     is full at a sweep, at the next sweep), before the store's own
//     ReplacePolicy (the leases held when it starts: one Redis grants
//     after that and before the cutover publishes, to a top-up already on
//     its way or a concurrent call, is taken under the old version and
//     judged as below, so a cutover that raises a capacity or adds a band
//     gives it up), on Close and before a Charge. A
//     lease taken under a version that a cutover has since replaced
//     ends when this store meets the new version (at its next call to
//     Redis, within MaxAge; a give-back reads the version in force first):
//     its tokens go back under the new limit if no version since the one
//     they were taken under (that one included) gives a band of the new
//     limit less capacity, or lacks it: else a cutover on the way would
//     have clamped or dropped them, and they are given up, so that no
//     cutover tops a key up (a give-back that meets a cutover published
//     since that read is judged again).
//   - Denials. A denial Redis gave is kept: the same cost on the same key
//     is denied in the process until its RetryAfter has passed, or
//     Leases.MaxAge since Redis gave it if that is sooner, unless the
//     lease and the bucket's tokens as last heard cover it (a grant
//     learned since), when Redis decides.
//
// Why it cannot over-admit: every token admitted anywhere was first taken
// from the key's bucket by a script call, which decides as without leases;
// a token is spent once, by the shard that holds it, or given back, never
// both. So per key, the tokens admitted by every process together never
// pass what the bucket gave out: its capacity, plus its exact refill since
// it was created, plus refunds. A process that crashes loses its unspent
// lease (the quota then under-admits by at most that, never over-admits).
//
// What it costs: while a process holds a lease, the bucket refills behind
// it, so a burst may pass the capacity by the tokens the processes hold (as
// it may with any limiter that spends locally); in the same way, a debt
// floored at minus the capacity (by a Charge, or a cutover's clamp) is
// floored without the tokens the processes hold, which then go back to it;
// and a request the lease cannot cover, on a key whose leases other
// processes hold, can be denied with those tokens unspent. A kept denial can
// deny a request others' refunds would have admitted, until its RetryAfter
// (MaxAge at most). A leased answer's Decision is the bucket's as last
// heard: Remaining is the bucket's whole tokens at its last answer plus what
// the lease holds (at most Limit, which the sum passes once the bucket
// refilled behind it), ResetAfter counts from that answer, and a kept denial
// answers from the denial too (the fewer tokens, the later reset, its Band
// and that band's Limit; RetryAfter counts down from the one Redis gave),
// since answers may arrive in another order than Redis gave them. Redis's
// answer to a request the lease could not cover, asked while a top-up Redis
// granted before it is on its way, reads low by that top-up, as a Peek does
// (below): a key's Remaining, and httplimit's r, can drop by a lease's size
// and rise again at the next leased answer. Allowed and Version are as
// without leases but for a cutover made by another process, which a
// process's leased answers follow only once it meets the new version (at its
// next call to Redis, within MaxAge): until then it spends its lease under
// the old one, so a lowered limit can be passed by what the processes hold,
// at most the old capacity/Divisor each. Limit and Band are as without
// leases for a key of one band; for a key of several they name the band that
// bound the bucket's last answer (a kept denial's, for the requests it
// denies), which may no longer be the one that binds, since bands refill at
// their own rates. Stats.Local counts the leased decisions. AllowBatch
// decides its requests one by one, each as Allow would (so a request its
// lease cannot cover is a round trip of its own); AllowAll and Charge go to
// Redis (AllowAll without the tokens this process's leases hold, so it may
// deny what a lease would have covered; Charge after the lease is given
// back, though a top-up Redis granted just before may reach the process
// after it, and admit the requests it covers, paid for before the charge,
// while the key is in debt); Peek and Refund go to Redis (a Refund ends a
// kept denial) and add what the lease holds to its answer: to Remaining, at
// most Limit, and, while the lease holds a token, Allowed with no
// RetryAfter, since a request of one token would take it from the lease (a
// top-up Redis has granted but the process has not yet taken in is in
// neither, so a Peek or Refund during one reads low by it; one that meets a
// cutover adds nothing, since the lease ends there, so it reads low by what
// the lease gives back at the key's next request). With Redis unreachable, a
// process spends what it holds, then answers by the failure rule, marked
// Degraded; a lease that goes back meanwhile (before a Charge, a cutover or
// Close, or once it expired) and that Redis does not take is given up, not
// kept, since Redis may yet credit it: the key under-admits by it, as after
// a crash, and Stats counts it in ForfeitedTokens. Redis may yet run a call
// whose answer is lost, and so grant its lease to nobody: a key whose call
// went unanswered asks for no lease until Redis decides one of its Allows
// again. A stall so loses about one lease a key, not one a failed call: more
// only by the answers Redis gave just before it that arrive after a lost
// one, and a key forgotten while idle forgets its doubt. Close waits for the
// calls to Redis the leases still await, then gives every lease back. In
// memory, a process keeps a small record of each key it decided in the last
// Leases.MaxAge (longer while a lease or a kept denial holds), so its lease
// state grows with the rate of distinct keys, about that rate times MaxAge
// records, not with the keys Redis holds; a sweep walks them at least once a
// Horizon.
//
// # Failures
//
// A decision that Redis cannot give by the call's deadline (the context's,
// or Config.Timeout if sooner) is answered by the rule the Config chooses:
// fail closed (the default: denied, RetryAfter Config.FailRetryAfter) or
// fail open (allowed), with a nil error, and marked
// engine.Decision.Degraded, so that a caller can tell an outage from a
// limit (engine/httplimit answers a degraded denial 503 Service
// Unavailable, engine/grpclimit Unavailable); Config.OnError and Stats see
// every such answer. A decision never waits past its deadline, and service
// resumes by itself when Redis returns (within about a second: go-redis's
// dialer holds off new connections for up to a second after repeated
// refusals). Calls that are not decisions return
// an error wrapping ErrUnavailable instead; a pass over the keyspace bounds
// each exchange, not the whole pass.
//
// How soon the failure rule answers is the client's to say. go-redis dials
// a connection up to five times, 100 ms apart, by default
// (Options.DialerRetries, DialerRetryTimeout): while the server refuses
// connections, every decision then waits out its whole deadline, 250 ms
// by default, before it is answered. With DialerRetries: 1 it is answered
// as soon as the dial is refused, in well under a millisecond on loopback;
// a server that does not answer at all (a host gone, a network cut) still
// costs the deadline, or the client's DialTimeout if shorter. go-redis
// also logs each failed dial, to standard error unless redis.SetLogger
// sends its log elsewhere; the store reports the failures themselves to
// Config.OnError and Stats.
//
// A store may start while Redis is unreachable: New returns it, and it
// answers every decision by the failure rule until a call reaches Redis
// and reads the prefix's key map, virtual shards and policy; from then on
// it decides as if New had reached Redis (see New).
//
// The store needs Redis 6.0 or later, or Valkey (its tests pass on Redis
// 6.0.16, by EVALSHA, but for the few that need CLIENT PAUSE WRITE, from
// 6.2, or scripts held to min-replicas-to-write, from 7.0, which skip; on
// 7.0.15 and 8.0.2; and on Valkey 8.1.1; each on one server and on a
// cluster; before 7.0, a bucket written with an expiry costs Redis a second
// command, PEXPIREAT, in the script): one server, a primary behind Sentinel
// through redis.NewFailoverClient, or a Redis Cluster (see Redis Cluster
// above). On a cluster, a master that is down answers its shards' calls by
// the failure rule, until it is back or its replica has taken its place, and
// the other masters' shards decide as before; so does a store started while
// the master is down, on a prefix set up before, provided the master that
// holds the prefix's global keys answers (a new prefix waits for every
// master: a lost master's shards could hold a newer version than the store
// would install).
//
// Behind Sentinel (tried with Redis 7.0 and go-redis v9.24), the client
// closes its connections to the old primary when its sentinel announces
// the new one: the calls then in flight are answered by the failure rule,
// and the next ones decide on the new primary. A primary that dies is
// answered by the failure rule until the sentinels have promoted a replica
// (its down-after-milliseconds, plus their election), and up to a second
// more (go-redis's hold-off of dials, above). SENTINEL FAILOVER does not
// pause the old primary: it goes on deciding until the client hears of the
// switch, and the replica promoted never receives those decisions, so each
// key busy then admits its refill over that time again, and a cutover made
// then may return nil and be undone (the version before it is in force
// again). WaitForReplicas bounds that only when it waits for every
// replica: one that acknowledged the old primary's last writes drops them
// when it follows the new one. Waiting for every replica costs the failure
// rule until Sentinel has made the old primary a replica, at its next INFO
// of it (every 10 s). Give redis.FailoverOptions a ReadTimeout and a
// DialTimeout well under Config.Timeout: for each new connection go-redis
// asks the sentinel it last used, under the call's deadline, and gives up
// when that deadline ends first, so with its defaults (3 s and 5 s) a
// sentinel that hangs, as on a host that froze with the primary, keeps
// every call on the failure rule long after the switch.
// TestSentinelFailoverCosts measures these (with TOKENSHARD_SOAK set); the
// README has the figures.
package redisstore
