package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
	"github.com/tokenshard/tokenshard/policy"
)

// Every peer IP gets a bucket of 2 calls refilled at 1 per second, and
// health checks are never limited. A server passes l.Unary and l.Stream to
// grpc.NewServer (below); here the interceptor is called directly, as the
// server would, with a handler that answers "ok", and the Manual clock
// makes the output deterministic.
func ExampleLimiter_Unary() {
	e, err := engine.New(engine.Config{
		Policy: policy.Policy{Version: 1, Capacity: 2, TokensPerSecond: 1},
		Clock:  clock.NewManual(0), // a server leaves Clock nil
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()

	l, err := grpclimit.New(e, grpclimit.WithExempt("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"))
	if err != nil {
		panic(err)
	}
	_ = grpc.NewServer(grpc.UnaryInterceptor(l.Unary), grpc.StreamInterceptor(l.Stream))

	// The context a call from 203.0.113.7 has in the server.
	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("203.0.113.7:41000")),
	})
	handler := func(context.Context, any) (any, error) { return "ok", nil }
	for _, method := range []string{
		"/shop.Cart/Add", "/shop.Cart/Add", "/grpc.health.v1.Health/Check", "/shop.Cart/Add",
	} {
		res, err := l.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
		st := status.Convert(err)
		fmt.Println(method, st.Code(), res)
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("retry after", ri.GetRetryDelay().AsDuration())
			}
		}
	}
	d, _ := e.Peek(context.Background(), "203.0.113.7") // the key is the peer's IP
	fmt.Println(e.KeyCount(), d.Remaining)
	// Output:
	// /shop.Cart/Add OK ok
	// /shop.Cart/Add OK ok
	// /grpc.health.v1.Health/Check OK ok
	// /shop.Cart/Add ResourceExhausted <nil>
	// retry after 1s
	// 1 0
}
