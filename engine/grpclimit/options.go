package grpclimit

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// KeyFunc derives a call's rate-limit key (see WithKey). fullMethod is the
// gRPC method, "/package.Service/Method"; the call's metadata is in ctx
// (metadata.FromIncomingContext). client is the default key, the peer's
// address (or the client WithTrustedProxies finds behind it) grouped as
// httplimit.ClientKey says ("203.0.113.7", "2001:db8:1:2::/64"), or ""
// when the peer has no IP address. An error that carries a gRPC status
// (status.Error, wrapped or not) refuses the call with that status: a key
// function's own answer to a call that lacks what its key needs
// (codes.InvalidArgument, codes.Unauthenticated). Any other error, or a
// key the engine rejects (blank, or longer than its MaxKeyBytes), refuses
// the call with codes.Internal.
type KeyFunc func(ctx context.Context, fullMethod string, client string) (string, error)

// CostFunc returns the tokens a call spends (see WithCost). A cost below 1
// refuses the call with codes.Internal; a cost above the key's capacity can
// never be admitted, and is refused with codes.InvalidArgument.
type CostFunc func(ctx context.Context, fullMethod string) int64

// Option configures New.
type Option func(*config) error

// config is what the options set; New validates it as a whole.
type config struct {
	key        KeyFunc
	cost       CostFunc
	ipv6Bits   int
	exempt     map[string]struct{}
	perMessage bool
	trusted    []netip.Prefix
	headers    bool
	policyName string
	onError    ErrorFunc
	shadow     bool
}

// ErrorFunc is told of a call answered with an error other than a limit's
// (see WithOnError). fullMethod is the gRPC method; err's status
// (status.Code, status.FromError) is the one the call was answered with,
// or in shadow mode would have been, and errors.Is finds its cause.
type ErrorFunc func(ctx context.Context, fullMethod string, err error)

// forwardedFor is the metadata key WithTrustedProxies reads.
const forwardedFor = "x-forwarded-for"

// WithKey replaces the default key, the grouped peer address, with f. f is
// given the grouped peer address as client, so a per-method limit is
//
//	grpclimit.WithKey(func(_ context.Context, method, client string) (string, error) {
//		return method + " " + client, nil
//	})
//
// and a per-tenant one reads the tenant from the metadata in ctx. Unlike
// the default key, f is called when the peer has no IP address (a Unix
// socket), with client "", so it can key such calls by their metadata.
func WithKey(f KeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithKey(nil)", ErrInvalidOption)
		}
		c.key = f
		return nil
	}
}

// WithCost replaces the default cost of 1 token per call with f. With
// WithPerMessage, f is called once when a stream starts, and its cost is
// spent for each message received. Without it, the cost may be an estimate
// that the handler settles with Settle.
func WithCost(f CostFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithCost(nil)", ErrInvalidOption)
		}
		c.cost = f
		return nil
	}
}

// WithIPv6Prefix groups IPv6 peers by a prefix of length bits, from
// httplimit.MinIPv6Prefix (32) to 128, instead of
// httplimit.DefaultIPv6Prefix (64), exactly as httplimit.WithIPv6Prefix
// does: "2001:db8:1::/48" for 48 bits, "2001:db8::7/128" for 128, which
// keys each address alone. IPv4 peers are always keyed per address.
func WithIPv6Prefix(bits int) Option {
	return func(c *config) error {
		if bits < httplimit.MinIPv6Prefix || bits > 128 {
			return fmt.Errorf("%w: WithIPv6Prefix(%d): want %d to 128", ErrInvalidOption, bits, httplimit.MinIPv6Prefix)
		}
		c.ipv6Bits = bits
		return nil
	}
}

// WithExempt lets the calls of the given methods through without deciding
// or charging them: health checks ("/grpc.health.v1.Health/Check" and
// ".../Watch"), server reflection. Each name is a full method,
// "/package.Service/Method", as grpc.UnaryServerInfo.FullMethod has it;
// anything else is refused with ErrInvalidOption, so a misspelt name does
// not silently limit the method it meant to exempt. It may be given more
// than once; the names add up.
func WithExempt(methods ...string) Option {
	return func(c *config) error {
		if len(methods) == 0 {
			return fmt.Errorf("%w: WithExempt: no methods", ErrInvalidOption)
		}
		for _, m := range methods {
			if !validMethod(m) {
				return fmt.Errorf("%w: WithExempt(%q): want \"/package.Service/Method\"", ErrInvalidOption, m)
			}
		}
		if c.exempt == nil {
			c.exempt = make(map[string]struct{}, len(methods))
		}
		for _, m := range methods {
			c.exempt[m] = struct{}{}
		}
		return nil
	}
}

