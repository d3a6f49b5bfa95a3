package grpclimit

import "google.golang.org/grpc"

// meteredStream is a server stream that spends its call's cost for each
// message it receives (WithPerMessage). It is used by the handler's
// goroutine alone, as grpc allows only one goroutine in RecvMsg at a time;
// pushed is written there.
type meteredStream struct {
	grpc.ServerStream
	l      *Limiter
	key    string
	cost   int64
	pushed bool // a pushback trailer was set: a second value would stop grpc-go retrying
}

// RecvMsg receives a message into m and spends its cost. A message the
// bucket cannot pay for is dropped and the refusal returned; an error of
// the underlying stream (io.EOF at the end) is returned as it is, and
// charges nothing.
func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	pushback, err := s.l.spend(s.Context(), s.key, s.cost)
	if err != nil && pushback > 0 && !s.pushed {
		s.pushed = true
		s.SetTrailer(pushbackMD(pushback))
	}
	return err
}
