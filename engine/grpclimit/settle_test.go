package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// settleName names an error of Settle for a trailer.
func settleName(err error) string {
	for _, e := range []struct {
		err  error
		name string
	}{
		{grpclimit.ErrNotSettleable, "not-settleable"},
		{grpclimit.ErrNegativeActual, "negative"},
		{grpclimit.ErrNotTaken, "not-taken"},
		{grpclimit.ErrSettled, "settled"},
		{grpclimit.ErrDegraded, "degraded"},
	} {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "ok"
}

// settleAll settles ctx's call once for each "actual" value of its
// metadata, in order, and sets the outcomes as "settled" trailer values.
func settleAll(ctx context.Context) []string {
	var out []string
	for _, v := range metadata.ValueFromIncomingContext(ctx, "actual") {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			panic(err)
		}
		out = append(out, settleName(grpclimit.Settle(ctx, n)))
	}
	return out
}

// settleService settles each call after its work: EmptyCall when it
// answers, FullDuplexCall once the client has closed its side.
type settleService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (settleService) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pairs("settled", settleAll(ctx))...))
	return &testgrpc.Empty{}, nil
}

func (settleService) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				return err
			}
			s.SetTrailer(metadata.Pairs(pairs("settled", settleAll(s.Context()))...))
			return nil
		}
	}
}

func pairs(key string, values []string) []string {
	var kv []string
	for _, v := range values {
		kv = append(kv, key, v)
	}
	return kv
}

// serveSettle runs settleService on loopback behind l and returns a client.
func serveSettle(t *testing.T, l *grpclimit.Limiter) testgrpc.TestServiceClient {
	t.Helper()
	conn := serveWith(t, []grpc.ServerOption{grpc.UnaryInterceptor(l.Unary), grpc.StreamInterceptor(l.Stream)}, settleService{})
	return testgrpc.NewTestServiceClient(conn)
}

// metered is a Limiter keyed by the "user" metadata and costed by "cost".
func metered(t *testing.T, e engine.Admitter, opts ...grpclimit.Option) *grpclimit.Limiter {
	t.Helper()
	return newLimiter(t, e, append([]grpclimit.Option{
		grpclimit.WithKey(func(ctx context.Context, _, _ string) (string, error) {
			return metadata.ValueFromIncomingContext(ctx, "user")[0], nil
		}),
		grpclimit.WithCost(func(ctx context.Context, _ string) int64 {
			n, _ := strconv.ParseInt(metadata.ValueFromIncomingContext(ctx, "cost")[0], 10, 64)
			return n
		}),
	}, opts...)...)
}

// settleCall makes one EmptyCall with the metadata kv and returns its error and
// the "settled" values of its trailer.
func settleCall(t *testing.T, c testgrpc.TestServiceClient, kv ...string) ([]string, error) {
	t.Helper()
	var md metadata.MD
	_, err := c.EmptyCall(metadata.AppendToOutgoingContext(t.Context(), kv...), &testgrpc.Empty{}, grpc.Trailer(&md))
	return md.Get("settled"), err
}

func balance(t *testing.T, e *engine.Engine, key string) int64 {
	t.Helper()
	d, err := e.Peek(t.Context(), key)
	require.NoError(t, err)
	return d.Remaining
}

// Over a real connection, a unary call's under-estimate is charged into
// debt: 10 tokens at 1 a second, 4 taken and 16 settled leave -6, and the
// next call is refused for 7 s exactly, then admitted with nothing left.
// An over-estimate is given back; a second Settle is ErrSettled.
func TestSettleUnary(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(10, 1)})
	c := serveSettle(t, metered(t, e))

	settled, err := settleCall(t, c, "user", "u", "cost", "4", "actual", "16", "actual", "16")
	require.NoError(t, err)
	assert.Equal(t, []string{"ok", "settled"}, settled)
	assert.Equal(t, int64(-6), balance(t, e, "u"))

	_, err = settleCall(t, c, "user", "u", "cost", "1")
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	delay, ok := retryDelay(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(7000), delay)

	clk.Set(int64(7 * time.Second))
	_, err = settleCall(t, c, "user", "u", "cost", "1")
	require.NoError(t, err)
	assert.Equal(t, int64(0), balance(t, e, "u"))

	settled, err = settleCall(t, c, "user", "v", "cost", "8", "actual", "-1", "actual", "3")
	require.NoError(t, err)
	assert.Equal(t, []string{"negative", "ok"}, settled)
	assert.Equal(t, int64(7), balance(t, e, "v"))
}

