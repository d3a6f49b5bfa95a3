package grpclimit

import (
	"context"
	"fmt"
	"strings"

	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// KeyFunc derives a call's rate-limit key (see WithKey). fullMethod is the
// gRPC method, "/package.Service/Method"; the call's metadata is in ctx
// (metadata.FromIncomingContext). client is the default key, the peer's
// address grouped as httplimit.ClientKey says ("203.0.113.7",
// "2001:db8:1:2::/64"), or "" when the peer has no IP address. An error, or a key the engine
// rejects (blank, or longer than its MaxKeyBytes), refuses the call with
// codes.Internal.
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
}

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
// spent for each message received.
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
