package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/policy"
)

// Behind an Envoy at 10.0.0.5, each call's client is the address the proxy
// appended to x-forwarded-for; the address the client wrote in front of
// its own is ignored. The interceptor is called directly, as a server
// would call it.
func ExampleWithTrustedProxies() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 5, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	l, err := grpclimit.New(e, grpclimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))
	if err != nil {
		panic(err)
	}

	// The context of a call that Envoy forwarded for 203.0.113.7, which
	// claimed to be 198.51.100.1.
	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.5:41000")),
	})
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", "198.51.100.1, 203.0.113.7"))
	_, err = l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/shop.Cart/Add"},
		func(context.Context, any) (any, error) { return "ok", nil })
	fmt.Println(status.Code(err))
	d, _ := e.Peek(context.Background(), "203.0.113.7")
	fmt.Println(e.KeyCount(), d.Remaining)
	// Output:
	// OK
	// 1 4
}

// In shadow mode a limit of 2 calls refuses none of 4, and counts the 2 it
// would have refused; a closed engine's error is reported to the function
// of WithOnError, and let through too.
func ExampleWithShadow() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0),
	})
	if err != nil {
		panic(err)
	}
	l, err := grpclimit.New(e, grpclimit.WithShadow(),
		grpclimit.WithOnError(func(_ context.Context, method string, err error) {
			fmt.Println(method, status.Code(err), errors.Is(err, engine.ErrClosed))
		}))
	if err != nil {
		panic(err)
	}

	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("203.0.113.7:41000")),
	})
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Cart/Add"}
	handler := func(context.Context, any) (any, error) { return "ok", nil }
	for range 4 {
		res, err := l.Unary(ctx, nil, info, handler)
		fmt.Println(res, status.Code(err))
	}
	fmt.Printf("%+v\n", l.ShadowStats())

	_ = e.Close()
	res, err := l.Unary(ctx, nil, info, handler)
	fmt.Println(res, status.Code(err))
	fmt.Printf("%+v\n", l.ShadowStats())
	// Output:
	// ok OK
	// ok OK
	// ok OK
	// ok OK
	// {Refused:2 Degraded:0 Errors:0}
	// /shop.Cart/Add Unavailable true
	// ok OK
	// {Refused:2 Degraded:0 Errors:1}
}