// A stream is settled once, for the whole call, after its messages.
func TestSettleStream(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(100, 1)})
	c := serveSettle(t, metered(t, e))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "user", "u", "cost", "10", "actual", "35", "actual", "1")
	s, err := c.FullDuplexCall(ctx)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{}))
	}
	require.NoError(t, s.CloseSend())
	_, err = s.Recv()
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []string{"ok", "settled"}, s.Trailer().Get("settled"))
	assert.Equal(t, int64(65), balance(t, e, "u"), "100 - 10 - 25")
}

// Without an estimate there is nothing to settle: a context built by hand,
// an exempt method, a Limiter of the default cost, a stream spent per
// message. Under WithShadow a call the limit would refuse took nothing and
// is ErrNotTaken; one it admitted is settled.
func TestSettleNotSettleable(t *testing.T) {
	require.ErrorIs(t, grpclimit.Settle(t.Context(), 3), grpclimit.ErrNotSettleable)
	var nilCtx context.Context // a variable, not a literal nil: the misuse tested, which vet would flag
	require.ErrorIs(t, grpclimit.Settle(nilCtx, 3), grpclimit.ErrNotSettleable)

	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	exempt := serveSettle(t, metered(t, e, grpclimit.WithExempt("/grpc.testing.TestService/EmptyCall")))
	settled, err := settleCall(t, exempt, "user", "a", "cost", "2", "actual", "5")
	require.NoError(t, err)
	assert.Equal(t, []string{"not-settleable"}, settled)

	plain := serveSettle(t, newLimiter(t, e, grpclimit.WithKey(func(context.Context, string, string) (string, error) { return "b", nil })))
	settled, err = settleCall(t, plain, "actual", "5")
	require.NoError(t, err)
	assert.Equal(t, []string{"not-settleable"}, settled)
	assert.Equal(t, int64(9), balance(t, e, "b"))

	perMessage := serveSettle(t, metered(t, e, grpclimit.WithPerMessage()))
	s, err := perMessage.FullDuplexCall(metadata.AppendToOutgoingContext(t.Context(), "user", "c", "cost", "1", "actual", "5"))
	require.NoError(t, err)
	require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{}))
	require.NoError(t, s.CloseSend())
	_, err = s.Recv()
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, []string{"not-settleable"}, s.Trailer().Get("settled"))
	assert.Equal(t, int64(9), balance(t, e, "c"))
	settled, err = settleCall(t, perMessage, "user", "c", "cost", "2", "actual", "5")
	require.NoError(t, err)
	assert.Equal(t, []string{"ok"}, settled, "WithPerMessage meters streams: a unary call has its one estimate")
	assert.Equal(t, int64(9-5), balance(t, e, "c"))

	shadow := serveSettle(t, metered(t, e, grpclimit.WithShadow()))
	settled, err = settleCall(t, shadow, "user", "d", "cost", "4", "actual", "12")
	require.NoError(t, err)
	assert.Equal(t, []string{"ok"}, settled)
	assert.Equal(t, int64(-2), balance(t, e, "d"))
	settled, err = settleCall(t, shadow, "user", "d", "cost", "1", "actual", "9")
	require.NoError(t, err, "shadow: let through")
	assert.Equal(t, []string{"not-taken"}, settled)
	assert.Equal(t, int64(-2), balance(t, e, "d"))
}