// WithPerMessage makes a stream spend its cost for each message it
// receives (each successful RecvMsg) instead of once when it starts. A
// message that cannot be paid for is dropped and RecvMsg returns the
// refusal, which the handler should return as its error. Messages the
// server sends are never charged, so a server-streaming call spends for
// its one request. Unary calls are unaffected.
func WithPerMessage() Option {
	return func(c *config) error {
		c.perMessage = true
		return nil
	}
}

// WithTrustedProxies makes the client the address that trusted proxies
// in front of the server (an Envoy, a gRPC gateway) report in the
// "x-forwarded-for" metadata of the call, when the peer is in one of
// prefixes. All the key's values are one list, in order, read from the
// right exactly as httplimit.ClientIP reads X-Forwarded-For (by
// httplimit.ClientIPFrom): the client is the right-most address not in a
// trusted prefix, the walk stops trusting at the first entry that is not
// an address, and entries a client wrote in front of its own are never
// used. The client is then grouped as the peer is without this option
// (httplimit.ClientKey, WithIPv6Prefix). A peer outside every prefix is
// the client and its metadata is not read.
//
// With no prefixes it trusts nothing, as without the option. It may be
// given more than once; the prefixes add up. An invalid prefix (the zero
// netip.Prefix) is refused with ErrInvalidOption.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *config) error {
		for i, p := range prefixes {
			if !p.IsValid() {
				return fmt.Errorf("%w: WithTrustedProxies: prefix %d is not valid", ErrInvalidOption, i)
			}
		}
		for _, p := range prefixes {
			p = p.Masked()
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			c.trusted = append(c.trusted, p)
		}
		return nil
	}
}

// WithHeaders sends the RateLimit fields that httplimit writes, with the
// same values, as metadata: "ratelimit-policy" and "ratelimit" (see the
// package documentation). An admitted call carries them in its header
// metadata (in its trailer metadata if the handler fails, or sent the
// header itself), a call a bucket denied in its trailer metadata, beside the
// pushback trailer, so that a refusal or a failure stays a trailers-only
// response, which grpc-go clients need to retry it. A grpc-go client reads them with
// grpc.Header and grpc.Trailer. Answers that are not a bucket's carry none:
// a store's failure rule, an engine error.
func WithHeaders() Option {
	return func(c *config) error {
		c.headers = true
		return nil
	}
}

// WithPolicyName names the default limit's quota policy in the RateLimit
// fields of WithHeaders, as httplimit.WithPolicyName does, instead of
// httplimit.DefaultPolicyName, "default". name must be printable ASCII and
// not empty.
func WithPolicyName(name string) Option {
	return func(c *config) error {
		if _, err := httplimit.NewFields(name); err != nil || name == "" {
			return fmt.Errorf("%w: WithPolicyName(%q): want printable ASCII, not empty", ErrInvalidOption, name)
		}
		c.policyName = name
		return nil
	}
}

// WithOnError calls f for every call (with WithPerMessage, every message)
// answered with an error that is not a limit's: a bucket's denial
// (ResourceExhausted) is not one, while a store's failure rule denying
// (Unavailable, cause ErrDegraded), a full key table or a closed engine
// (Unavailable), a cost above capacity (InvalidArgument), a key or cost
// function failing (Internal, ErrKeyFunc, ErrNoPeerIP, ErrCostFunc), any
// other engine error (Internal) and the call's context ending (Canceled,
// DeadlineExceeded) are. In shadow mode it is also called for the errors
// that are then let through. f runs on the call's goroutine before the
// call is answered, so it should be quick; it is how a service logs or
// counts the limiter's failures, since the package logs nothing.
func WithOnError(f ErrorFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("%w: WithOnError(nil)", ErrInvalidOption)
		}
		c.onError = f
		return nil
	}
}

// WithShadow decides and spends every call as usual, and sends the
// RateLimit fields when WithHeaders says so, but refuses nothing: a call a
// bucket denies, or a store's failure rule denies, or that fails with an
// engine, key or cost error, goes on to its handler (which, for a call
// without a key or cost, spends nothing), and is counted in the Limiter's
// ShadowStats instead. Errors are given to the function of WithOnError as
// without it. Only the call's context ending is still answered, as the
// client is gone. It is for measuring a limit on live traffic before
// enforcing it.
//
// Beside an enforcing Limiter, chain the shadow's interceptor after the
// enforcing one's (grpc.ChainUnaryInterceptor(enforcing.Unary,
// shadow.Unary)), so that it runs inside it, as httplimit's shadow
// middleware does: a call the enforcing Limiter refuses then never
// reaches the shadow, and with WithHeaders its refusal stays
// trailers-only, which grpc-go clients need to retry it. The shadow's
// fields are sent as values of their own after the enforcing one's, so the
// first value of each key is the enforced limit's.
func WithShadow() Option {
	return func(c *config) error {
		c.shadow = true
		return nil
	}
}

// validMethod reports whether m has the form "/service/method", both parts
// non-empty.
func validMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	service, method, ok := strings.Cut(rest, "/")
	return ok && service != "" && method != "" && !strings.Contains(method, "/")
}
