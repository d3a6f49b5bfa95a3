package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// KeyFunc derives a request's rate-limit key from the request alone (see
// WithKey). An error, or a key the engine rejects (blank, or longer than its
// MaxKeyBytes), is the server's failure, answered with 500.
type KeyFunc func(r *http.Request) (string, error)

// ClientKeyFunc derives a request's rate-limit key from the request and its
// client (see WithClientKey). client is the default key: ClientKey of the
// address ClientIP finds, after WithTrustedProxies, grouped by
// WithIPv6Prefix ("203.0.113.7", "2001:db8:1:2::/64"), or "" when the
// request has no client address (ErrNoClientIP: RemoteAddr holds none, as
// over a Unix socket). Errors and rejected keys are answered with 500, as
// for a KeyFunc.
type ClientKeyFunc func(r *http.Request, client string) (string, error)

// KeysFunc derives the requests one HTTP request is limited by (see
// WithKeys): a key and a cost each, decided together, all or nothing. client
// is the default key, as a ClientKeyFunc is given it: ClientKey of the
// address ClientIP finds, after WithTrustedProxies, grouped by
// WithIPv6Prefix, or "" when the request has none. An error, no requests or
// more than engine.MaxAllowAll, a key the engine rejects or a cost below 1
// is the server's failure, answered with 500; a key whose costs add up above
// its capacity can never be admitted, and is answered with 413. The
// middleware keeps the slice for Settle: f must not change it once returned.
type KeysFunc func(r *http.Request, client string) ([]engine.Request, error)

// ErrorFunc observes a request the middleware answered with an error status
// (see WithOnError). err says why; test it with errors.Is.
type ErrorFunc func(r *http.Request, err error)

// CostFunc returns the tokens a request spends. A cost below 1 is the
// server's failure, answered with 500; a cost above the key's capacity can
// never be admitted, and is answered with 413.
type CostFunc func(r *http.Request) int64

// DeniedFunc writes the response to a request a bucket denied (never one a
// store's failure rule denied: see WithDenied). When it is called, w's
// header already holds RateLimit-Policy, RateLimit and Retry-After; it must
// write the status (429 is expected) and any body.
type DeniedFunc func(w http.ResponseWriter, r *http.Request, d engine.Decision)

// Option configures New.
type Option func(*config) error

// config is what the options set; New validates it as a whole.
type config struct {
	key        KeyFunc
	clientKey  ClientKeyFunc
	keys       KeysFunc
	ipv6Bits   int
	cost       CostFunc
	denied     DeniedFunc
	policyName string
	overload   time.Duration // 0: not set
	header     ProxyHeader
	trusted    []netip.Prefix
	onError    ErrorFunc
	shadow     bool
}

// DefaultPolicyName names the default limit's quota policy in the RateLimit
// header fields when WithPolicyName is not given.
const DefaultPolicyName = "default"

// WithKey replaces the default key, the grouped client address (see
// ClientKey), with f, which sees only the request: an API token, a tenant.
// WithTrustedProxies and WithIPv6Prefix shape the client address, which f
// is not given, so they do not affect its keys; a key that includes the
// client is what WithClientKey is for. WithKey and WithClientKey exclude
// each other.
func WithKey(f KeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithKey(nil)", ErrInvalidOption)
		}
		c.key = f
		return nil
	}
}

// WithClientKey replaces the default key with f, which is given the
// request and its client as the default key would be: resolved through the
// trusted proxies and grouped by prefix. A per-route limit keys by the
// route's pattern, never the raw path (a path with identifiers in it,
// /users/42, would make a budget per identifier):
//
//	mux.Handle("GET /users/{id}", mw.Handler(h)) // the mux sets r.Pattern first
//	httplimit.WithClientKey(func(r *http.Request, client string) (string, error) {
//		return r.Pattern + " " + client, nil
//	})
//
// r.Pattern is empty when the middleware wraps the whole mux; there,
// `_, pattern := mux.Handler(r)` finds the pattern the mux would route to.
// On a Redis store (engine/redisstore) a pattern's wildcard, "{id}", is a
// hash tag: the key's first "{...}" places it, so every client's key of
// that route goes to one virtual shard (on Redis Cluster, one master).
// Start the key with a tag of the client's, "{" + client + "}" + r.Pattern,
// or set redisstore.Config.IgnoreKeyTags.
// Unlike the default key, which answers 500 when the request has no client
// address (ErrNoClientIP: RemoteAddr holds none, as over a Unix socket), f
// is then called with client "", as grpclimit's WithKey is for a peer
// without an IP address: it may key such a request by something else (an API
// token), or return ErrNoClientIP (or any error) to answer it with 500 (503
// with no body once the request's context has ended, as for every key
// function's error then). A key that only adds "" to a fixed text puts every
// such request in one bucket. WithKey and WithClientKey exclude each other.
func WithClientKey(f ClientKeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithClientKey(nil)", ErrInvalidOption)
		}
		c.clientKey = f
		return nil
	}
}

