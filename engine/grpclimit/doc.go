// Package grpclimit is gRPC server interceptors that admit calls through a
// tokenshard engine: each call spends its cost from the bucket of its key,
// and a call the bucket cannot pay for is refused with
// codes.ResourceExhausted and the time to wait, which grpc-go clients with
// a retry policy honour by themselves.
//
//	l, err := grpclimit.New(e, grpclimit.WithExempt("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"))
//	srv := grpc.NewServer(grpc.UnaryInterceptor(l.Unary), grpc.StreamInterceptor(l.Stream))
//
// # Keys
//
// The default key is the peer's IP address (peer.FromContext), grouped
// exactly as package httplimit groups HTTP clients, by httplimit.ClientKey:
// an IPv4 peer is keyed by its address, "203.0.113.7"; an IPv4-mapped IPv6
// address, or one in the well-known NAT64 prefix 64:ff9b::/96, is that
// IPv4 peer; any other IPv6 peer is keyed by its /64, as
// netip.Prefix.String writes the masked prefix, "2001:db8:1:2::/64". One
// client so has the same key over HTTP and gRPC, and a host cannot escape
// its limit by rotating through the addresses of its subnet.
// WithIPv6Prefix chooses another length, from /32 to /128. A peer without
// an IP address (a Unix socket) has no default key. A server run as an
// http.Handler (grpc.Server.ServeHTTP) has its peer from the request's
// RemoteAddr, with or without a port, as http.Server or a middleware in
// front set it; over a Unix socket that is a path the client names, which
// may read as an address, as package httplimit warns: key such a server's
// calls by something else (WithKey).
//
// No metadata is trusted by default: behind a proxy the peer is the proxy.
// WithTrustedProxies names the proxies (an Envoy, a gRPC gateway) whose
// "x-forwarded-for" metadata is read: the client is then the right-most
// address in it not in a trusted prefix, by the very walk of
// httplimit.ClientIP (httplimit.ClientIPFrom), and is grouped as a peer
// is. WithKey derives the key from the method, the grouped client and the
// call's metadata (in its context): a per-method limit, a tenant, an API
// token. WithCost sets what a call spends.
//
// # Options
//
//	WithKey(f)               the key: default the grouped client address
//	WithCost(f)              the tokens a call spends: default 1
//	WithIPv6Prefix(bits)     how IPv6 clients are grouped: default /64
//	WithTrustedProxies(p...) read the client from x-forwarded-for of these proxies
//	WithExempt(methods...)   methods never decided nor charged
//	WithPerMessage()         a stream spends per message received, not once
//	WithHeaders()            send the RateLimit fields as metadata
//	WithPolicyName(name)     the default limit's name in them: default "default"
//	WithOnError(f)           told of every call answered with an error but a limit
//	WithShadow()             decide and spend, but refuse nothing (ShadowStats)
//
// # Metadata
//
// With WithHeaders, the calls a bucket decided carry the RateLimit fields
// of the IETF httpapi draft, with the values package httplimit writes in
// its RateLimit-Policy and RateLimit header fields for the same decision
// (PolicyHeader, RateLimitHeader), here for a call that left 42 tokens of
// 100 refilled at 10 a second:
//
//	ratelimit-policy: "default";q=100;w=10
//	ratelimit: "default";r=42;t=6
//
// q is the capacity and w the seconds an empty bucket takes to fill, for
// each band of the key's limit; r is the whole tokens left, and t the
// seconds until the bucket is full (58 tokens at 10 a second: 5.8,
// rounded up) or, on a refusal, until it can pay (at least 1). An admitted
// call has them in its header metadata, or in its trailer metadata if its
// handler fails, or sent the header before they were set (with
// grpc.SendHeader, say); a refused one in its trailer metadata, beside the
// pushback trailer. A header would end the
// trailers-only response that grpc-go needs to retry a call, so the
// fields are set in it only once the handler has answered (a unary call)
// or first sends (a stream). A stream has them once, as decided when it
// starts; with WithPerMessage, as the first message a bucket let through
// left it, in the header when the handler first sends after that (so a
// stream refused before that stays trailers-only) or else at its end, and
// as its first refused message left it, in the trailer (a stream refused
// before it sent a header has only those). A degraded answer, or an
// error, has none. Only a header sent on the stream (SendMsg, SendHeader)
// counts as sent there: grpc.SendHeader(ctx) goes past the Limiter's
// stream, which cannot see it (wrapping the context's transport stream
// would break grpc.SetSendCompressor), so a stream that sent its header
// that way and is then refused loses the admitted fields. A handler of a
// metered stream that sends its header should do so on the stream.
//
// Behind several Limiters with WithHeaders (an enforcing one and a shadow
// one chained inside it, or two limits), each admitting Limiter's fields
// are values of their own, the outermost Limiter's first. A refusal by an
// inner Limiter carries only its own fields, and none for a degraded
// answer or an error: the outer ones' are dropped, as httplimit's
// middleware replaces or removes an outer middleware's.
//
// # Shadow mode
//
// WithShadow measures a limit on live traffic before enforcing it: every
// call is decided and spends as usual, and the metadata of WithHeaders
// report the decision, but nothing is refused. A would-be refusal goes on
// to the handler and is counted in ShadowStats: Refused for a bucket's
// denial, Degraded for a store's failure rule, Errors for any other error,
// which is also given to WithOnError. Only a call whose context ended is
// still answered so.
//
// # Streams
//
// A stream is decided once, when it starts, before its handler runs, at
// the cost of one call. With WithPerMessage it spends that cost for each
// message it receives instead: a message the bucket cannot pay for makes
// RecvMsg return the refusal below, which the handler returns. Messages
// the server sends are not charged.
//
// # Settling a cost known after the work
//
// WithCost's cost may be an estimate: the max_tokens of a model call. The
// handler calls Settle with its context once the actual cost is known, and
// the difference is charged (into debt if need be, repaid by the key's
// later calls) or given back, once per call, unary or stream
// (ExampleSettle). A stream under WithPerMessage has no one estimate, and
// is not settled.
//
// # Exempt methods
//
// WithExempt names methods that are never decided nor charged, such as the
// health service ("/grpc.health.v1.Health/Check", ".../Watch") and server
// reflection ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"):
// a load balancer's probes must not spend a client's quota, nor be refused
// when the limiter is at capacity. Exempt Watch too: a grpc-go client with
// client-side health checking (healthCheckConfig in its service config)
// opens a Watch stream on each connection, which then spends a token of
// the client's quota, and if refused marks the connection failed, so the
// client's every call fails Unavailable rather than ResourceExhausted.
//
// # Status codes
//
//   - Admitted: the handler runs and its status is the call's; with
//     WithHeaders its header metadata has the RateLimit fields (its
//     trailer metadata, if the handler fails or sent the header itself).
//   - Denied: codes.ResourceExhausted, with a google.rpc.RetryInfo detail
//     (errdetails.RetryInfo, read with status.FromError and Details) and the
//     grpc-retry-pushback-ms trailer of gRFC A6 (PushbackTrailer). Both carry
//     the engine's retry estimate, Decision.RetryAfter, rounded up to the
//     millisecond and at least 1 ms: retry_delay is that many whole
//     milliseconds, and the trailer the same number in decimal. A grpc-go
//     client whose retry policy lists RESOURCE_EXHAUSTED waits that long
//     before its next attempt instead of its own backoff; the trailer is
//     honoured only when the refusal is the whole response, as it is here,
//     since nothing is sent before it. With WithHeaders the trailer also
//     has the RateLimit fields.
//   - Denied by a store's failure rule (engine.Decision.Degraded: a Redis
//     store, failing closed, that cannot reach Redis): codes.Unavailable,
//     as the outage is the server's, not the client's limit, with
//     RetryInfo and pushback carrying the decision's RetryAfter, rounded as
//     above. Admitted by it (Degraded, failing open): the handler runs.
//   - Key bound reached (engine.ErrKeyCapacity): codes.Unavailable, as a
//     full key table is the server's overload, not the client's fault. If
//     the engine offers the optional method ReclaimAfter() (time.Duration,
//     bool) and it answers true, the refusal carries the time until a key
//     slot can next be free as RetryInfo and pushback, rounded as above;
//     otherwise neither, since only an EvictFull call can free a slot and
//     no figure would be true.
//   - Engine closed (engine.ErrClosed): codes.Unavailable, without a delay.
//   - Cost above the key's capacity (engine.ErrInvalidCost):
//     codes.InvalidArgument, without a delay: no wait can ever admit the
//     call, so it is not a code a retry policy should retry, as
//     ResourceExhausted is.
//   - No key (the key function failed, the peer has no IP address, or the
//     engine rejects the key as blank or too long) or a cost below 1:
//     codes.Internal, with a message saying the server could not derive a
//     rate-limit key (or cost). These are the server's configuration
//     failing. A key function that answers with a gRPC status of its own
//     (status.Error: InvalidArgument for a call without the metadata its
//     key needs, Unauthenticated) refuses the call with that status.
//   - The call's context ended before the engine decided: codes.Canceled or
//     codes.DeadlineExceeded, as status.FromContextError gives them, and
//     nothing spent. So is a key function's error that is that context's
//     ending (a lookup canceled with the call), which is not ErrKeyFunc:
//     the context's error, or, once it has ended, a gRPC status of the
//     same code (the one a gRPC call made under it returns).
//   - Any other engine error (engine.ErrClockRegression, a store's network
//     failure): codes.Internal.
//
// Every answer above but Admitted and Denied is also given, with its
// cause (engine.ErrClosed, ErrDegraded, ErrKeyFunc...), to the function of
// WithOnError; with WithShadow every one but the context's ending is
// admitted instead, and counted. Messages say what failed and nothing of
// the server's internals; the package logs nothing.
//
// # Ownership
//
// A Limiter is immutable after New, but for its ShadowStats counters,
// which are atomic. The function of WithOnError is called on the call's
// goroutine, concurrently for concurrent calls. The stream wrapper of WithPerMessage
// is used only by the goroutine of its handler, which alone may call
// RecvMsg.
package grpclimit
