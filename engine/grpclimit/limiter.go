package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

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
// A Limiter is immutable after New, but for the counters of ShadowStats,
// and safe for concurrent use; the zero value is not usable.
type Limiter struct {
	engine     engine.Admitter
	reclaim    reclaimer // engine, if it estimates when a key slot frees up; else nil
	key        KeyFunc   // nil: the grouped peer address
	cost       CostFunc  // nil: 1
	ipv6Bits   int
	exempt     map[string]struct{}
	perMessage bool
	trusted    []netip.Prefix // WithTrustedProxies; nil: the peer is the client
	headers    bool
	fields     httplimit.Fields // WithHeaders' names (WithPolicyName)
	onError    ErrorFunc        // nil: none
	shadow     bool
	settles    bool // WithCost: a call's cost is an estimate Settle can settle (not a stream's under WithPerMessage)

	shadowRefused, shadowDegraded, shadowErrors atomic.Uint64
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
// a stream spends once, when it starts; no metadata is read or written;
// errors are only answered; and a refusal is enforced. It returns an error
// wrapping ErrInvalidOption for a nil engine or a nil or invalid option.
func New(e engine.Admitter, opts ...Option) (*Limiter, error) {
	if v := reflect.ValueOf(e); e == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, fmt.Errorf("%w: nil engine", ErrInvalidOption)
	}
	c := config{ipv6Bits: httplimit.DefaultIPv6Prefix, policyName: httplimit.DefaultPolicyName}
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := opt(&c); err != nil {
			return nil, err
		}
	}
	fields, err := httplimit.NewFields(c.policyName)
	if err != nil {
		return nil, err // WithPolicyName checked the name already
	}
	l := &Limiter{
		engine:     e,
		key:        c.key,
		cost:       c.cost,
		ipv6Bits:   c.ipv6Bits,
		exempt:     c.exempt,
		perMessage: c.perMessage,
		trusted:    c.trusted,
		headers:    c.headers,
		fields:     fields,
		onError:    c.onError,
		shadow:     c.shadow,
		settles:    c.cost != nil,
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
	v, t := l.decide(ctx, info.FullMethod)
	if v.status != nil {
		heldFrom(ctx).drop()
		if trailer := v.trailer(); trailer != nil {
			_ = grpc.SetTrailer(ctx, trailer) // fails only outside a server call
		}
		return nil, v.status
	}
	var held *heldMD
	if v.md != nil {
		c := &heldCtx{Context: ctx, fields: v.md}
		c.h.parent = heldFrom(ctx)
		c.h.md.Store(&c.fields)
		ctx, held = c, &c.h
	}
	if l.settles {
		ctx = l.settleable(ctx, t)
	}
	resp, err := handler(ctx, req)
	if held != nil {
		held.set(ctx, err != nil)
	}
	return resp, err
}

// heldMD is an admitted unary call's RateLimit fields, held until its
// handler has answered: a header set before would end a failure's
// trailers-only response. It is carried in the handler's context, so that
// a Limiter chained inside (a shadow one) sets the fields of the Limiters
// outside it before its own: the outer, enforced, values come first, as
// httplimit's enforced items do. The fields are taken by a swap, once.
type heldMD struct {
	md     atomic.Pointer[metadata.MD]
	parent *heldMD // an outer Limiter's, or nil
}

// heldMDKey is the context key of a call's innermost heldMD.
type heldMDKey struct{}

// heldCtx carries a heldMD and its fields in one allocation.
type heldCtx struct {
	context.Context
	h      heldMD
	fields metadata.MD
}

func (c *heldCtx) Value(k any) any {
	if _, ok := k.(heldMDKey); ok {
		return &c.h
	}
	return c.Context.Value(k)
}

// heldFrom returns the heldMD ctx carries, or nil.
func heldFrom(ctx context.Context) *heldMD {
	h, _ := ctx.Value(heldMDKey{}).(*heldMD)
	return h
}

// drop discards the fields h and the Limiters outside it still hold, for
// a refusal by a Limiter inside them: as httplimit's middleware replaces or
// removes an outer one's, a refusal carries only the fields of the Limiter
// that refused (none for a store's failure rule or an error). h may be nil.
func (h *heldMD) drop() {
	for ; h != nil; h = h.parent {
		h.md.Store(nil)
	}
}

