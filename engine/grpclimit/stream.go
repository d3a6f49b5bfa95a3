package grpclimit

import (
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// meteredStream is a server stream that spends its call's cost for each
// message it receives (WithPerMessage). RecvMsg runs on one goroutine at a
// time, as grpc allows, and pushed is written there; the handler may send
// from another, so fields and sent, which a send reads, are atomics.
type meteredStream struct {
	grpc.ServerStream
	l      *Limiter
	method string
	key    string
	cost   int64
	pushed bool // a refusal's trailer was set: a second pushback value would stop grpc-go retrying
	// fields are the RateLimit fields of the first message let through,
	// held until the handler first sends (sent), then set in the header:
	// set earlier, a header would go before a later refusal and end the
	// trailers-only response grpc-go needs to retry it.
	fields atomic.Pointer[metadata.MD]
	sent   atomic.Bool
}

// RecvMsg receives a message into m and spends its cost. A message the
// bucket cannot pay for is dropped and the refusal returned; an error of
// the underlying stream (io.EOF at the end) is returned as it is, and
// charges nothing. The RateLimit fields of WithHeaders go once each: as
// the first message a bucket let through left it, in the header the
// handler first sends, and as the first refusal left it, in the trailer.
func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	d, r := s.l.spend(ctx, s.key, s.cost)
	first := s.fields.Load() == nil && !s.sent.Load()
	refused := r.status != nil && !s.l.shadow && !s.pushed // a refusal whose trailer is still to set
	v := s.l.judge(ctx, s.method, s.key, d, r.cause == nil && (refused || first), r)
	switch {
	case v.status == nil && v.md != nil && first:
		s.fields.Store(&v.md)
	case v.status != nil && !s.pushed:
		if trailer := v.trailer(); trailer != nil {
			s.pushed = true
			s.SetTrailer(trailer)
		}
	}
	return v.status
}

// SendHeader sends the header, with the fields RecvMsg holds, if any.
func (s *meteredStream) SendHeader(md metadata.MD) error {
	s.header()
	return s.ServerStream.SendHeader(md)
}

// SendMsg sends m, after the header with the fields RecvMsg holds, if any.
func (s *meteredStream) SendMsg(m any) error {
	s.header()
	return s.ServerStream.SendMsg(m)
}

// header sets the fields RecvMsg holds in the header, on the first send.
func (s *meteredStream) header() {
	if s.sent.Swap(true) {
		return
	}
	if md := s.fields.Load(); md != nil {
		_ = s.ServerStream.SetHeader(*md) // fails only if the handler sent the header itself
	}
}
