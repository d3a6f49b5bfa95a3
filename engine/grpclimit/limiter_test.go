package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

const checkMethod = "/grpc.health.v1.Health/Check"

// from returns a server context whose peer is at addr ("" for none).
func from(addr string) context.Context {
	ctx := context.Background()
	if addr == "" {
		return ctx
	}
	return peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(mustAddrPort(addr))})
}

// call runs l.Unary for method from the peer in ctx with a handler that
// notes it ran, and returns whether it did and the error.
func call(ctx context.Context, l *grpclimit.Limiter, method string) (ran bool, err error) {
	_, err = l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
		ran = true
		return "ok", nil
	})
	return ran, err
}

// stub is an Admitter whose Allow returns fixed answers; the other
// methods are not used by the interceptors.
type stub struct {
	engine.Admitter
	d   engine.Decision
	err error
}

func (s stub) Allow(context.Context, string, int64) (engine.Decision, error) { return s.d, s.err }

// reclaiming is a stub that also estimates when a key slot frees up.
type reclaiming struct {
	stub
	after time.Duration
	ok    bool
}

func (r reclaiming) ReclaimAfter() (time.Duration, bool) { return r.after, r.ok }

// TestStatusMapping holds the status-code table of the package doc, one
// engine answer at a time.
func TestStatusMapping(t *testing.T) {
	capacity := stub{err: fmt.Errorf("%w: 1 keys tracked", engine.ErrKeyCapacity)}
	for _, tc := range []struct {
		name  string
		e     engine.Admitter
		code  codes.Code
		delay int64 // RetryInfo milliseconds; 0: none
	}{
		{"admitted", stub{d: engine.Decision{Allowed: true}}, codes.OK, 0},
		{"denied", stub{d: engine.Decision{RetryAfter: 1500 * time.Millisecond}}, codes.ResourceExhausted, 1500},
		{"denied/rounded up", stub{d: engine.Decision{RetryAfter: 1500*time.Millisecond + 1}}, codes.ResourceExhausted, 1501},
		{"denied/at least 1ms", stub{d: engine.Decision{RetryAfter: 1}}, codes.ResourceExhausted, 1},
		// at most the longest Duration in ms: grpc-go multiplies the
		// pushback by a millisecond, and one more would overflow
		{"denied/saturated", stub{d: engine.Decision{RetryAfter: time.Duration(1<<63 - 1)}}, codes.ResourceExhausted, (1<<63 - 1) / int64(time.Millisecond)},
		{"key capacity/no estimate", capacity, codes.Unavailable, 0},
		{"key capacity/no sweeper", reclaiming{capacity, time.Second, false}, codes.Unavailable, 0},
		{"key capacity/estimate", reclaiming{capacity, 250*time.Millisecond + 1, true}, codes.Unavailable, 251},
		{"key capacity/estimate 0", reclaiming{capacity, 0, true}, codes.Unavailable, 1},
		{"closed", stub{err: engine.ErrClosed}, codes.Unavailable, 0},
		{"invalid key", stub{err: engine.ErrInvalidKey}, codes.Internal, 0},
		{"cost above capacity", stub{err: fmt.Errorf("%w: cost 9 exceeds capacity 2", engine.ErrCostExceedsCapacity)}, codes.InvalidArgument, 0},
		{"canceled", stub{err: context.Canceled}, codes.Canceled, 0},
		{"deadline", stub{err: fmt.Errorf("wait: %w", context.DeadlineExceeded)}, codes.DeadlineExceeded, 0},
		{"clock regression", stub{err: engine.ErrClockRegression}, codes.Internal, 0},
		{"unknown", stub{err: errors.New("redis: connection refused")}, codes.Internal, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran, err := call(from("192.0.2.1:5000"), newLimiter(t, tc.e), checkMethod)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.Equal(t, tc.code == codes.OK, ran, "the handler runs only when admitted")
			if err == nil {
				return
			}
			require.NotContains(t, status.Convert(err).Message(), "redis", "internals leak into the message")
			delay, ok := retryDelay(t, err)
			require.Equal(t, tc.delay != 0, ok, "RetryInfo present")
			require.Equal(t, tc.delay, delay)
		})
	}
}

