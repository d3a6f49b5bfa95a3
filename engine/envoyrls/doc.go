// Package envoyrls serves Envoy's global rate limit service, the RLS v3 API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), on a
// tokenshard admitter: the in-process engine.Engine, or engine/redisstore's
// Store for a quota shared by several replicas.
//
// It reads envoyproxy/ratelimit's configuration files and matches requests
// as that server does, but decides with exact token buckets instead of fixed
// windows, and all or nothing across a request's descriptors.
//
//	cfg, err := envoyrls.ParseConfig(yamlBytes)
//	p, err := envoyrls.Policy(1, cfg)
//	eng, err := engine.New(engine.Config{Policy: p})
//	srv, err := envoyrls.NewServer(eng, cfg)
//	rlsv3.RegisterRateLimitServiceServer(grpcServer, srv)
//
// The command tokenshard-rls (engine/envoyrls/cmd/tokenshard-rls, a module of
// its own) runs it with gRPC health, Prometheus metrics and reloads.
//
// # Configuration
//
// ParseConfig reads one domain's YAML: domain, and descriptors, each with a
// key, an optional value, an optional rate_limit {unit, requests_per_unit,
// name, unlimited, replaces: [{name}]}, shadow_mode, share_threshold,
// detailed_metric, value_to_metric, metadata and descriptors below it. Units
// are second, minute, hour, day, week, month (30 days) and year (365 days), in
// any case. requests_per_unit is a whole number from 0 to 4294967295,
// written as envoyproxy/ratelimit's YAML library reads one: 1_000 is 1000,
// 0x10 is 16, 0b11 is 3, and 017 and 0o17 are octal, 15; anything larger is
// refused, not wrapped or clamped. A '*' in a value is a wildcard matching
// any run of bytes; with share_threshold every value it matches shares one
// bucket, without it each value has its own. That is envoyproxy/ratelimit's
// rule since it took '*' anywhere in a value (its releases before that took
// only a trailing '*', a prefix match, and read a '*' elsewhere as a literal
// byte). detailed_metric and value_to_metric name metrics in
// envoyproxy/ratelimit and change no decision here; metadata is read and not
// used, as envoyproxy/ratelimit does not use it unless told to.
//
// What envoyproxy/ratelimit refuses is refused: YAML that does not parse, an
// empty domain, a descriptor without a key, two descriptors of one level
// with the same key and value, an unknown unit, unlimited with a unit, a
// replaces entry that is empty or names its own limit, share_threshold on a
// value without '*', a key that is not a string, a list of anything but
// mappings, a float (a number with a fraction or an exponent, 5.0 too),
// metadata that is not a mapping, and an unknown field. It also refuses an
// unknown field where envoyproxy/ratelimit lets a known name of another
// level pass ("unit" at the top), a field given twice, a value of the wrong
// kind (a plain y, yes, on, n, no or off, in the cases YAML 1.1 allows, is
// a boolean, as envoyproxy/ratelimit's YAML library reads it; quoted, a
// string), a rate_limit without requests_per_unit or with an empty one
// (envoyproxy/ratelimit reads it as 0 and refuses every request: here a 0
// must be written), quota_mode: true, which this server does not implement,
// a YAML merge key (<<), which envoyproxy/ratelimit's YAML library
// resolves, a second YAML document in the input (one domain a file: it
// would otherwise be dropped unread, as envoyproxy/ratelimit drops it), and
// more than 100,000 descriptors, 100,000 replaces entries or 64 MiB of
// paths (a descriptor's keys and values and its ancestors', escaped), aliases
// expanded. Every error names the line and the field and wraps
// ErrInvalidConfig.
//
// # Limits
//
// Policy turns configurations into the admitter's policy. Each limited entry
// is a token bucket of capacity requests_per_unit refilled at
// requests_per_unit per unit, continuously. A key not used before admits
// requests_per_unit at once, as a fixed window admits at the start of a
// window; but where a fixed window admits requests_per_unit again as soon
// as the next window starts, twice the limit in a moment, the bucket then
// admits only what has refilled. An entry with no value gives each value
// of the request its own bucket, as does a wildcard without share_threshold.
// A limit of requests_per_unit 0 refuses every request, as it does in
// envoyproxy/ratelimit, without asking the admitter; its entry still has a
// bucket, of one token earned once a year, so that a reload to 0 and back
// keeps a spent key spent (see Reloads). The entries (0 included) whose
// buckets are per value are pattern overrides of the policy, of which all
// the configurations together may have policy.MaxPatterns (128); entries
// of fixed values are exact overrides, without a bound.
//
// # Decisions
//
// A request names a domain and a list of descriptors, each a list of
// entries (key, value). Each descriptor is matched against the domain's tree
// as envoyproxy/ratelimit matches it: level by level, the entry with the same
// key and value, else the first wildcard entry (in the file's order) of the
// key whose pattern matches the value, else the entry of the key with no
// value; the match stops where the tree does, and a limit applies only if the
// descriptor's last entry reaches a limited entry. Then every matched limit
// whose name another matched limit of the request lists in replaces is
// dropped, as if unmatched; an unlimited one is not (it has no limit to
// drop), as in envoyproxy/ratelimit. An unknown domain matches nothing.
//
// The cost of a descriptor is its own hits_addend when set, else the
// request's, where 0 (not set) means 1. A descriptor hits_addend of 0 means
// check only, as in envoyproxy/ratelimit: nothing is taken from its
// bucket, and the descriptor is over the limit if the bucket holds less
// than one token (with a limit of 0, always). envoyproxy/ratelimit, whose
// counters go on counting refused hits, calls a check over only once more
// hits than the limit were counted: a check of a window used up exactly,
// or of a limit of 0, is OK there and over here, where a refused request
// takes nothing.
//
// The limited descriptors not in shadow mode are decided together with one
// engine.Admitter.AllowAll: either each one's cost is taken from its bucket
// (descriptors of one bucket add up) or, if any bucket lacks its cost,
// nothing is taken from any. So where envoyproxy/ratelimit charges the other
// descriptors of a request that one of them refuses, here a refused request
// costs nothing. A descriptor whose cost is above its limit, or whose limit
// is 0, can never pass: the request is refused without asking the admitter.
// At most engine.MaxAllowAll descriptors of a request may be limited
// (check-only and shadow ones included: each costs the admitter a call).
//
// When the enforced descriptors that take tokens (check-only ones aside) all
// name one bucket, the request is one Allow of their summed cost. That
// matters on engine/redisstore's Store with leases (its Config.Leases): an
// Allow may be decided by the replica's lease, without Redis, but an
// AllowAll always goes to Redis, which decides it without the tokens the
// replicas' leases hold. So a request whose enforced descriptors take tokens
// from two buckets or more costs a round trip to Redis every time, and may
// be refused while leases hold tokens that would have covered it (at most
// each bucket's capacity divided by Leases.Divisor, a replica); its limits
// are still never passed.
//
// A descriptor in shadow_mode is decided on its own, with Allow's meaning
// (its cost is taken if its bucket holds it, whatever the others' answer),
// and reported with its numbers, but its code is always OK, as in
// envoyproxy/ratelimit, and it never makes the answer OVER_LIMIT.
//
// # Response
//
// overall_code is OVER_LIMIT if any enforced descriptor is over the limit,
// else OK. There is one status per descriptor, in order:
//
//   - unmatched or replaced: OK, nothing else (as envoyproxy/ratelimit);
//   - unlimited: OK, limit_remaining 4294967295 (as envoyproxy/ratelimit);
//   - limited: code OVER_LIMIT if its own bucket lacks its cost (for a
//     refused request every descriptor's bucket is judged; those whose
//     bucket holds their cost are OK, though nothing was taken), current_limit
//     with the entry's name, requests_per_unit and unit, limit_remaining
//     the whole tokens left in its bucket after the decision (saturated at
//     4294967295), and duration_until_reset the time until its bucket is full
//     again, rounded up to the nanosecond: the token bucket's counterpart of
//     a window's end. A descriptor of a request with more than one limited
//     descriptor reports its bucket as Peek reads it just after the decision.
//
// response_headers_to_add carries the IETF RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers, as engine/httplimit writes them)
// for one enforced limited descriptor: the one over the limit with the
// longest wait, or else the one with the fewest tokens left; the first on a
// tie. RateLimit-Policy is "name";q=requests_per_unit;w=seconds of the unit,
// the name being the entry's rate_limit name if it is printable ASCII, else
// "<requests_per_unit>-per-<unit>" ("5-per-second"). RateLimit is
// "name";r=tokens left;t=seconds until full, rounded up. When the request is
// refused and some wait admits it, Retry-After is the seconds until every
// bucket of the request holds its cost (at least 1), and t is that too.
// Both are at most 9223372036, the longest time.Duration, so that a client
// multiplying them by a second does not overflow.
// For a limit of 0, which no wait admits, there is no Retry-After and t is
// the seconds of its unit, a fixed window's length: not 0, which would
// tell a client to retry at once.
// Shadow descriptors give no header fields.
//
// # Errors
//
// A request without a domain or descriptors, with more than MaxDescriptors
// descriptors, or with more than engine.MaxAllowAll limited descriptors, is
// a gRPC InvalidArgument error; a descriptor carrying its own limit (Envoy's
// limit override) is Unimplemented. When the admitter fails the answer is a
// gRPC error (Unavailable; ResourceExhausted for engine.ErrKeyCapacity; the
// context's code), never an OK, so Envoy's failure_mode_deny decides. So is
// a decision the admitter marks Degraded (ErrDegraded, Unavailable): the
// Redis store answers a Redis it cannot reach by its own failure rule, fail
// open or closed, and such an answer is no bucket's. The reads that report
// the other buckets of a request (and its shadow descriptors' decisions)
// come after its decision: if the admitter fails between the two, the
// request is such an error though its tokens were taken, so an outage's
// first moment can charge a few requests that failure_mode_deny then refuses
// (it never admits one uncharged). A full key table fails a request only
// when none of its buckets already tracked lacks its cost: one that does
// refuses the request whatever a new key would hold, so it is OVER_LIMIT (as
// an error, it would let a client over its limit pass wherever Envoy fails
// open, by sending a value never seen); and a shadow descriptor whose bucket
// finds no room is reported without its numbers, never failing the request.
//
// # Reloads
//
// Server.Reload changes the configurations by ReplacePolicy, an exact cutover:
// every bucket keeps its balance, clamped to its new capacity, so raising a
// limit tops nobody up and lowering one takes effect at once. A limit taken
// to 0 and back does not either: at 0 a key's bucket holds at most one token
// and earns one a year, so a key spent when its limit went to 0 comes back
// (within a year) as spent as it left, and refills at the restored rate
// from there. A key that held a token or more is full at 0, and may be
// dropped as full buckets are (engine.Engine.EvictFull, a Redis expiry); it
// then comes back full, as any full bucket dropped before a limit is raised
// does. An entry made unlimited or removed is different:
// its keys fall to the default, which never denies, and come back full if
// the entry does (while unlimited, they could take anything anyway). An entry
// keeps its bucket while its place in the tree (its domain and the keys and
// values on its path) and the share_threshold of every wildcard on that path
// stay the same. Turning a share_threshold on or off is moving the entry:
// its buckets are others (one shared, or one per value), which start full,
// and the ones it had fall to the default meanwhile, so they come back full
// if it is turned back, however soon.
//
// # Keys
//
// A limited descriptor's bucket key is the domain in braces, a Redis hash
// tag, then the matched entry's path, then the request's values at the entries
// whose value varies, each part escaped so that no two descriptor paths, and
// no two entries, share a key; long parts are replaced by hashes so that
// no key is longer than MaxKeyBytes. The domain's braces put all of a
// domain's buckets in one Redis Cluster slot, which AllowAll on a cluster
// needs (engine/redisstore's ErrCrossShard): on a cluster, one domain's load
// is on one master. The request's values are escaped, braces included, so a
// client cannot write a hash tag of its own into a key, and a Redis store may
// keep its default of placing keys by their tags (not IgnoreKeyTags).
package envoyrls