// WithKeys limits each request by several keys at once: f returns them,
// each with its cost, and the middleware admits the request only if every
// key's bucket holds its cost (engine.Admitter.AllowAll), taking every cost
// then and none otherwise, so a request refused by one limit spends nothing
// from the others. A key may appear more than once; its costs add up. f is
// given the request and its client, resolved through the trusted proxies
// and grouped as the default key is (see ClientKeyFunc), so a route's limit
// and the client's own can be spent together:
//
//	httplimit.WithKeys(func(r *http.Request, client string) ([]engine.Request, error) {
//		if r.Pattern == "POST /login" {
//			return []engine.Request{{Key: "login:" + client, Cost: 1}, {Key: client, Cost: 1}}, nil
//		}
//		return []engine.Request{{Key: client, Cost: 1}}, nil
//	})
//
// The header fields describe the binding request, the one AllowAll names:
// when denied, the key that waits longest, and when admitted, the key with
// the fewest tokens left; its limit and band are written as they would be
// for that key alone. Give the limits of the keys overrides with a Name
// ("login:*" named "login") so that a client can tell which quota bound.
// When the request has no client address (ErrNoClientIP), f is called with
// client "", as a WithClientKey function is: it may key the request by
// something else, or return an error to answer it with 500 (a request
// {Key: client} alone is a blank key, answered with 500 too). WithKeys
// excludes WithKey, WithClientKey and WithCost, which it replaces.
//
// On a store whose AllowAll takes only keys that share a shard (the Redis
// store on Redis Cluster, whose redisstore.ErrCrossShard is answered with
// 500), give a request's keys one hash tag, as in "{" + client + "}:login"
// and "{" + client + "}", so that they always do; a store set to ignore
// tags (redisstore.Config.IgnoreKeyTags) places each key whole, so there
// such keys share a shard only by chance. Only a key's first "{...}" is its
// tag, and a ServeMux pattern's wildcard is one: "route:" + r.Pattern + " {"
// + client + "}" is tagged "id" for "GET /users/{id}", so put the client's
// tag before the pattern.
//
// Every request is one AllowAll, a single key too. A Redis store with
// leases (redisstore.Config.Leases) sends every AllowAll to Redis, so no
// request of this middleware is decided by a lease: a key whose traffic
// should be leased needs a middleware of its own (the default key, or
// WithClientKey), whose Allow a lease covers, at the price that
// engine.Engine.AllowAll states: under saturation, its Allows starve an
// AllowAll on the same key.
func WithKeys(f KeysFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithKeys(nil)", ErrInvalidOption)
		}
		c.keys = f
		return nil
	}
}

// WithOnError calls f for every request the middleware answers with an
// error status of its own, any 4xx or 5xx but a limit's denial: a key or
// cost function that fails or gives what the engine cannot use, no client
// address, a cost above the capacity, a full key table, a closed engine, a
// request whose context ended, a denial by a store's failure rule, and any
// other engine error. err wraps the cause: ErrKeyFunc, ErrNoClientIP,
// ErrCostBelowOne, ErrDegraded, ErrAdmitterContract, or the engine's error
// (engine.ErrCostExceedsCapacity, engine.ErrKeyCapacity, engine.ErrClosed,
// engine.ErrAllowAllSize, engine.ErrInvalidKey, a context error). Under
// WithShadow the request is passed on instead, and f is called all the
// same. f runs on the request's goroutine before the response is written;
// it must be safe for concurrent use. Without it errors are not reported
// anywhere, as the package never logs; the package documentation shows f
// writing to a log/slog Logger.
func WithOnError(f ErrorFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithOnError(nil)", ErrInvalidOption)
		}
		c.onError = f
		return nil
	}
}

// WithShadow makes the middleware observe without enforcing: every request
// is decided and spends its cost as it would under enforcement, so the
// buckets hold what they would, and the RateLimit fields report it, but no
// request is refused. A request the limit would deny reaches the wrapped
// handler with its fields (r the tokens left, fewer than its cost; t the
// time until it would be admitted) and no Retry-After, and is counted in Stats().Refused. A request the
// middleware could not decide (see WithOnError) reaches the handler too,
// without fields, counted in Stats().Errors and given to the WithOnError
// function; so is a denial by a store's failure rule, counted in
// Stats().Degraded. WithDenied's function is never called.
//
// A shadow middleware adds its items to the RateLimit and RateLimit-Policy
// fields that are already on the response, as one List each, under its own
// names (give it a WithPolicyName of its own), and sets them when there are
// none: alone it sets them as an enforcing middleware would. An enforcing
// middleware sets its fields, replacing any. So a candidate limit is tried
// beside the enforced one by putting the shadow middleware inside the
// enforcing one (ExampleWithShadow): the enforced items come first and are
// unchanged, and the shadow one sees the requests the enforced limit
// admitted. Outside the enforcing one, it would see every request, but the
// enforcing middleware would replace its items, and remove them from an
// answer that is not a decision (a 503, 413 or 500).
func WithShadow() Option {
	return func(c *config) error {
		c.shadow = true
		return nil
	}
}