// TestNoKey: a peer without an IP address, a key function that fails, and
// a cost below 1 are the server's failures, codes.Internal, and the engine
// is not asked.
func TestNoKey(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	unix := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}})
	failing := grpclimit.WithKey(func(context.Context, string, string) (string, error) { return "", errors.New("no tenant") })
	zero := grpclimit.WithCost(func(context.Context, string) int64 { return 0 })
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []grpclimit.Option
		msg  string
	}{
		{"no peer", context.Background(), nil, "rate-limit key"},
		{"peer without an address", peer.NewContext(context.Background(), &peer.Peer{}), nil, "rate-limit key"},
		{"unix socket", unix, nil, "rate-limit key"},
		{"key func fails", from("192.0.2.1:1"), []grpclimit.Option{failing}, "rate-limit key"},
		{"blank key", from("192.0.2.1:1"), []grpclimit.Option{grpclimit.WithKey(func(context.Context, string, string) (string, error) { return "", nil })}, "rate-limit key"},
		{"cost 0", from("192.0.2.1:1"), []grpclimit.Option{zero}, "rate-limit cost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran, err := call(tc.ctx, newLimiter(t, e, tc.opts...), checkMethod)
			require.Equal(t, codes.Internal, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.msg)
			require.False(t, ran)
		})
	}
	require.Zero(t, e.KeyCount(), "nothing was charged")
}

// TestRealEngineRefusals: the refusals the engine itself makes, through
// the interceptor: a cost above capacity, a closed engine, an ended
// context.
func TestRealEngineRefusals(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(2, 1)})
	ctx := from("192.0.2.1:1")
	big := newLimiter(t, e, grpclimit.WithCost(func(context.Context, string) int64 { return 3 }))
	_, err := call(ctx, big, checkMethod)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	_, ok := retryDelay(t, err)
	require.False(t, ok, "no wait admits it, so no delay is offered")

	l := newLimiter(t, e)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = call(canceled, l, checkMethod)
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	expired, cancel := context.WithDeadline(ctx, time.Unix(0, 0))
	defer cancel()
	_, err = call(expired, l, checkMethod)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	require.NoError(t, e.Close())
	_, err = call(ctx, l, checkMethod)
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "shut down")
}

// TestKeys: the default key is httplimit's grouping of the peer (IPv4 per
// address, IPv4-mapped as IPv4, IPv6 per /64 unless WithIPv6Prefix says
// otherwise), and a WithKey function is given that key, the method and
// the context.
func TestKeys(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	var got []string
	record := func(_ context.Context, method, client string) (string, error) {
		got = append(got, method+" "+client)
		return method + " " + client, nil
	}
	for _, tc := range []struct {
		addr string
		opts []grpclimit.Option
		want string
	}{
		{"203.0.113.7:443", nil, "203.0.113.7"},
		{"[::ffff:203.0.113.7]:443", nil, "203.0.113.7"},
		{"[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::2]:443", nil, "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"[2001:db8:1:2:aaaa::1]:443", []grpclimit.Option{grpclimit.WithIPv6Prefix(48)}, "2001:db8:1::/48"},
		{"[2001:db8::7]:443", []grpclimit.Option{grpclimit.WithIPv6Prefix(128)}, "2001:db8::7/128"},
	} {
		got = got[:0]
		opts := append([]grpclimit.Option{grpclimit.WithKey(record)}, tc.opts...)
		_, err := call(from(tc.addr), newLimiter(t, e, opts...), checkMethod)
		require.NoError(t, err)
		require.Equal(t, []string{checkMethod + " " + tc.want}, got, tc.addr)

		// Without WithKey, the grouped peer is the engine's key.
		before := e.KeyCount()
		_, err = call(from(tc.addr), newLimiter(t, e, tc.opts...), checkMethod)
		require.NoError(t, err)
		d, err := e.Peek(context.Background(), tc.want)
		require.NoError(t, err)
		require.Less(t, d.Remaining, int64(10), "%s charged %q", tc.addr, tc.want)
		require.LessOrEqual(t, e.KeyCount(), before+2)
	}

	// WithKey is called for a peer without an IP address, with client "".
	got = got[:0]
	_, err := call(context.Background(), newLimiter(t, e, grpclimit.WithKey(record)), "/s/M")
	require.NoError(t, err)
	require.Equal(t, []string{"/s/M "}, got)
}

// TestOptions: New refuses what it cannot use, with ErrInvalidOption.
func TestOptions(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(10, 1)})
	var nilEngine *engine.Engine
	_, err := grpclimit.New(nilEngine)
	require.ErrorIs(t, err, grpclimit.ErrInvalidOption)
	_, err = grpclimit.New(nil)
	require.ErrorIs(t, err, grpclimit.ErrInvalidOption)
	for _, opt := range []grpclimit.Option{
		nil,
		grpclimit.WithKey(nil),
		grpclimit.WithCost(nil),
		grpclimit.WithIPv6Prefix(31),
		grpclimit.WithIPv6Prefix(129),
		grpclimit.WithExempt(),
		grpclimit.WithExempt("grpc.health.v1.Health/Check"),
		grpclimit.WithExempt("/grpc.health.v1.Health"),
		grpclimit.WithExempt("/grpc.health.v1.Health/"),
		grpclimit.WithExempt("//Check"),
		grpclimit.WithExempt("/a/b/c"),
	} {
		_, err := grpclimit.New(e, opt)
		require.ErrorIs(t, err, grpclimit.ErrInvalidOption)
	}
	_, err = grpclimit.New(e, grpclimit.WithIPv6Prefix(32), grpclimit.WithIPv6Prefix(128), grpclimit.WithPerMessage())
	require.NoError(t, err)
}

