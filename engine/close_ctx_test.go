package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
)

// closingCtx is a context that, the kth time a call asks whether it has
// ended (Err or Done), cancels itself and starts the engine's Close, and
// answers only once Close has begun: from that check on, both have
// happened.
type closingCtx struct {
	context.Context
	asked atomic.Int64
	k     int64
	end   func()
}

func (c *closingCtx) check() {
	if c.asked.Add(1) == c.k {
		c.end()
	}
}

func (c *closingCtx) Err() error            { c.check(); return c.Context.Err() }
func (c *closingCtx) Done() <-chan struct{} { c.check(); return c.Context.Done() }

// blockedWriter tells entered of each Write, then blocks it until release
// is closed.
type blockedWriter struct{ entered, release chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.release
	return len(p), nil
}

// TestClosedBeforeContextWhenBothEnd: a call that finds its context ended
// once Close has begun returns ErrClosed, not the context's error, at
// every point where it looks at the context: before it sends, and while it
// waits for the coordinator, a shard's control channel, a snapshot's
// chunks or a Wait's estimate, where a select would pick either. The
// context ends, and Close begins, at the kth look, for every k the call
// reaches; a call that gets past its last look answers as usual (nil).
func TestClosedBeforeContextWhenBothEnd(t *testing.T) {
	type op struct {
		name string
		// prep readies e and returns what to undo once the call has
		// returned (nil for nothing).
		prep func(t *testing.T, e *engine.Engine) func()
		call func(ctx context.Context, e *engine.Engine) error
		// looks, if set, is the last look to try: a call that gets past
		// it waits for what only undo ends.
		looks int64
	}
	drain := func(t *testing.T, e *engine.Engine) func() {
		_, err := e.Allow(context.Background(), "k", 2)
		require.NoError(t, err)
		return nil
	}
	// holdCoordinator keeps the coordinator busy with a Snapshot whose
	// writer blocks, so that the call waits for it.
	holdCoordinator := func(t *testing.T, e *engine.Engine) func() {
		w := blockedWriter{entered: make(chan struct{}, 1), release: make(chan struct{})}
		done := make(chan error, 1)
		go func() { done <- e.Snapshot(context.Background(), w) }()
		<-w.entered // the coordinator is the Snapshot's
		return func() { close(w.release); <-done }
	}
	ops := []op{
		{name: "Allow", call: func(ctx context.Context, e *engine.Engine) error { _, err := e.Allow(ctx, "k", 1); return err }},
		{name: "Peek", call: func(ctx context.Context, e *engine.Engine) error { _, err := e.Peek(ctx, "k"); return err }},
		{name: "Refund", call: func(ctx context.Context, e *engine.Engine) error { _, err := e.Refund(ctx, "k", 1); return err }},
		{name: "Charge", call: func(ctx context.Context, e *engine.Engine) error { _, err := e.Charge(ctx, "k", 1); return err }},
		{name: "Wait", prep: drain, call: func(ctx context.Context, e *engine.Engine) error { _, err := e.Wait(ctx, "k", 1); return err }},
		{name: "AllowBatch", call: func(ctx context.Context, e *engine.Engine) error {
			out := make([]engine.Result, 8)
			return e.AllowBatch(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}, {Key: "c", Cost: 1}, {Key: "d", Cost: 1}}, out)
		}},
		{name: "AllowAll", call: func(ctx context.Context, e *engine.Engine) error {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}, {Key: "c", Cost: 1}})
			return err
		}},
		{name: "EvictFull", call: func(ctx context.Context, e *engine.Engine) error { _, err := e.EvictFull(ctx); return err }},
		// Its looks: before it waits, then its wait.
		{name: "EvictFull behind the coordinator", prep: holdCoordinator, call: func(ctx context.Context, e *engine.Engine) error { _, err := e.EvictFull(ctx); return err }, looks: 2},
		{name: "ReplacePolicy", call: func(ctx context.Context, e *engine.Engine) error { return e.ReplacePolicy(ctx, pol(2, 2, 1000), 1) }},
		{name: "Snapshot", prep: drain, call: func(ctx context.Context, e *engine.Engine) error { return e.Snapshot(ctx, io.Discard) }},
	}
	for _, o := range ops {
		t.Run(o.name, func(t *testing.T) {
			for k := int64(1); o.looks == 0 || k <= o.looks; k++ {
				// The system's clock (Config.Clock nil): a Wait's estimate
				// passes in a millisecond when no look ends it.
				e, err := engine.New(engine.Config{Policy: pol(1, 2, 1000), Shards: 4})
				require.NoError(t, err)
				t.Cleanup(func() { _ = e.Close() })
				var undo func()
				if o.prep != nil {
					undo = o.prep(t, e)
				}
				closed := make(chan error, 1)
				inner, cancel := context.WithCancel(context.Background())
				ctx := &closingCtx{Context: inner, k: k, end: func() {
					cancel()
					go func() { closed <- e.Close() }()
					<-engine.Closing(e)
				}}
				err = o.call(ctx, e)
				if undo != nil {
					undo()
				}
				cancel()
				if ctx.asked.Load() < k {
					require.NoError(t, err, "a call that never looked at its context a %dth time", k)
					require.NoError(t, e.Close())
					return
				}
				require.NoError(t, <-closed)
				if err != nil && !errors.Is(err, engine.ErrClosed) {
					t.Fatalf("%s: %v, want ErrClosed or nil, with the context ended and Close begun at its look %d", o.name, err, k)
				}
				if k > 1000 {
					panic(fmt.Sprintf("%s looked at its context over %d times", o.name, k))
				}
			}
		})
	}
}