// A call a store's failure rule admitted consulted no bucket: ErrNotTaken,
// and the admitter (whose Charge would panic here) is never called.
func TestSettleDegraded(t *testing.T) {
	a := degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 5}}
	c := serveSettle(t, metered(t, a))
	settled, err := settleCall(t, c, "user", "u", "cost", "2", "actual", "7")
	require.NoError(t, err)
	assert.Equal(t, []string{"not-taken"}, settled)
}

// Settle still settles once the call's context has ended (the client hung
// up, or its deadline passed): the work was done, so it is paid for, with
// the context's values but not its cancellation. 10 tokens, 1 taken,
// settled at 9: 1 left.
func TestSettleAfterCancel(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	l := newLimiter(t, e, grpclimit.WithCost(func(context.Context, string) int64 { return 1 }))
	ctx, cancel := context.WithCancel(from("192.0.2.1:1"))
	defer cancel()
	var settled error
	_, err := l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.testing.TestService/EmptyCall"},
		func(ctx context.Context, _ any) (any, error) {
			cancel()
			<-ctx.Done()
			settled = grpclimit.Settle(ctx, 9)
			return nil, nil
		})
	require.NoError(t, err)
	require.NoError(t, settled)
	assert.Equal(t, int64(1), balance(t, e, "192.0.2.1"))
}

// Behind an enforcing Limiter and a shadow one chained inside it, a call
// the shadow would have refused took nothing there, but the enforcing one
// took its estimate: Settle settles that one and is not ErrNotTaken, which
// says nothing was charged; a second Settle is ErrSettled. With neither
// taking a cost, it is ErrNotTaken.
func TestSettleNestedShadowWouldRefuse(t *testing.T) {
	enforced, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	shadowed, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	_, err := shadowed.Allow(t.Context(), "u", 8)
	require.NoError(t, err)
	outer, inner := metered(t, enforced), metered(t, shadowed, grpclimit.WithShadow())
	conn := serveWith(t, []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(outer.Unary, inner.Unary),
		grpc.ChainStreamInterceptor(outer.Stream, inner.Stream),
	}, settleService{})
	c := testgrpc.NewTestServiceClient(conn)
	settled, err := settleCall(t, c, "user", "u", "cost", "4", "actual", "6", "actual", "6")
	require.NoError(t, err)
	assert.Equal(t, []string{"ok", "settled"}, settled)
	assert.Equal(t, int64(10-6), balance(t, enforced, "u"))
	assert.Equal(t, int64(2), balance(t, shadowed, "u"), "the shadow took nothing and settles nothing")

	degraded := degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 5}}
	outer, inner = metered(t, degraded), metered(t, shadowed, grpclimit.WithShadow())
	conn = serveWith(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(outer.Unary, inner.Unary)}, settleService{})
	settled, err = settleCall(t, testgrpc.NewTestServiceClient(conn), "user", "u", "cost", "4", "actual", "6")
	require.NoError(t, err)
	assert.Equal(t, []string{"not-taken"}, settled, "neither took a cost")
}

// chargeLost is an engine whose Charge the store's failure rule answers, as
// a Redis store's does once Redis is gone after the call was admitted:
// allowed, marked Degraded, with a nil error, and nothing known taken.
type chargeLost struct{ *engine.Engine }

func (chargeLost) Charge(context.Context, string, int64) (engine.Decision, error) {
	return engine.Decision{Allowed: true, Degraded: true, Version: 1, Limit: 10}, nil
}

// A call a bucket admitted, whose Settle's charge the store's failure rule
// answers (Redis gone meanwhile), is not settled as far as anyone knows:
// Settle says so with ErrDegraded, as it says a Refund that Redis did not
// answer, rather than nil; it is still settled once.
func TestSettleChargeDegraded(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	c := serveSettle(t, metered(t, chargeLost{e}))
	settled, err := settleCall(t, c, "user", "u", "cost", "2", "actual", "7", "actual", "7")
	require.NoError(t, err)
	assert.Equal(t, []string{"degraded", "settled"}, settled)
	assert.Equal(t, int64(8), balance(t, e, "u"), "the estimate, taken by the bucket")
}
