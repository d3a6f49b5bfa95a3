package redisstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// closingCtx is a context that, the first time a call asks whether it has
// ended (Err or Done), cancels itself and closes the store: from that look
// on, both have happened.
type closingCtx struct {
	context.Context
	end func()
}

func (c *closingCtx) look() {
	if c.end != nil {
		end := c.end
		c.end = nil
		end()
	}
}

func (c *closingCtx) Err() error            { c.look(); return c.Context.Err() }
func (c *closingCtx) Done() <-chan struct{} { c.look(); return c.Context.Done() }

// TestClosedFirstWhenBothEnd: a call that finds its context ended once
// Close has begun returns ErrClosed, which comes first in the order of
// errors, not the context's error, with leases as without.
func TestClosedFirstWhenBothEnd(t *testing.T) {
	p := policy.Policy{Version: 1, Capacity: 10, Refill: policy.PerHour(10)}
	calls := map[string]func(ctx context.Context, s *redisstore.Store) error{
		"Allow":  func(ctx context.Context, s *redisstore.Store) error { _, err := s.Allow(ctx, "k", 1); return err },
		"Peek":   func(ctx context.Context, s *redisstore.Store) error { _, err := s.Peek(ctx, "k"); return err },
		"Refund": func(ctx context.Context, s *redisstore.Store) error { _, err := s.Refund(ctx, "k", 1); return err },
		"Charge": func(ctx context.Context, s *redisstore.Store) error { _, err := s.Charge(ctx, "k", 1); return err },
		"Wait":   func(ctx context.Context, s *redisstore.Store) error { _, err := s.Wait(ctx, "k", 1); return err },
		"AllowBatch": func(ctx context.Context, s *redisstore.Store) error {
			return s.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}}, make([]engine.Result, 2))
		},
		"AllowAll": func(ctx context.Context, s *redisstore.Store) error {
			_, _, err := s.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}})
			return err
		},
		"EvictFull": func(ctx context.Context, s *redisstore.Store) error { _, err := s.EvictFull(ctx); return err },
		"ReplacePolicy": func(ctx context.Context, s *redisstore.Store) error {
			return s.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 5, Refill: policy.PerHour(10)}, 1)
		},
	}
	for _, lz := range []*redisstore.Leases{nil, {}} {
		for name, call := range calls {
			s := newStore(t, redisstore.Config{Policy: p, Leases: lz}, clock.NewManual(0))
			inner, cancel := context.WithCancel(context.Background())
			ctx := &closingCtx{Context: inner, end: func() {
				cancel()
				require.NoError(t, s.Close())
			}}
			err := call(ctx, s)
			cancel()
			if !errors.Is(err, engine.ErrClosed) {
				t.Errorf("%s, leases %v: %v, want ErrClosed", name, lz != nil, err)
			}
		}
	}
}
