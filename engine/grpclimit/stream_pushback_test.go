package grpclimit_test

import (
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// stubbornService's FullDuplexCall keeps receiving after a refused message,
// as a handler may (it drops the message and reads on), and returns the
// second refusal.
type stubbornService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (stubbornService) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	refusals := 0
	for {
		_, err := s.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case status.Code(err) == codes.ResourceExhausted:
			if refusals++; refusals == 2 {
				return err
			}
			continue
		case err != nil:
			return err
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

// TestPerMessageOnePushback: with WithPerMessage the RateLimit fields go
// "as decided for its first refused message, in the trailer"; and a
// second pushback value would stop grpc-go retrying (gRFC A6 ignores a
// pushback trailer with more than one value). A stream refused twice has
// one of each in its trailer.
func TestPerMessageOnePushback(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	l := newLimiter(t, e, grpclimit.WithPerMessage(), grpclimit.WithHeaders())
	conn := serveWith(t, []grpc.ServerOption{grpc.StreamInterceptor(l.Stream)}, stubbornService{})

	s, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(t.Context())
	require.NoError(t, err)
	require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{}))
	_, err = s.Recv() // admitted: the bucket's one token
	require.NoError(t, err)
	for range 2 { // both refused: the clock does not move
		if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	_, err = s.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	tr := s.Trailer()
	require.Equal(t, []string{"1000"}, tr.Get(grpclimit.PushbackTrailer), "one pushback value")
	require.Len(t, tr.Get(grpclimit.RateLimitHeader), 1, "the RateLimit field of the first refusal only")
	require.Len(t, tr.Get(grpclimit.PolicyHeader), 1, "the RateLimit-Policy field of the first refusal only")
}