// WithIPv6Prefix groups IPv6 clients by a prefix of length bits, from
// MinIPv6Prefix (32) to 128, instead of DefaultIPv6Prefix (64): every
// address in one prefix shares one bucket, keyed as ClientKey describes
// ("2001:db8:1::/48" for 48 bits, "2001:db8::7/128" for 128, which keys
// each address alone). IPv4 clients are always keyed per address. A shorter
// prefix limits a site that spreads across subnets as one client; 128
// trusts every address, so a client that rotates through its /64 is never
// limited.
func WithIPv6Prefix(bits int) Option {
	return func(c *config) error {
		if bits < MinIPv6Prefix || bits > 128 {
			return fmt.Errorf("%w: WithIPv6Prefix(%d): want %d to 128", ErrInvalidOption, bits, MinIPv6Prefix)
		}
		c.ipv6Bits = bits
		return nil
	}
}

// WithCost replaces the default cost of 1 token per request with f. Its
// cost may be an estimate that the handler settles with Settle.
func WithCost(f CostFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithCost(nil)", ErrInvalidOption)
		}
		c.cost = f
		return nil
	}
}

// WithDenied replaces the default denial response (429 with a short
// plain-text body) with f. It answers limits only: a denial by a store's
// failure rule (engine.Decision.Degraded) is always the middleware's 503
// (see the package doc's status codes), not given to f.
func WithDenied(f DeniedFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithDenied(nil)", ErrInvalidOption)
		}
		c.denied = f
		return nil
	}
}

// WithTrustedProxies makes the client the address that the reverse proxies
// in prefixes report in header h, as ClientIP describes: only when the
// direct peer is one of them, and never an entry written in front of the
// right-most untrusted address. Without this option, or with no prefixes,
// no proxy is trusted and no header is read: the client is RemoteAddr (h
// may then be 0, as an unset setting leaves it). IPv4-mapped IPv6
// prefixes are taken as the IPv4 prefixes they map. The client so found,
// grouped by WithIPv6Prefix, is the default key and what a WithClientKey
// function is given; a WithKey function is given neither. Given more than
// once, the last one counts.
func WithTrustedProxies(h ProxyHeader, prefixes ...netip.Prefix) Option {
	return func(c *config) error {
		if len(prefixes) == 0 { // trusts nothing: as if it were not given
			c.header, c.trusted = 0, nil
			return nil
		}
		if h != XForwardedFor && h != Forwarded {
			return fmt.Errorf("%w: WithTrustedProxies: header %d is neither XForwardedFor nor Forwarded", ErrInvalidOption, int(h))
		}
		trusted := make([]netip.Prefix, len(prefixes))
		for i, p := range prefixes {
			if !p.IsValid() {
				return fmt.Errorf("%w: WithTrustedProxies: prefix %d is not valid", ErrInvalidOption, i)
			}
			trusted[i] = normalizePrefix(p)
		}
		c.header, c.trusted = h, trusted
		return nil
	}
}

// WithPolicyName names the default limit's quota policy in the
// RateLimit-Policy and RateLimit fields; the default is DefaultPolicyName.
// The name must be non-empty printable ASCII, as a structured-field String
// requires. It is also the stem of the names derived for unnamed overrides,
// and an override Name equal to it is used only for the default's quota:
// the package documentation gives the naming rule.
func WithPolicyName(name string) Option {
	return func(c *config) error {
		if !validPolicyName(name) {
			return fmt.Errorf("%w: WithPolicyName(%q): want non-empty printable ASCII", ErrInvalidOption, name)
		}
		c.policyName = name
		return nil
	}
}

// WithOverloadRetryAfter sets a fixed Retry-After for the 503 sent because
// the engine tracks as many keys as it may (engine.ErrKeyCapacity) or is
// closed; d is rounded up to whole seconds and must be positive. Without it
// the first gets the engine's own estimate of when a key slot frees up, if
// it offers one, and otherwise no Retry-After, and the second none: see the
// package documentation. Give it when you know better, such as how long a
// restart takes.
func WithOverloadRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithOverloadRetryAfter(%v): want > 0", ErrInvalidOption, d)
		}
		c.overload = d
		return nil
	}
}
