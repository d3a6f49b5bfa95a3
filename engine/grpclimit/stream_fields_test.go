package grpclimit_test

import (
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// readAll receives every message of ss, and returns the first error but
// io.EOF.
func readAll(ss grpc.ServerStream) error {
	for {
		if err := ss.RecvMsg(new(testgrpc.StreamingOutputCallRequest)); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// runStream opens a FullDuplexCall on a server whose stream interceptors
// are chain, with handle in place of the service, sends messages messages,
// closes its side and reads to the end; it returns the stream's code, its
// header and its trailer.
func runStream(t *testing.T, chain []grpc.StreamServerInterceptor, messages int, handle func(grpc.ServerStream) error) (codes.Code, metadata.MD, metadata.MD) {
	t.Helper()
	handler := func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
		return handle(ss)
	}
	conn := serveWith(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(append(chain, handler)...)}, testService{})
	s := duplex(t, conn)
	for range messages {
		if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	require.NoError(t, s.CloseSend())
	var err error
	for err == nil {
		_, err = s.Recv()
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	header, _ := s.Header()
	return status.Code(err), header, s.Trailer()
}

// TestPerMessageErrorCarriesNoFields: a metered stream whose second
// message meets an engine error (the engine closed under it) before the
// handler sent anything is answered Unavailable with no RateLimit fields
// at all, as a degraded refusal is: "an error has none", and a stream
// refused before it sent a header has only the refusal's. The first
// message's admitted fields must not appear in the trailer.
func TestPerMessageErrorCarriesNoFields(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	l := newLimiter(t, e, grpclimit.WithHeaders(), grpclimit.WithPerMessage())
	recv := func(ss grpc.ServerStream) error { return ss.RecvMsg(new(testgrpc.StreamingOutputCallRequest)) }
	code, header, trailer := runStream(t, []grpc.StreamServerInterceptor{l.Stream}, 2, func(ss grpc.ServerStream) error {
		if err := recv(ss); err != nil {
			return err
		}
		_ = e.Close()
		return recv(ss)
	})
	require.Equal(t, codes.Unavailable, code)
	require.Empty(t, rateLimit(header))
	require.Empty(t, rateLimit(trailer), "an error carries no fields")
}

// TestPerMessageOuterRefusalCarriesOnlyItsFields: a metered Limiter that
// refuses a message, before the handler sent anything, answers with its
// own refusal's fields only, also when a Limiter chained inside it holds
// fields of its own (a shadow candidate, metered or not, or a second
// metered limit): the refusal stays trailers-only and carries neither the
// refusing Limiter's admitted fields nor the inner one's, as httplimit's
// refusal carries the refusing limit's alone.
func TestPerMessageOuterRefusalCarriesOnlyItsFields(t *testing.T) {
	for _, c := range []struct {
		name  string
		inner []grpclimit.Option
	}{
		{"inner metered shadow", []grpclimit.Option{grpclimit.WithPerMessage(), grpclimit.WithShadow()}},
		{"inner metered", []grpclimit.Option{grpclimit.WithPerMessage()}},
		{"inner shadow", []grpclimit.Option{grpclimit.WithShadow()}},
		{"inner", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			outerEngine, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
			innerEngine, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
			outer := newLimiter(t, outerEngine, grpclimit.WithHeaders(), grpclimit.WithPerMessage(), grpclimit.WithPolicyName("api"))
			inner := newLimiter(t, innerEngine, append(c.inner, grpclimit.WithHeaders(), grpclimit.WithPolicyName("candidate"))...)
			code, header, trailer := runStream(t, []grpc.StreamServerInterceptor{outer.Stream, inner.Stream}, 3, readAll)
			require.Equal(t, codes.ResourceExhausted, code)
			require.Empty(t, rateLimit(header), "trailers-only")
			require.Equal(t, []string{`"api";q=1;w=1`, `"api";r=0;t=1`}, rateLimit(trailer), "the refusal's fields alone")
			require.Equal(t, []string{"1000"}, pushback(trailer))
		})
	}
}

// TestPerMessageKeepsTheTransportStream: a metered stream's handler still
// reaches grpc's own transport stream through its context, which
// grpc.ClientSupportedCompressors and grpc.SetSendCompressor require (they
// fail on any wrapper): the reason a header sent with grpc.SendHeader(ctx)
// is not seen by the Limiter.
func TestPerMessageKeepsTheTransportStream(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	l := newLimiter(t, e, grpclimit.WithHeaders(), grpclimit.WithPerMessage())
	code, _, _ := runStream(t, []grpc.StreamServerInterceptor{l.Stream}, 1, func(ss grpc.ServerStream) error {
		if _, err := grpc.ClientSupportedCompressors(ss.Context()); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		return errors.Join(grpc.SetSendCompressor(ss.Context(), "identity"), readAll(ss))
	})
	require.Equal(t, codes.OK, code)
}