// set sets the fields still held by the outer Limiters, outermost first,
// then h's: in the header, or in the trailer if the handler failed or sent
// the header itself (SetHeader then fails). Both fail only outside a
// server call.
func (h *heldMD) set(ctx context.Context, failed bool) {
	if h.parent != nil {
		h.parent.set(ctx, failed)
	}
	if md := h.md.Swap(nil); md != nil && (failed || grpc.SetHeader(ctx, *md) != nil) {
		_ = grpc.SetTrailer(ctx, *md)
	}
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
	if l.perMessage {
		key, cost, r := l.prepare(ctx, info.FullMethod)
		if r.status != nil {
			if v := l.judge(ctx, info.FullMethod, "", engine.Decision{}, false, r); v.status != nil {
				dropOuter(ss)
				if trailer := v.trailer(); trailer != nil {
					ss.SetTrailer(trailer)
				}
				return v.status
			}
			return handler(srv, ss) // shadow: nothing to spend without a key or cost
		}
		ms := &meteredStream{heldHeader: heldHeader{ServerStream: ss}, l: l, method: info.FullMethod, key: key, cost: cost}
		err := handler(srv, ms)
		if !ms.trailersOnly() {
			ms.end(err)
		}
		return err
	}
	v, t := l.decide(ctx, info.FullMethod)
	if v.status != nil {
		dropOuter(ss)
		if trailer := v.trailer(); trailer != nil {
			ss.SetTrailer(trailer)
		}
		return v.status
	}
	var held *heldHeader
	if v.md != nil {
		md := v.md // not &v.md, which would move v to the heap at every call
		held = &heldHeader{ServerStream: ss}
		held.fields.Store(&md)
		ss = held
	}
	if l.settles {
		s := &settledStream{ServerStream: ss}
		l.settleInto(ctx, &s.ctx, t)
		ss = s
	}
	err := handler(srv, ss)
	if held != nil && !held.trailersOnly() {
		held.end(err)
	}
	return err
}

// ShadowStats counts the decisions that WithShadow let through which would
// otherwise have been refused. It is all zeros without WithShadow.
type ShadowStats struct {
	// Refused is the calls (with WithPerMessage, the messages) a bucket
	// denied: ResourceExhausted without WithShadow. (httplimit's Stats uses
	// the same names.)
	Refused uint64
	// Degraded is those a store's failure rule denied
	// (engine.Decision.Degraded): Unavailable without WithShadow.
	Degraded uint64
	// Errors is those answered with any other error but the call's context
	// ending (a full key table, a closed engine, a cost above capacity, a
	// key or cost function failing, a store's error), also given to the
	// function of WithOnError.
	Errors uint64
}

// ShadowStats returns the counts since New. Each count is read atomically,
// but not the three together.
func (l *Limiter) ShadowStats() ShadowStats {
	return ShadowStats{
		Refused:  l.shadowRefused.Load(),
		Degraded: l.shadowDegraded.Load(),
		Errors:   l.shadowErrors.Load(),
	}
}

// verdict is how a decided call is answered: refused with status (nil: it
// goes on), with the pushback trailer of pushback milliseconds (0: none),
// and the RateLimit fields md (WithHeaders; nil: none), in the header of an
// admitted call and in the trailer of a refused one, which must stay a
// trailers-only response for grpc-go to retry it.
type verdict struct {
	status   error
	pushback int64
	md       metadata.MD
}

// trailer returns the trailer of a refusal, or nil.
func (v verdict) trailer() metadata.MD {
	if v.pushback <= 0 {
		return v.md
	}
	if v.md == nil {
		return pushbackMD(v.pushback)
	}
	v.md[PushbackTrailer] = pushbackMD(v.pushback)[PushbackTrailer]
	return v.md
}

// take is what decide took for a call, for Settle: cost from key, or
// nothing (taken false).
type take struct {
	key   string
	cost  int64
	taken bool
}

// decide derives the call's key and cost, spends, and returns how to answer
// and what it took.
func (l *Limiter) decide(ctx context.Context, method string) (verdict, take) {
	key, cost, r := l.prepare(ctx, method)
	if r.status != nil {
		return l.judge(ctx, method, "", engine.Decision{}, false, r), take{}
	}
	d, r := l.spend(ctx, key, cost)
	t := take{key: key, cost: cost, taken: r.status == nil && !d.Degraded}
	return l.judge(ctx, method, key, d, r.cause == nil, r), t
}

