package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/engine/httplimit"
	"github.com/tokenshard/tokenshard/policy"
)

// rateLimit returns the ratelimit-policy and ratelimit values of md.
func rateLimit(md metadata.MD) []string {
	return append(md.Get(grpclimit.PolicyHeader), md.Get(grpclimit.RateLimitHeader)...)
}

// TestServerHeaders: over a real connection with WithHeaders, an admitted
// call has the RateLimit fields in its header metadata; a denied one in
// its trailer, beside the pushback, and no header, so it stays
// trailers-only; a stream's header carries them when it starts; a degraded
// answer, admitted or denied, carries none; and without WithHeaders there
// are none.
func TestServerHeaders(t *testing.T) {
	e, clk := newEngine(t, engine.Config{Policy: pol(2, 1)})
	conn := serve(t, newLimiter(t, e, grpclimit.WithHeaders()), nil)
	hc := healthpb.NewHealthClient(conn)
	ctx := t.Context()

	var header, trailer metadata.MD
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.NoError(t, err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=1;t=1`}, rateLimit(header))
	require.Empty(t, rateLimit(trailer))

	clk.Advance(300 * time.Millisecond)
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.NoError(t, err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=0;t=2`}, rateLimit(header), "1.7s to full")

	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Empty(t, header, "a refusal sends no header: it stays trailers-only")
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=0;t=1`}, rateLimit(trailer), "0.7s to the next token")
	require.Equal(t, []string{"700"}, pushback(trailer))

	clk.Advance(2 * time.Second)
	s := duplex(t, conn)
	require.NoError(t, echo(s, 1)) // the header goes with the first message
	header, err = s.Header()
	require.NoError(t, err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=1;t=1`}, rateLimit(header), "a stream, when it starts")
	require.NoError(t, finish(s))

	for _, d := range []engine.Decision{
		{Degraded: true, Allowed: true, Remaining: 4, Version: 1, Limit: 5},
		{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 5},
	} {
		conn := serve(t, newLimiter(t, degradedAdmitter{d: d}, grpclimit.WithHeaders()), nil)
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		require.Equal(t, d.Allowed, err == nil, "%v", err)
		require.Empty(t, rateLimit(header), "degraded %+v", d)
		require.Empty(t, rateLimit(trailer), "degraded %+v", d)
	}

	e, _ = newEngine(t, engine.Config{Policy: pol(1, 1)})
	conn = serve(t, newLimiter(t, e), nil)
	hc = healthpb.NewHealthClient(conn)
	for range 2 {
		_, _ = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		require.Empty(t, rateLimit(header), "without WithHeaders")
		require.Empty(t, rateLimit(trailer), "without WithHeaders")
	}
}

