// Package httplimit is net/http middleware that admits requests through a
// tokenshard engine: each request spends its cost from the bucket of its
// key, and a request the bucket cannot pay for is refused with 429.
//
//	mw, err := httplimit.New(e)          // key: the client; cost: 1
//	srv := &http.Server{Handler: mw.Handler(mux)}
//
// Handlers that must never be limited, such as expvar's /debug/vars or a
// health check, go on a mux outside mw.Handler (ExampleMiddleware_Handler).
//
// # Keys and proxies
//
// The default key is the client, grouped: ClientKey of the address ClientIP
// finds. An IPv4 client is keyed by its address, "203.0.113.7"; an
// IPv4-mapped IPv6 address (::ffff:203.0.113.7) is that IPv4 client, and
// so is an address in the well-known NAT64 prefix 64:ff9b::/96
// (64:ff9b::203.0.113.7), an IPv4 client that a NAT64 gateway translated:
// grouped by /64, all of the gateway's IPv4 clients would share one key.
// The local-use NAT64 prefix 64:ff9b:1::/48 is not recognized, since its
// operator chooses where the IPv4 address goes in it. An IPv6 client is
// keyed by its /64, written as netip.Prefix.String writes the masked
// prefix: every address of 2001:db8:1:2::/64 has the key
// "2001:db8:1:2::/64". A /64 is one subnet, and a host picks its addresses
// from it at will, so keyed per address it would never be limited and would
// fill the engine's key table. WithIPv6Prefix chooses another length, from
// /32 to /128 ("2001:db8::7/128" keys each address alone).
//
// The client's address comes from RemoteAddr. Over a Unix socket that is the
// path of the client's socket, which the client names, and may read as an
// address ("203.0.113.7:1"): where untrusted local processes can reach the
// socket, key by something else (WithKey), or have a middleware before this
// one set RemoteAddr from what your proxy reports. A request whose
// RemoteAddr holds no address has no default key, and is answered with 500
// (ErrNoClientIP); a WithClientKey or WithKeys function is given client ""
// for it, and decides. Forwarded headers are ignored unless
// WithTrustedProxies names the proxies in front of the server and the header
// they write (X-Forwarded-For or RFC 7239 Forwarded; with no prefixes it
// trusts nothing, as if not given); then the client is the right-most
// address in that header that is not a trusted proxy, and only when the
// direct peer is one. Trusting a header by default would let each client
// pick its own key and never be limited. The header is parsed from the
// right, entry by entry, and read no further left than the first entry that
// is not an address or does not parse (an unbalanced quote, an incomplete
// escape): no text a client sends can change how the entries its proxies
// append read, and the key is then the last address a trusted proxy wrote
// (ClientIP).
//
// WithClientKey derives the key from the request and that grouped client,
// after the proxies: a per-route limit is the route and the client
// (ExampleWithClientKey). WithKey derives it from the request alone (an API
// token, a tenant), and so does not see the proxies or the grouping; a
// middleware takes one of the two. WithCost sets the cost of a request.
//
// # Several keys
//
// WithKeys limits a request by several keys at once, each with its own
// cost. Its function is given the request and the grouped client, after
// the proxies, as a WithClientKey function is: a login route spends from
// the route's key for the client and from the client's own key at once
// (ExampleWithKeys); a user, their tenant and the whole service is
// another such set. The
// engine decides them together (engine.Admitter.AllowAll): the request is
// admitted only if every key holds its cost, and then pays every cost; a
// request one limit refuses pays nothing to the others. The header fields
// below describe the binding key, the one that waits longest when the
// request is denied and the one with the fewest tokens left when it is
// admitted. WithKeys replaces WithKey, WithClientKey and WithCost.
//
// # Settling a cost known after the work
//
// Under WithCost or WithKeys a request's cost may be an estimate: the
// max_tokens of a model call, the size of a response not yet written. Its
// handler calls Settle once the actual cost is known, and the difference
// is charged (into debt if need be, repaid by the key's later requests) or
// given back, on the same keys (ExampleSettle). An estimate above the key's
// capacity is refused (413) however long the client waits: clamp it to the
// capacity, and Settle charges the rest. To limit requests and tokens
// together, nest a middleware at the default cost around the one that
// takes the estimate (ExampleSettle_requestsAndTokens).
//
// # Header fields
//
// Every decided request, admitted or denied, carries the RateLimit header
// fields of draft-ietf-httpapi-ratelimit-headers-11 (23 May 2026), spelled
// as in -08 to -10. Both are structured-field Lists (RFC 9651). RateLimit-Policy
// has an Item for every band of the key's limit: its primary band (its
// Capacity and rate, from its override or the policy), named for the key's
// quota (below), then each band of its policy.BandSet, under the band's
// Name. RateLimit has one Item, for the band that bound the decision
// (engine.Decision.Band), under the name RateLimit-Policy gives it. Under
// WithKeys, the key is the binding key:
//
//	RateLimit-Policy: "default";q=10;w=5
//	RateLimit: "default";r=9;t=1
//
//	RateLimit-Policy: "default";q=5;w=1, "daily";q=20;w=86400
//	RateLimit: "daily";r=0;t=4316
//
// q is a band's capacity in tokens and w the whole seconds it takes to
// refill from empty at its rate under the policy in force, rounded up:
// ceil(capacity x Per / Tokens) (policy.Rate.WindowSeconds), 6 for 10
// tokens at 100 a minute. r is the whole tokens left in the binding band after the
// decision and t the whole seconds, rounded up, until it is full again. A
// token is a request when the cost is 1. Integers above 999,999,999,999,999
// (the structured-field maximum) are sent as that maximum. The fields are
// set on an admitted response before the wrapped handler runs, which may
// change or remove them. A middleware replaces the fields already on the
// response, except under WithShadow, which adds its items to them (below).
//
// # Quota names
//
// The primary band's name says which quota the numbers belong to, and two
// different quotas (a capacity and a rate; a rate given as TokensPerSecond
// n is the quota of n per second) never share one under a policy. With P
// the name WithPolicyName gives ("default" unless set):
//
//   - A key with no override is under P.
//   - A key whose override (policy.OverrideSet.Lookup) has a Name is under
//     that Name, unless it is another quota's: P while the override's quota
//     differs from the default's, or a derived name (below), with or
//     without a suffix "-1", "-2", ..., of a quota other than its own. Such
//     a Name is not used; the override is named as if it had none.
//   - A key whose override has no Name is under P when the override's quota
//     is the default's, and otherwise under its derived name.
//   - The derived name of a rate per second is "P-<capacity>-<tokens>":
//     `"default-7-2";q=7;w=4` for 7 tokens refilled at 2 a second. For any
//     other period it is "P-<capacity>-<tokens>/<period>", the period as a
//     whole number of the largest of the units h, m, s, ms, us and ns that
//     it is a whole number of: "default-10-100/1m" for 10 tokens at 100 a
//     minute, "default-20-20/24h" at 20 a day, "default-5-3/1500ms".
//   - The other bands are under their own names, which are unique within a
//     limit (the bands of different overrides may share a name). The
//     primary never takes a name that one of the key's bands has: if the
//     rule above gives it one (a band named P, or like a derived name), it
//     is under its derived name instead, and if a band has that too, under
//     the derived name and "-1", "-2", ..., the first that no band has.
//
// policy.NewOverrideSet refuses one Name for two different limits, and a
// band with its override's Name.
//
// # Status codes
//
// Each error answer below (all but Admitted, Denied and Admitted by a
// store's failure rule) is also given to the WithOnError function, with an
// error that says why. Under WithShadow none of them is sent: every request
// gets the wrapped handler's response (see Shadow mode).
//
//   - Admitted: the wrapped handler's response, with the fields above.
//   - Denied: 429 Too Many Requests, Retry-After the retry estimate in whole
//     seconds rounded up (a 1.2 s or a 2 s estimate is "2"; at most
//     9223372036, the longest time.Duration, so that a client multiplying
//     it by a second does not overflow), and the fields above with t equal
//     to Retry-After: the draft says a Retry-After should not point earlier
//     than the end of the effective window. WithDenied replaces the status
//     and body, not the header fields.
//   - Denied by a store's failure rule (engine.Decision.Degraded: a Redis
//     store, failing closed, that cannot reach Redis): 503 Service
//     Unavailable, Retry-After the decision's RetryAfter in whole seconds
//     rounded up and at least 1, and no RateLimit fields (an outer
//     middleware's are removed), as no bucket was consulted: the outage is
//     the server's, not the client's limit. The
//     WithDenied function is not called, since it answers limits
//     (ErrDegraded).
//   - Admitted by a store's failure rule (Degraded, failing open): the
//     wrapped handler's response, without RateLimit fields of this
//     middleware's (an outer middleware's stay: the request passed it).
//   - Key bound reached (engine.ErrKeyCapacity): 503 Service Unavailable and
//     no RateLimit fields, as there is no decision; a full key table is the
//     server's overload, not the client's fault. Retry-After is
//     WithOverloadRetryAfter if given; else, if the engine offers the
//     optional method ReclaimAfter() (time.Duration, bool) and it answers
//     true, the time until a key slot can next be free, in whole seconds
//     rounded up and at least 1; else there is none, since only an
//     EvictFull call can free a slot and no figure would be true.
//   - Engine closed (engine.ErrClosed): 503 with no RateLimit fields, and
//     Retry-After only if WithOverloadRetryAfter is given.
//   - Cost above the key's capacity (engine.ErrInvalidCost): 413 Content Too
//     Large, without Retry-After, since waiting can never admit it. Under
//     WithKeys, a key's costs added up.
//   - No key (the key function failed, ClientIP found no address for the
//     default key, or the key is one the engine rejects as blank or too
//     long) or a cost below 1: 500 Internal Server Error, with a
//     plain-text body saying the server
//     could not derive a rate-limit key (or cost). Under WithKeys, so are
//     a KeysFunc error and no requests or more than engine.MaxAllowAll
//     (engine.ErrAllowAllSize). These are the server's configuration
//     failing (ErrKeyFunc, ErrNoClientIP, engine.ErrInvalidKey,
//     ErrCostBelowOne).
//   - The request's context ended before the engine decided (the client went
//     away, or a server deadline passed): 503 with no body, and nothing spent.
//     So is a key function's error returned once that context has ended (a
//     lookup canceled with the request, whether or not its error wraps the
//     context's), which is not ErrKeyFunc. A Redis store
//     (engine/redisstore) may instead answer by its own rules: a deadline
//     that passes while Redis is slow is met by its failure rule (a
//     degraded answer, above), and a request canceled after the store sent
//     it is decided by Redis, and answered as decided.
//   - Any other engine error (engine.ErrClockRegression), or an Admitter
//     whose AllowAll names no request it was given (ErrAdmitterContract):
//     500.
//
// The package writes bodies with http.Error and never logs.
//
// # Errors
//
// A server sees the errors it answered through WithOnError: its function is
// called with the request and an error wrapping the cause, which errors.Is
// tells apart (ErrKeyFunc and the key function's own error, ErrNoClientIP,
// ErrCostBelowOne, ErrDegraded, engine.ErrKeyCapacity, engine.ErrClosed,
// ...). Without it nothing is reported. Logged with log/slog
// (ExampleWithOnError):
//
//	httplimit.WithOnError(func(r *http.Request, err error) {
//		slog.WarnContext(r.Context(), "rate limit not applied", "path", r.URL.Path, "err", err)
//	})
//
// # Shadow mode
//
// WithShadow tries a limit without enforcing it: each request is decided
// and spends its cost as under enforcement, so the buckets and the fields
// hold what enforcement would see, but every request reaches the wrapped
// handler: a would-be denial, an error (given to WithOnError) and a denial
// by a store's failure rule alike. Middleware.Stats counts the decisions,
// the would-be refusals, the degraded decisions and the errors. A shadow
// middleware adds its items to the RateLimit and RateLimit-Policy Lists
// already on the response, or sets them when there are none, and never
// sets Retry-After. Put it inside the enforcing middleware, under a policy
// name of its own, to show a candidate limit beside the enforced one
// (ExampleWithShadow):
//
//	RateLimit-Policy: "api";q=4;w=4, "candidate";q=2;w=2
//	RateLimit: "api";r=2;t=2, "candidate";r=0;t=2
//
// Inside, it decides only the requests the enforced limit admitted; outside
// it, it would decide every request, but the enforcing middleware would
// replace its items. Stats counts under an enforcing middleware too, where
// Refused is the 429s.
package httplimit
