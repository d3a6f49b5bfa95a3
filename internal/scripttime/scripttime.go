// Package scripttime lets this module's tests and harnesses drive a Redis
// store's time with a clock instead of the server's TIME.
//
// In production the time authority is the Redis server, so that processes
// with skewed clocks cannot mint tokens; the override must not be reachable
// from outside. Being internal, this package can only be imported by
// tokenshard's own packages: redisstore.New honours a clock carried by its
// context, and only code in this module can put one there.
package scripttime

import (
	"context"

	"github.com/tokenshard/tokenshard/clock"
)

type key struct{}

// With returns ctx carrying c. A redisstore.New given it reads time from c
// and sets no expiries (they would run on the server's clock).
func With(ctx context.Context, c clock.Clock) context.Context {
	return context.WithValue(ctx, key{}, c)
}

// From returns the clock ctx carries, or nil.
func From(ctx context.Context) clock.Clock {
	c, _ := ctx.Value(key{}).(clock.Clock)
	return c
}