// TestHeadersMatchHTTP: for the same decisions, under policies with
// overrides (named, unnamed, named like another quota), bands and rates
// that are not per second, the gRPC metadata has exactly the values of
// httplimit's RateLimit-Policy and RateLimit header fields. Two engines on
// one policy take the same calls, one through each adapter.
func TestHeadersMatchHTTP(t *testing.T) {
	bands, err := policy.NewBands(policy.Band{Name: "minute", Capacity: 4, Refill: policy.PerMinute(4)})
	require.NoError(t, err)
	goldBands, err := policy.NewBands(policy.Band{Name: "gold-hour", Capacity: 50, Refill: policy.PerHour(50)})
	require.NoError(t, err)
	clash, err := policy.NewBands(policy.Band{Name: "shop-9-3", Capacity: 9, Refill: policy.PerSecond(9)})
	require.NoError(t, err)
	overrides, err := policy.NewOverrideSet(
		policy.Override{Match: "gold", Capacity: 6, TokensPerSecond: 2, Bands: goldBands, Name: "gold"},
		policy.Override{Match: "plain", Capacity: 7, TokensPerSecond: 2},
		policy.Override{Match: "same", Capacity: 3, TokensPerSecond: 1},
		policy.Override{Match: "liar", Capacity: 5, TokensPerSecond: 1, Name: "shop"},
		policy.Override{Match: "minute", Capacity: 10, Refill: policy.PerMinute(100)},
		policy.Override{Match: "clash", Capacity: 9, TokensPerSecond: 3, Bands: clash},
	)
	require.NoError(t, err)
	p := policy.Policy{Version: 1, Capacity: 3, TokensPerSecond: 1, Bands: bands, Overrides: overrides}

	eh, clkH := newEngine(t, engine.Config{Policy: p})
	eg, clkG := newEngine(t, engine.Config{Policy: p})
	mw, err := httplimit.New(eh, httplimit.WithPolicyName("shop"), httplimit.WithKey(func(r *http.Request) (string, error) {
		return r.Header.Get("K"), nil
	}))
	require.NoError(t, err)
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	l := newLimiter(t, eg, grpclimit.WithHeaders(), grpclimit.WithPolicyName("shop"),
		grpclimit.WithKey(func(ctx context.Context, _, _ string) (string, error) {
			return metadata.ValueFromIncomingContext(ctx, "k")[0], nil
		}))
	conn := serve(t, l, nil)
	hc := healthpb.NewHealthClient(conn)

	for _, key := range []string{"anyone", "gold", "plain", "same", "liar", "minute", "clash"} {
		for i := range 6 {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("K", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			want := []string{w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit")}

			var header, trailer metadata.MD
			ctx := metadata.AppendToOutgoingContext(t.Context(), "k", key)
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
			got := rateLimit(header)
			if err != nil {
				require.Equal(t, http.StatusTooManyRequests, w.Code, "%s #%d: %v", key, i, err)
				got = rateLimit(trailer)
			}
			require.Equal(t, want, got, "%s #%d", key, i)
			clkH.Advance(150 * time.Millisecond)
			clkG.Advance(150 * time.Millisecond)
		}
	}
}

// TestPolicyNameInvalid: WithPolicyName refuses what cannot be a
// structured-field String.
func TestPolicyNameInvalid(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	for _, name := range []string{"", "caf\u00e9", "a\nb"} {
		_, err := grpclimit.New(e, grpclimit.WithPolicyName(name))
		require.ErrorIs(t, err, grpclimit.ErrInvalidOption, "%q", name)
	}
}

// TestServerHeadersPerMessage: with WithPerMessage the RateLimit fields go
// in the header as the first message was decided (the header goes once,
// with the handler's first reply), and with the refusal of a message, in
// the trailer beside the pushback, once.
func TestServerHeadersPerMessage(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	conn := serve(t, newLimiter(t, e, grpclimit.WithPerMessage(), grpclimit.WithHeaders()), nil)
	s := duplex(t, conn)
	require.NoError(t, echo(s, 2))
	header, err := s.Header()
	require.NoError(t, err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=1;t=1`}, rateLimit(header), "as the first message left the bucket")
	err = echo(s, 1)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=0;t=1`}, rateLimit(s.Trailer()))
	require.Equal(t, []string{"1000"}, pushback(s.Trailer()))
}

// TestPerMessageHeaderWaitsForTheHandler: with WithPerMessage the fields
// of the first message let through go in the header once, when the
// handler first sends: a client stream the handler answers after reading
// it all has one value of each, as the first message left the bucket,
// also in shadow mode, where every message is let through.
func TestPerMessageHeaderWaitsForTheHandler(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
		opts := []grpclimit.Option{grpclimit.WithPerMessage(), grpclimit.WithHeaders()}
		n := 3
		if shadow {
			opts, n = append(opts, grpclimit.WithShadow()), 8 // 3 would-be refusals
		}
		conn := serve(t, newLimiter(t, e, opts...), nil)
		cs, err := testgrpc.NewTestServiceClient(conn).StreamingInputCall(t.Context())
		require.NoError(t, err)
		for range n {
			require.NoError(t, cs.Send(&testgrpc.StreamingInputCallRequest{}))
		}
		_, err = cs.CloseAndRecv()
		require.NoError(t, err)
		header, err := cs.Header()
		require.NoError(t, err)
		require.Equal(t, []string{`"default";q=5;w=5`, `"default";r=4;t=1`}, rateLimit(header), "shadow %v", shadow)
		require.Empty(t, rateLimit(cs.Trailer()), "shadow %v", shadow)
	}
}

