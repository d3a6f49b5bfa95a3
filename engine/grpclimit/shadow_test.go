package grpclimit_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// TestServerShadow: over a real connection, WithShadow refuses nothing
// while every call spends as usual: of 7 calls on a bucket of 2, all are
// answered OK, exactly 5 are counted as Refused, the engine's bucket is
// empty, and the header metadata of a would-be refusal says so. A stream
// metered per message echoes all its messages and counts the ones it
// could not pay for.
func TestServerShadow(t *testing.T) {
	ctx := t.Context()
	var log errorLog
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	l := newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithHeaders(), grpclimit.WithOnError(log.record))
	conn := serve(t, l, nil)
	hc := healthpb.NewHealthClient(conn)
	for i := range 7 {
		var header, trailer metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		require.NoError(t, err, "call %d", i)
		require.Empty(t, pushback(trailer))
		want := `"default";r=1;t=1`
		if i >= 1 {
			want = `"default";r=0;t=` + map[bool]string{true: "2", false: "1"}[i == 1]
		}
		require.Equal(t, []string{`"default";q=2;w=2`, want}, rateLimit(header), "call %d", i)
	}
	require.Equal(t, grpclimit.ShadowStats{Refused: 5}, l.ShadowStats())
	require.Empty(t, log.take(), "a limit is not an error")
	d, err := e.Peek(ctx, "127.0.0.1")
	require.NoError(t, err)
	require.Zero(t, d.Remaining)

	// per message: the header has the fields as the first message left the
	// bucket, and nothing is refused, so there is no refusal's trailer
	e, _ = newEngine(t, engine.Config{Policy: pol(2, 1)})
	l = newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithPerMessage(), grpclimit.WithHeaders())
	conn = serve(t, l, nil)
	s := duplex(t, conn)
	require.NoError(t, echo(s, 5))
	require.NoError(t, finish(s))
	require.Equal(t, grpclimit.ShadowStats{Refused: 3}, l.ShadowStats())
	header, err := s.Header()
	require.NoError(t, err)
	require.Equal(t, []string{`"default";q=2;w=2`, `"default";r=1;t=1`}, rateLimit(header))
	require.Empty(t, rateLimit(s.Trailer()))
}

// TestServerShadowErrors: under WithShadow a degraded denial and an engine
// error are let through, counted as Degraded and Errors, and given to the
// function of WithOnError; a degraded admission is neither.
func TestServerShadowErrors(t *testing.T) {
	ctx := t.Context()
	var log errorLog
	l := newLimiter(t, degradedAdmitter{d: engine.Decision{Degraded: true, RetryAfter: time.Second, Version: 1, Limit: 5}},
		grpclimit.WithShadow(), grpclimit.WithHeaders(), grpclimit.WithOnError(log.record))
	conn := serve(t, l, nil)
	var header, trailer metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	require.NoError(t, err)
	require.Empty(t, rateLimit(header), "a degraded answer carries no fields")
	require.Empty(t, pushback(trailer))
	require.Equal(t, grpclimit.ShadowStats{Degraded: 1}, l.ShadowStats())
	errs := log.take()
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], grpclimit.ErrDegraded)

	l = newLimiter(t, degradedAdmitter{d: engine.Decision{Degraded: true, Allowed: true, Version: 1, Limit: 5}},
		grpclimit.WithShadow(), grpclimit.WithOnError(log.record))
	conn = serve(t, l, nil)
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, grpclimit.ShadowStats{}, l.ShadowStats())
	require.Empty(t, log.take())

	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	require.NoError(t, e.Close())
	l = newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithOnError(log.record))
	conn = serve(t, l, nil)
	for range 2 {
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	require.Equal(t, grpclimit.ShadowStats{Errors: 2}, l.ShadowStats())
	errs = log.take()
	require.Len(t, errs, 2)
	require.ErrorIs(t, errs[0], engine.ErrClosed)
}

// TestServerShadowConcurrent: 80 concurrent calls on a bucket of 10 are
// all answered OK, and exactly the 70 the bucket could not pay for are
// counted as Refused.
func TestServerShadowConcurrent(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	l := newLimiter(t, e, grpclimit.WithShadow())
	hc := healthpb.NewHealthClient(serve(t, l, nil))
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for range 8 {
		wg.Go(func() {
			for range 10 {
				_, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, grpclimit.ShadowStats{Refused: 70}, l.ShadowStats())
}

// TestShadowContextEnded: under WithShadow a call whose context ended
// before the engine decided is still answered Canceled, as the client is
// gone, counted nowhere, and given to WithOnError.
func TestShadowContextEnded(t *testing.T) {
	var log errorLog
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	l := newLimiter(t, e, grpclimit.WithShadow(), grpclimit.WithOnError(log.record))
	ctx, cancel := context.WithCancel(peer.NewContext(t.Context(), &peer.Peer{
		Addr: net.TCPAddrFromAddrPort(mustAddrPort("203.0.113.7:41000")),
	}))
	cancel()
	ran := false
	_, err := l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"},
		func(context.Context, any) (any, error) { ran = true; return nil, nil })
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	require.False(t, ran)
	require.Equal(t, grpclimit.ShadowStats{}, l.ShadowStats())
	errs := log.take()
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], context.Canceled)
}

// TestServerShadowInsideEnforcing: a shadow Limiter chained inside an
// enforcing one, each with WithHeaders, adds its fields after the
// enforcing one's, so the first value of each key is the enforced limit's,
// as httplimit's enforced items come first: for a unary call, for a
// stream, and for a stream the enforcing Limiter also settles. A call the
// enforcing Limiter refuses never reaches the shadow.
func TestServerShadowInsideEnforcing(t *testing.T) {
	ctx := t.Context()
	for _, settles := range []bool{false, true} {
		enforced, _ := newEngine(t, engine.Config{Policy: pol(4, 1)})
		candidate, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
		opts := []grpclimit.Option{grpclimit.WithHeaders(), grpclimit.WithPolicyName("api")}
		if settles {
			opts = append(opts, grpclimit.WithCost(func(context.Context, string) int64 { return 1 }))
		}
		enf := newLimiter(t, enforced, opts...)
		sh := newLimiter(t, candidate, grpclimit.WithHeaders(), grpclimit.WithPolicyName("candidate"), grpclimit.WithShadow())
		conn := serveWith(t, []grpc.ServerOption{
			grpc.ChainUnaryInterceptor(enf.Unary, sh.Unary),
			grpc.ChainStreamInterceptor(enf.Stream, sh.Stream),
		}, testService{})

		var header metadata.MD
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		require.NoError(t, err)
		require.Equal(t, []string{`"api";q=4;w=4`, `"candidate";q=2;w=2`}, header.Get(grpclimit.PolicyHeader), "settles %v", settles)
		require.Equal(t, []string{`"api";r=3;t=1`, `"candidate";r=1;t=1`}, header.Get(grpclimit.RateLimitHeader), "settles %v", settles)

		s := duplex(t, conn)
		require.NoError(t, echo(s, 1))
		require.NoError(t, finish(s))
		header, err = s.Header()
		require.NoError(t, err)
		require.Equal(t, []string{`"api";q=4;w=4`, `"candidate";q=2;w=2`}, header.Get(grpclimit.PolicyHeader), "settles %v", settles)
		require.Equal(t, []string{`"api";r=2;t=2`, `"candidate";r=0;t=2`}, header.Get(grpclimit.RateLimitHeader), "settles %v", settles)
		require.Equal(t, grpclimit.ShadowStats{}, sh.ShadowStats())
	}
}
