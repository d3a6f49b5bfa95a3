package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/tokenshard/tokenshard/engine"
)

// KeyFunc derives a request's rate-limit key. An error, or a key the engine
// rejects (blank, or longer than its MaxKeyBytes), is the server's failure,
// answered with 500.
type KeyFunc func(r *http.Request) (string, error)

// CostFunc returns the tokens a request spends. A cost below 1 is the
// server's failure, answered with 500; a cost above the key's capacity can
// never be admitted, and is answered with 413.
type CostFunc func(r *http.Request) int64

// DeniedFunc writes the response to a request the engine denied. When it is
// called, w's header already holds RateLimit-Policy, RateLimit and
// Retry-After; it must write the status (429 is expected) and any body.
type DeniedFunc func(w http.ResponseWriter, r *http.Request, d engine.Decision)

// Option configures New.
type Option func(*config) error

// config is what the options set; New validates it as a whole.
type config struct {
	key        KeyFunc
	cost       CostFunc
	denied     DeniedFunc
	policyName string
	overload   time.Duration
	header     ProxyHeader
	trusted    []netip.Prefix
}

// Defaults.
const (
	// DefaultPolicyName names the quota policy in the RateLimit header
	// fields when WithPolicyName is not given.
	DefaultPolicyName = "default"
	// DefaultOverloadRetryAfter is the Retry-After sent with a 503 when the
	// engine tracks as many keys as it may (engine.ErrKeyCapacity) or is
	// closed, unless WithOverloadRetryAfter says otherwise.
	DefaultOverloadRetryAfter = time.Second
)

// WithKey replaces the default key, the client IP (see ClientIP), with f.
// It cannot be combined with WithTrustedProxies, which configures only the
// default key; a key function that wants the client IP behind proxies calls
// ClientIP itself.
func WithKey(f KeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithKey(nil)", ErrInvalidOption)
		}
		c.key = f
		return nil
	}
}

// WithCost replaces the default cost of 1 token per request with f.
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
// plain-text body) with f.
func WithDenied(f DeniedFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithDenied(nil)", ErrInvalidOption)
		}
		c.denied = f
		return nil
	}
}

// WithTrustedProxies makes the default key the client IP that the reverse
// proxies in prefixes report in header h, as ClientIP describes: only when
// the direct peer is one of them, and never an entry written in front of
// the right-most untrusted address. Without this option no header is read.
// IPv4-mapped IPv6 prefixes are taken as the IPv4 prefixes they map.
func WithTrustedProxies(h ProxyHeader, prefixes ...netip.Prefix) Option {
	return func(c *config) error {
		if h != XForwardedFor && h != Forwarded {
			return fmt.Errorf("%w: WithTrustedProxies: header %d is neither XForwardedFor nor Forwarded", ErrInvalidOption, int(h))
		}
		if len(prefixes) == 0 {
			return fmt.Errorf("%w: WithTrustedProxies: no prefixes", ErrInvalidOption)
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

// WithPolicyName names the quota policy in the RateLimit-Policy and
// RateLimit fields; the default is DefaultPolicyName. The name must be
// non-empty printable ASCII, as a structured-field String requires.
func WithPolicyName(name string) Option {
	return func(c *config) error {
		if !validPolicyName(name) {
			return fmt.Errorf("%w: WithPolicyName(%q): want non-empty printable ASCII", ErrInvalidOption, name)
		}
		c.policyName = name
		return nil
	}
}

// WithOverloadRetryAfter sets the Retry-After of a 503 sent because the
// engine tracks as many keys as it may, or is closed; d is rounded up to
// whole seconds and must be positive. Set it near the engine's sweep period:
// that is when full buckets are evicted and key slots free up.
func WithOverloadRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithOverloadRetryAfter(%v): want > 0", ErrInvalidOption, d)
		}
		c.overload = d
		return nil
	}
}