// TestPerMessageRefusalBeforeReplyIsRetried: a stream admitted for its
// first message and refused for its second, before the handler has sent
// anything, ends trailers-only, so grpc-go's retry policy retries it (each
// retry is refused at once: the clock stands still); had the first
// message's fields been set in the header at once, the header would have
// gone before the refusal, and the client would not retry.
func TestPerMessageRefusalBeforeReplyIsRetried(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1000)}) // a pushback of 1 ms
	l := newLimiter(t, e, grpclimit.WithPerMessage(), grpclimit.WithHeaders())
	var attempts atomic.Int32
	count := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		attempts.Add(1)
		return h(srv, ss)
	}
	conn := serveWith(t, []grpc.ServerOption{grpc.ChainStreamInterceptor(count, l.Stream)}, testService{},
		retrying("grpc.testing.TestService", 3, "RESOURCE_EXHAUSTED"))

	cs, err := testgrpc.NewTestServiceClient(conn).StreamingInputCall(t.Context())
	require.NoError(t, err)
	for range 2 {
		if err := cs.Send(&testgrpc.StreamingInputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	_, err = cs.CloseAndRecv()
	require.Equal(t, int32(3), attempts.Load(), "the refusal was retried: %v", err)
	// Where the last refusal reaches the client inside a Send, grpc-go
	// (v1.85) ends the stream with its "max retries exhausted" error around
	// the Send's io.EOF, not with the status (SendMsg tells io.EOF from a
	// failure with !=): the status is the client's to lose, not ours to send.
	if !strings.Contains(fmt.Sprint(err), "max retries exhausted: failed after 3 attempts: EOF") {
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	}
}

// TestHeadersKeepFailuresRetryable: with WithHeaders, a call the limiter
// admits and its handler fails (UNAVAILABLE, before any reply) stays
// trailers-only, with the RateLimit fields in its trailer, so a client's
// retry policy retries it, unary or stream. Set before the handler ran,
// the header went out with the failure, and grpc-go did not retry.
func TestHeadersKeepFailuresRetryable(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(100, 1)})
	l := newLimiter(t, e, grpclimit.WithHeaders())
	var unary, streams atomic.Int32
	failUnary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		unary.Add(1)
		return nil, status.Error(codes.Unavailable, "the handler failed")
	}
	failStream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		streams.Add(1)
		return status.Error(codes.Unavailable, "the handler failed")
	}
	conn := serveWith(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(l.Unary, failUnary), grpc.ChainStreamInterceptor(l.Stream, failStream)},
		testService{}, retrying("grpc.testing.TestService", 3, "UNAVAILABLE"))
	client := testgrpc.NewTestServiceClient(conn)

	var header, trailer metadata.MD
	_, err := client.EmptyCall(t.Context(), &testgrpc.Empty{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Equal(t, int32(3), unary.Load(), "the failure was retried")
	require.Empty(t, rateLimit(header))
	require.Equal(t, []string{`"default";q=100;w=100`, `"default";r=97;t=3`}, rateLimit(trailer), "the last attempt's fields")

	s := duplex(t, conn)
	_, err = s.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Equal(t, int32(3), streams.Load(), "the failure was retried")
	require.Equal(t, []string{`"default";q=100;w=100`, `"default";r=94;t=6`}, rateLimit(s.Trailer()))
}

// TestHeaderFieldsWhateverTheHandlerDoes: the RateLimit fields of an
// admitted call reach the client once, whatever its handler does with the
// header: sent through grpc.SendHeader, which the limiter's stream does
// not see, or before the first message was decided, they go in the
// trailer; a metered stream whose handler fails or ends without sending
// has them too; and a stream refused before it sent has only the
// refusal's.
func TestHeaderFieldsWhateverTheHandlerDoes(t *testing.T) {
	sendHeader := func(ctx context.Context) error { return grpc.SendHeader(ctx, metadata.Pairs("x", "1")) }
	recv := func(ss grpc.ServerStream) error { return ss.RecvMsg(new(testgrpc.StreamingOutputCallRequest)) }
	send := func(ss grpc.ServerStream) error { return ss.SendMsg(&testgrpc.StreamingOutputCallResponse{}) }
	unavailable := status.Error(codes.Unavailable, "the handler failed")
	for _, c := range []struct {
		name            string
		perMessage      bool
		capacity        int64
		messages        int
		unary           grpc.UnaryHandler // nil: a stream
		stream          func(grpc.ServerStream) error
		code            codes.Code
		header, trailer []string
	}{{
		name: "unary sends its header", capacity: 5,
		unary:   func(ctx context.Context, _ any) (any, error) { return &testgrpc.Empty{}, sendHeader(ctx) },
		trailer: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		name: "stream sends its header", capacity: 5,
		stream:  func(ss grpc.ServerStream) error { return sendHeader(ss.Context()) },
		trailer: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		name: "metered stream sends its header", perMessage: true, capacity: 5, messages: 1,
		stream:  func(ss grpc.ServerStream) error { return errors.Join(recv(ss), sendHeader(ss.Context())) },
		trailer: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		name: "metered stream fails", perMessage: true, capacity: 5, messages: 1,
		stream:  func(ss grpc.ServerStream) error { return errors.Join(recv(ss), unavailable) },
		code:    codes.Unavailable,
		trailer: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		name: "metered stream ends without sending", perMessage: true, capacity: 5, messages: 1,
		stream: recv,
		header: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		name: "metered stream sends first", perMessage: true, capacity: 5, messages: 1,
		stream:  func(ss grpc.ServerStream) error { return errors.Join(send(ss), recv(ss)) },
		trailer: []string{`"default";q=5;w=5`, `"default";r=4;t=1`},
	}, {
		// the admitted message's fields at the end, beside the refusal's
		name: "metered stream sends, then is refused", perMessage: true, capacity: 2, messages: 3,
		stream:  func(ss grpc.ServerStream) error { return errors.Join(send(ss), recv(ss), recv(ss), recv(ss)) },
		code:    codes.ResourceExhausted,
		trailer: []string{`"default";q=2;w=2`, `"default";q=2;w=2`, `"default";r=0;t=1`, `"default";r=1;t=1`},
	}, {
		name: "metered stream refused before it sent", perMessage: true, capacity: 2, messages: 3,
		stream:  func(ss grpc.ServerStream) error { return errors.Join(recv(ss), recv(ss), recv(ss)) },
		code:    codes.ResourceExhausted,
		trailer: []string{`"default";q=2;w=2`, `"default";r=0;t=1`},
	}} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, engine.Config{Policy: pol(c.capacity, 1)})
			opts := []grpclimit.Option{grpclimit.WithHeaders()}
			if c.perMessage {
				opts = append(opts, grpclimit.WithPerMessage())
			}
			l := newLimiter(t, e, opts...)
			handleUnary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
				return c.unary(ctx, req)
			}
			handleStream := func(_ any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
				return c.stream(ss)
			}
			conn := serveWith(t, []grpc.ServerOption{grpc.ChainUnaryInterceptor(l.Unary, handleUnary), grpc.ChainStreamInterceptor(l.Stream, handleStream)},
				testService{})

			var header, trailer metadata.MD
			var err error
			if c.unary != nil {
				_, err = testgrpc.NewTestServiceClient(conn).EmptyCall(t.Context(), &testgrpc.Empty{}, grpc.Header(&header), grpc.Trailer(&trailer))
			} else {
				s := duplex(t, conn)
				for range c.messages {
					if err := s.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil && !errors.Is(err, io.EOF) {
						t.Fatal(err)
					}
				}
				require.NoError(t, s.CloseSend())
				for err == nil {
					_, err = s.Recv()
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
				header, _ = s.Header()
				trailer = s.Trailer()
			}
			require.Equal(t, c.code, status.Code(err), "%v", err)
			require.Equal(t, c.header, nilIfEmpty(rateLimit(header)), "header")
			require.Equal(t, c.trailer, nilIfEmpty(rateLimit(trailer)), "trailer")
		})
	}
}

// nilIfEmpty is s, or nil if it is empty.
func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestDocMetadataExample: the metadata the package doc shows are what a
// call that leaves 42 tokens of 100 refilled at 10 a second is sent, and
// the doc shows them as they are sent.
func TestDocMetadataExample(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(100, 10)})
	l := newLimiter(t, e, grpclimit.WithHeaders(), grpclimit.WithCost(func(context.Context, string) int64 { return 58 }))
	conn := serve(t, l, nil)
	var header metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	require.NoError(t, err)
	policyLine := grpclimit.PolicyHeader + ": " + header.Get(grpclimit.PolicyHeader)[0]
	limitLine := grpclimit.RateLimitHeader + ": " + header.Get(grpclimit.RateLimitHeader)[0]
	require.Equal(t, `ratelimit-policy: "default";q=100;w=10`, policyLine)
	require.Equal(t, `ratelimit: "default";r=42;t=6`, limitLine)
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	require.Contains(t, string(doc), "//\t"+policyLine+"\n//\t"+limitLine+"\n")
}