// TestExemptDirect: exempt methods run without the engine being asked,
// even when it is closed; other methods are still decided.
func TestExemptDirect(t *testing.T) {
	e, _ := newEngine(t, engine.Config{Policy: pol(1, 1)})
	l := newLimiter(t, e, grpclimit.WithExempt(checkMethod), grpclimit.WithExempt("/grpc.health.v1.Health/Watch"))
	ctx := from("192.0.2.1:1")
	for range 5 {
		ran, err := call(ctx, l, checkMethod)
		require.NoError(t, err)
		require.True(t, ran)
	}
	require.Zero(t, e.KeyCount(), "exempt calls are not charged")
	_, err := call(ctx, l, "/grpc.testing.TestService/EmptyCall")
	require.NoError(t, err)
	_, err = call(ctx, l, "/grpc.testing.TestService/EmptyCall")
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	require.NoError(t, e.Close())
	_, err = call(ctx, l, checkMethod)
	require.NoError(t, err, "an exempt method does not depend on the engine")
}

// TestSaturatedPushbackIsHonoured: a refusal whose wait is the longest
// Duration (the engine's saturation) tells a grpc-go client with a retry
// policy to wait, not to retry at once: a pushback one millisecond longer
// overflows in grpc-go to a wait below 0.
func TestSaturatedPushbackIsHonoured(t *testing.T) {
	for _, d := range []engine.Decision{
		{RetryAfter: math.MaxInt64, Version: 1, Limit: 5},
		{Degraded: true, RetryAfter: math.MaxInt64, Version: 1, Limit: 5},
	} {
		var attempts atomic.Int32
		count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			attempts.Add(1)
			return h(ctx, req)
		}
		conn := serve(t, newLimiter(t, stub{d: d}), []grpc.UnaryServerInterceptor{count},
			retrying("grpc.health.v1.Health", 5, "RESOURCE_EXHAUSTED", "UNAVAILABLE"))
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond) // the client waits for it
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		require.Error(t, err)
		require.Equal(t, int32(1), attempts.Load(), "degraded %v: %v", d.Degraded, err)
	}
}

// TestUnixPeerHasNoIP: a peer on a Unix socket has no IP address, though
// the name of its socket, which the client chooses, reads as one: WithKey's
// function is told client "", and it is not keyed as that address.
func TestUnixPeerHasNoIP(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // the client's socket, "203.0.113.7:1", is made here
	e, _ := newEngine(t, engine.Config{Policy: pol(5, 1)})
	clients := make(chan string, 1)
	l := newLimiter(t, e, grpclimit.WithKey(func(_ context.Context, _ string, client string) (string, error) {
		clients <- client
		return "unix", nil
	}))
	lis, err := net.Listen("unix", filepath.Join(dir, "srv.sock"))
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(l.Unary))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.UnixAddr{Name: "203.0.113.7:1", Net: "unix"}}
		return d.DialContext(ctx, "unix", filepath.Join(dir, "srv.sock"))
	}
	conn, err := grpc.NewClient("passthrough:///x", grpc.WithContextDialer(dialer), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop(); wg.Wait() })
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, "", <-clients)
}
