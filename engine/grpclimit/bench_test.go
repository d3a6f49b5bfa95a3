package grpclimit_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/grpclimit"
)

// BenchmarkUnary measures what the interceptor adds to a call: the
// handler alone; the engine's Allow alone, for the same key; the handler
// behind the limiter (default key from the peer address, cost 1, an engine
// that always admits), and with WithCost (the context carries the estimate
// for Settle); and an exempt method, which only looks its name up.
func BenchmarkUnary(b *testing.B) {
	e, _ := newEngine(b, engine.Config{Policy: pol(1<<40, 1<<40)})
	l := newLimiter(b, e, grpclimit.WithExempt(checkMethod))
	ctx := from("192.0.2.1:5000")
	handler := func(context.Context, any) (any, error) { return nil, nil }
	limited := &grpc.UnaryServerInfo{FullMethod: "/grpc.testing.TestService/EmptyCall"}
	exempt := &grpc.UnaryServerInfo{FullMethod: checkMethod}

	b.Run("path=handler", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := handler(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("path=allow", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Allow(ctx, "192.0.2.1", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("path=limited", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Unary(ctx, nil, limited, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
	costed := newLimiter(b, e, grpclimit.WithCost(func(context.Context, string) int64 { return 2 }))
	b.Run("path=cost", func(b *testing.B) { // an estimate the handler may settle
		b.ReportAllocs()
		for b.Loop() {
			if _, err := costed.Unary(ctx, nil, limited, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("path=exempt", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Unary(ctx, nil, exempt, handler); err != nil {
				b.Fatal(err)
			}
		}
	})
}
