package grpclimit

import "google.golang.org/grpc"

// meteredStream is a server stream that spends its call's cost for each
// message it receives (WithPerMessage). It is used by the handler's
// goroutine alone, as grpc allows only one goroutine in RecvMsg at a time;
// pushed is written there.
type meteredStream struct {
	grpc.ServerStream
	l      *Limiter
	method string
	key    string
	cost   int64
	pushed bool // a refusal's trailer was set: a second pushback value would stop grpc-go retrying
	headed bool // an admission's fields were set in the header, which goes once
}

// RecvMsg receives a message into m and spends its cost. A message the
// bucket cannot pay for is dropped and the refusal returned; an error of
// the underlying stream (io.EOF at the end) is returned as it is, and
// charges nothing. The RateLimit fields of WithHeaders go with the first
// message let through, in the header, unless the handler has sent it
// already, and with the first refusal, in the trailer: each is sent once,
// and cannot follow every message.
func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.Context()
	d, r := s.l.spend(ctx, s.key, s.cost)
	fields := r.cause == nil && (r.status != nil || !s.headed) // a bucket's answer whose fields can still go
	v := s.l.judge(ctx, s.method, s.key, d, fields, r)
	switch {
	case v.status == nil && v.md != nil:
		s.headed = true
		_ = s.SetHeader(v.md) // fails once the handler has sent the header
	case v.status != nil && !s.pushed:
		if trailer := v.trailer(); trailer != nil {
			s.pushed = true
			s.SetTrailer(trailer)
		}
	}
	return v.status
}
