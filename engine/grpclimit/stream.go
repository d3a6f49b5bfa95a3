package grpclimit

import (
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// heldHeader is a server stream that holds RateLimit fields for its header
// until the handler first sends, then sets them: set earlier, the header
// would go out before a refusal or a failure that came later and end the
// trailers-only response grpc-go needs to retry the call. The handler may
// send on another goroutine than the one that stores the fields, so both
// are atomics, and the fields are taken by a swap: they go once, in the
// header if it is still to send, else in the trailer at the end.
type heldHeader struct {
	grpc.ServerStream
	fields atomic.Pointer[metadata.MD]
	sent   atomic.Bool
}

// SendHeader sends the header, with the fields held, if any.
func (h *heldHeader) SendHeader(md metadata.MD) error {
	h.header()
	return h.ServerStream.SendHeader(md)
}

// SendMsg sends m, after the header with the fields held, if any.
func (h *heldHeader) SendMsg(m any) error {
	h.header()
	return h.ServerStream.SendMsg(m)
}

// header sets the fields held in the header, on the first send.
func (h *heldHeader) header() {
	if !h.sent.Swap(true) {
		h.set(false)
	}
}

// end is the handler's return with err: fields still held go in the
// header if it succeeded and the header is still to send, else in the
// trailer, so that a failure stays trailers-only.
func (h *heldHeader) end(err error) { h.set(err != nil) }

// set takes the fields held, if any, and sets them in the header, or in
// the trailer if failed or the header went already (the handler sent it
// through grpc.SendHeader, which this stream does not see, or sent before
// the fields were known).
func (h *heldHeader) set(failed bool) {
	setOuter(h.ServerStream, failed)
	if md := h.fields.Swap(nil); md != nil && (failed || h.ServerStream.SetHeader(*md) != nil) {
		h.ServerStream.SetTrailer(*md)
	}
}

// meteredStream is a server stream that spends its call's cost for each
// message it receives (WithPerMessage). RecvMsg runs on one goroutine at a
// time, as grpc allows, and pushed is written there.
type meteredStream struct {
	heldHeader
	l       *Limiter
	method  string
	key     string
	cost    int64
	held    bool        // the first message a bucket let through has set the fields
	pushed  bool        // a refusal's trailer was set: a second pushback value would stop grpc-go retrying
	refused atomic.Bool // a message was refused, by the bucket, a store's failure rule or an error
}

// trailersOnly reports whether a message was refused before the header
// was sent: the response then stays trailers-only, for a retry, and
// carries only the refusal's fields (none for a degraded answer or an
// error), so the fields held are dropped.
// A Limiter chained outside may have refused one: its refusal is the
// whole answer then, as one chained inside (see dropHeld).
func (s *meteredStream) trailersOnly() bool {
	return s.refused.Load() && !s.sent.Load() || s.heldHeader.trailersOnly()
}

// RecvMsg receives a message into m and spends its cost. A message the
// bucket cannot pay for is dropped and the refusal returned; an error of
// the underlying stream (io.EOF at the end) is returned as it is, and
// charges nothing. The RateLimit fields of WithHeaders go once each: as
// the first message a bucket let through left it, held for the header
// (see heldHeader), and as the first refusal left it, in the trailer.
func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	d, r := s.l.spend(ctx, s.key, s.cost)
	first := !s.held
	refused := r.status != nil && !s.l.shadow && !s.pushed // a refusal whose trailer is still to set
	v := s.l.judge(ctx, s.method, s.key, d, r.cause == nil && (refused || first), r)
	switch {
	case v.status == nil && v.md != nil && first:
		md := v.md // not &v.md, which would move v to the heap at every message
		s.held = true
		s.fields.Store(&md)
	case v.status != nil:
		s.refused.Store(true)
		if !s.pushed {
			dropOuter(s.ServerStream)
			if trailer := v.trailer(); trailer != nil {
				s.pushed = true
				s.SetTrailer(trailer)
			}
		}
	}
	return v.status
}

// heldSetter is a stream of a Limiter that may hold RateLimit fields: a
// Limiter chained inside it has it set them (set's failed) before its own,
// so that the outer, enforced, values come first, as httplimit's enforced
// items do (see heldMD for unary calls).
// dropHeld discards them and those of the Limiters outside, for a refusal
// by a Limiter inside (see heldMD.drop). trailersOnly reports a refusal
// outside, before the header went, for which a Limiter inside drops its
// own at the end.
type heldSetter interface {
	setHeld(failed bool)
	dropHeld()
	trailersOnly() bool
}

func (h *heldHeader) setHeld(failed bool) { h.set(failed) }

func (h *heldHeader) dropHeld() {
	h.fields.Store(nil)
	dropOuter(h.ServerStream)
}

func (h *heldHeader) trailersOnly() bool { return outerTrailersOnly(h.ServerStream) }

func (s *settledStream) setHeld(failed bool) { setOuter(s.ServerStream, failed) }

func (s *settledStream) trailersOnly() bool { return outerTrailersOnly(s.ServerStream) }

func (s *settledStream) dropHeld() { dropOuter(s.ServerStream) }

// setOuter sets the fields that ss, an outer Limiter's stream, still
// holds, if it is one.
func setOuter(ss grpc.ServerStream, failed bool) {
	if o, ok := ss.(heldSetter); ok {
		o.setHeld(failed)
	}
}

// dropOuter discards the fields that ss, an outer Limiter's stream, and
// those outside it still hold, if it is one.
func dropOuter(ss grpc.ServerStream) {
	if o, ok := ss.(heldSetter); ok {
		o.dropHeld()
	}
}

// outerTrailersOnly reports whether ss, an outer Limiter's stream, or one
// outside it refused a message before the header was sent.
func outerTrailersOnly(ss grpc.ServerStream) bool {
	o, ok := ss.(heldSetter)
	return ok && o.trailersOnly()
}