// judge turns a decision (decided: d is the engine's answer for key) and
// its refusal (r, zero when admitted) into a verdict: it writes the
// RateLimit fields, tells WithOnError, and in shadow mode counts and lets
// through every refusal but the call's context ending.
func (l *Limiter) judge(ctx context.Context, method, key string, d engine.Decision, decided bool, r refusal) verdict {
	var v verdict
	if l.headers && decided && !d.Degraded {
		v.md = l.rateLimitMD(key, d)
	}
	if r.status == nil {
		return v
	}
	if r.cause != nil && l.onError != nil {
		l.onError(ctx, method, &callError{status: status.Convert(r.status), cause: r.cause})
	}
	if l.shadow && !r.contextEnded(ctx) {
		switch {
		case r.cause == nil:
			l.shadowRefused.Add(1)
		case errors.Is(r.cause, ErrDegraded):
			l.shadowDegraded.Add(1)
		default:
			l.shadowErrors.Add(1)
		}
		return v
	}
	v.status, v.pushback = r.status, r.pushback
	return v
}

// prepare derives the key and cost of a call, or the refusal of a call
// that has none.
func (l *Limiter) prepare(ctx context.Context, method string) (string, int64, refusal) {
	client := ""
	if a, ok := peerIP(ctx); ok {
		if l.trusted != nil {
			a = httplimit.ClientIPFrom(a, httplimit.XForwardedFor, metadata.ValueFromIncomingContext(ctx, forwardedFor), l.trusted)
		}
		client = httplimit.ClientKey(a, l.ipv6Bits)
	}
	key := client
	switch {
	case l.key != nil:
		k, err := l.key(ctx, method, client)
		if err != nil {
			if ended(ctx, err) {
				// The call's own context ending (a lookup canceled because
				// the client went away): answered as any call whose
				// context ended.
				return "", 0, refusal{status: status.FromContextError(ctx.Err()).Err(), cause: fmt.Errorf("grpclimit: the key function: %w", err)}
			}
			st := errNoKey
			if s, ok := status.FromError(err); ok && s.Code() != codes.OK {
				st = s.Err() // the key function's own refusal: InvalidArgument, Unauthenticated
			}
			return "", 0, refusal{status: st, cause: fmt.Errorf("%w: %w", ErrKeyFunc, err)}
		}
		key = k
	case client == "":
		return "", 0, refusal{status: errNoKey, cause: ErrNoPeerIP}
	}
	cost := int64(1)
	if l.cost != nil {
		if cost = l.cost(ctx, method); cost < 1 {
			return "", 0, refusal{status: errNoCost, cause: ErrCostFunc}
		}
	}
	return key, cost, refusal{}
}

// spend takes cost from key's bucket, and returns the engine's decision and
// the refusal, zero if the call may go on.
func (l *Limiter) spend(ctx context.Context, key string, cost int64) (engine.Decision, refusal) {
	d, err := l.engine.Allow(ctx, key, cost)
	switch {
	case err != nil:
		return d, l.failure(err)
	case !d.Allowed && d.Degraded:
		// a store's failure rule: the server's outage, not the client's limit
		ms := ceilMillis(d.RetryAfter)
		return d, refusal{status: retryable(codes.Unavailable, msgDegraded, ms), pushback: ms, cause: ErrDegraded}
	case !d.Allowed:
		ms := ceilMillis(d.RetryAfter)
		return d, refusal{status: retryable(codes.ResourceExhausted, msgDenied, ms), pushback: ms}
	}
	return d, refusal{}
}

// ended reports whether err, a key function's, is ctx ending: ctx is done
// and err is its error, or the status a gRPC call made under it returns
// for it (grpc-go's status errors do not wrap the context's).
func ended(ctx context.Context, err error) bool {
	ctxErr := ctx.Err()
	if ctxErr == nil {
		return false
	}
	if errors.Is(err, ctxErr) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == status.FromContextError(ctxErr).Code()
}

// peerIP returns the IP address of the call's peer, if it has one. An
// address of another type than TCP's and UDP's is read from its text, with
// or without a port: a server run as an http.Handler (grpc.Server.ServeHTTP)
// has its peer from Request.RemoteAddr, which a middleware in front may
// have set to the bare IP of the client its proxy reports.
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
		if strings.HasPrefix(addr.Network(), "unix") {
			// its name is a path the client may choose: "203.0.113.7:1", say
			return netip.Addr{}, false
		}
		a = parseAddr(addr.String())
	}
	return a, a.IsValid()
}

// parseAddr parses an address as a net.Addr's String writes it, with or
// without a port: "192.0.2.1:443", "[2001:db8::1]:443", "192.0.2.1",
// "2001:db8::1" or "[2001:db8::1]". It returns the zero Addr for anything
// else.
func parseAddr(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr()
	}
	if inner, ok := strings.CutPrefix(s, "["); ok {
		if s, ok = strings.CutSuffix(inner, "]"); !ok {
			return netip.Addr{}
		}
	}
	a, _ := netip.ParseAddr(s) // the zero Addr on an error
	return a
}
