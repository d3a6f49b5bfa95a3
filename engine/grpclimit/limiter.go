package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/httplimit"
)

// Limiter admits gRPC calls through an engine.Admitter: the in-process
// engine.Engine, or a redisstore.Store for one quota shared by every
// replica of a service. Its methods Unary and Stream are server
// interceptors:
//
//	srv := grpc.NewServer(grpc.UnaryInterceptor(l.Unary), grpc.StreamInterceptor(l.Stream))
//
// A Limiter is immutable after New and safe for concurrent use; the zero
// value is not usable.
type Limiter struct {
	engine     engine.Admitter
	reclaim    reclaimer // engine, if it estimates when a key slot frees up; else nil
	key        KeyFunc   // nil: the grouped peer address
	cost       CostFunc  // nil: 1
	ipv6Bits   int
	exempt     map[string]struct{}
	perMessage bool
}

// reclaimer is the optional method of an Admitter that frees key slots in
// the background, as the engine's sweeps do: how long until a slot can next
// be free, and false when no background reclamation will run.
type reclaimer interface {
	ReclaimAfter() (time.Duration, bool)
}

// New returns a Limiter that spends each call's cost from its key's bucket
// in e. Without options the key is the peer's IP address, IPv6 grouped per
// /64, as httplimit.ClientKey gives it; the cost is 1; no method is exempt;
// and a stream spends once, when it starts. It returns an error wrapping
// ErrInvalidOption for a nil engine or a nil or invalid option.
func New(e engine.Admitter, opts ...Option) (*Limiter, error) {
	if v := reflect.ValueOf(e); e == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, fmt.Errorf("%w: nil engine", ErrInvalidOption)
	}
	c := config{ipv6Bits: httplimit.DefaultIPv6Prefix}
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	l := &Limiter{
		engine:     e,
		key:        c.key,
		cost:       c.cost,
		ipv6Bits:   c.ipv6Bits,
		exempt:     c.exempt,
		perMessage: c.perMessage,
	}
	l.reclaim, _ = e.(reclaimer)
	return l, nil
}

// Unary is a grpc.UnaryServerInterceptor: it decides the call before
// handler runs, and a refused call never reaches it. The status codes are
// listed in the package documentation.
func (l *Limiter) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if _, ok := l.exempt[info.FullMethod]; ok {
		return handler(ctx, req)
	}
	key, cost, err := l.prepare(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if pushback, err := l.spend(ctx, key, cost); err != nil {
		if pushback > 0 {
			_ = grpc.SetTrailer(ctx, pushbackMD(pushback)) // fails only outside a server call
		}
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor. By default it decides the
// stream once, before handler runs, and a refused stream never reaches it;
// with WithPerMessage it derives the key and cost when the stream starts
// and spends the cost for each message handler receives.
func (l *Limiter) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if _, ok := l.exempt[info.FullMethod]; ok {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	key, cost, err := l.prepare(ctx, info.FullMethod)
	if err != nil {
		return err
	}
	if l.perMessage {
		return handler(srv, &meteredStream{ServerStream: ss, l: l, key: key, cost: cost})
	}
	if pushback, err := l.spend(ctx, key, cost); err != nil {
		if pushback > 0 {
			ss.SetTrailer(pushbackMD(pushback))
		}
		return err
	}
	return handler(srv, ss)
}

// prepare derives the key and cost of a call, or the status error that
// refuses it.
func (l *Limiter) prepare(ctx context.Context, method string) (string, int64, error) {
	client := ""
	if a, ok := peerIP(ctx); ok {
		client = httplimit.ClientKey(a, l.ipv6Bits)
	}
	key := client
	switch {
	case l.key != nil:
		k, err := l.key(ctx, method, client)
		if err != nil {
			return "", 0, errNoKey
		}
		key = k
	case client == "":
		return "", 0, errNoKey
	}
	cost := int64(1)
	if l.cost != nil {
		if cost = l.cost(ctx, method); cost < 1 {
			return "", 0, errNoCost
		}
	}
	return key, cost, nil
}

// spend takes cost from key's bucket, and returns a nil error if the call
// may go on, or else the status error that refuses it and the pushback for
// the grpc-retry-pushback-ms trailer in milliseconds (0: none).
func (l *Limiter) spend(ctx context.Context, key string, cost int64) (pushback int64, err error) {
	d, err := l.engine.Allow(ctx, key, cost)
	switch {
	case err != nil:
		return l.failure(err)
	case !d.Allowed && d.Degraded:
		// a store's failure rule: the server's outage, not the client's limit
		ms := ceilMillis(d.RetryAfter)
		return ms, retryable(codes.Unavailable, msgDegraded, ms)
	case !d.Allowed:
		ms := ceilMillis(d.RetryAfter)
		return ms, retryable(codes.ResourceExhausted, msgDenied, ms)
	}
	return 0, nil
}

// peerIP returns the IP address of the call's peer, if it has one.
func peerIP(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	var a netip.Addr
	switch addr := p.Addr.(type) {
	case *net.TCPAddr:
		a = addr.AddrPort().Addr()
	case *net.UDPAddr:
		a = addr.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a, a.IsValid()
}
