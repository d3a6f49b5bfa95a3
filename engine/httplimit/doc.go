// Package httplimit is net/http middleware that admits requests through a
// tokenshard engine: each request spends its cost from the bucket of its
// key, and a request the bucket cannot pay for is refused with 429.
//
//	mw, err := httplimit.New(e)          // key: client IP; cost: 1
//	srv := &http.Server{Handler: mw.Handler(mux)}
//
// # Keys and proxies
//
// The default key is the client IP, taken from RemoteAddr. Forwarded headers
// are ignored unless WithTrustedProxies names the proxies in front of the
// server and the header they write (X-Forwarded-For or RFC 7239 Forwarded);
// then the key is the right-most address in that header that is not a
// trusted proxy, and only when the direct peer is one. Trusting a header by
// default would let each client pick its own key and never be limited.
// WithKey replaces the key function (an API token, a tenant, a route) and
// WithCost the cost of a request.
//
// # Header fields
//
// Every decided request, admitted or denied, carries the RateLimit header
// fields of draft-ietf-httpapi-ratelimit-headers-11 (May 2026; the field syntax
// is the same since -08), both structured-field Lists of one Item named by
// WithPolicyName ("default" unless set):
//
//	RateLimit-Policy: "default";q=10;w=5
//	RateLimit: "default";r=9;t=1
//
// q is the key's capacity in tokens (its override's, or the policy's) and w
// the whole seconds an empty bucket takes to refill: ceil(capacity / rate)
// at the key's own rate under the policy in force. r is the whole tokens
// left after the decision and t the whole seconds, rounded up, until the
// bucket is full again. A token is a request when the cost is 1. Integers
// above 999,999,999,999,999 (the structured-field maximum) are sent as that
// maximum. The fields are set on an admitted response before the wrapped
// handler runs, which may change or remove them.
//
// # Status codes
//
//   - Admitted: the wrapped handler's response, with the fields above.
//   - Denied: 429 Too Many Requests, Retry-After the retry estimate in whole
//     seconds rounded up (a 1.2 s or a 2 s estimate is "2"), and the fields
//     above with t equal to Retry-After: the draft says a Retry-After should
//     not point earlier than the end of the effective window. WithDenied
//     replaces the status and body, not the header fields.
//   - Key bound reached (engine.ErrKeyCapacity) or engine closed: 503 Service
//     Unavailable with Retry-After (WithOverloadRetryAfter, 1 s by default)
//     and no RateLimit fields, as there is no decision. A full key table is
//     the server's overload, not the client's fault.
//   - Cost above the key's capacity (engine.ErrInvalidCost): 413 Content Too
//     Large, without Retry-After, since waiting can never admit it.
//   - No key (the key function failed, or gave a key the engine rejects as
//     blank or too long) or a cost below 1: 500 Internal Server Error, with
//     a plain-text body saying the server could not derive a rate-limit key
//     (or cost). These are the server's configuration failing.
//   - The request's context ended before the engine decided (the client went
//     away, or a server deadline passed): 503 with no body, and nothing spent.
//   - Any other engine error (engine.ErrClockRegression): 500.
//
// The package writes bodies with http.Error and never logs.
package httplimit
