package shard

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/msg"
	"github.com/tokenshard/tokenshard/policy"
)

// A control kind added the way the package doc says, all in this file: the
// message (in package msg for a real kind), its handler on State, and the
// control that gates it and serves it on the loop. Nothing else in the
// package names it, yet the loop serves it.

// countMsg asks a shard how many keys it tracks at its reading.
type countMsg struct {
	Done chan countReply // one-slot buffer
}

type countReply struct {
	Keys    int
	Reading int64
}

// keysAt is the State's handler: it changes nothing.
func (s *State) keysAt(now int64) countReply { return countReply{Keys: s.keyCount(), Reading: now} }

// countCtl is the control: taken whenever the shard is not prepared.
type countCtl struct{ *countMsg }

func (countCtl) gate() gate       { return always }
func (c countCtl) serve(s *Shard) { c.Done <- s.state.keysAt(s.clk.Now()) }

// TestControlRecipe sends the new kind to a running shard and shows it
// served between data, by the State's handler, at the shard's reading.
func TestControlRecipe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(10))
		defer l.close()

		for _, k := range []string{"a", "b"} {
			r := allowAsync(t, l.mb, k, 1)
			clk <- 10
			require.NoError(t, (<-r).Err)
		}
		m := &countMsg{Done: make(chan countReply, 1)}
		sent := make(chan error, 1)
		go func() { sent <- l.mb.send(context.Background(), countCtl{m}) }()
		clk <- 42
		require.NoError(t, <-sent)
		assert.Equal(t, countReply{Keys: 2, Reading: 42}, <-m.Done)

		// The shard still serves data after it.
		r := allowAsync(t, l.mb, "c", 1)
		clk <- 50
		assert.NoError(t, (<-r).Err)
	})
}

// TestControlSenderGivesUp shows a sender whose context ends while the
// shard cannot take its message (a prepared shard listens to publish and
// abort alone) gets the context's error, and the shard goes on serving
// once the barrier ends: the wake-up the sender leaves costs nothing.
func TestControlSenderGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := make(gateClock)
		l := startLoop(p1, clk, NewBudget(10))
		defer l.close()

		prep := make(chan error, 1)
		go func() {
			prep <- l.mb.Prepare(context.Background(), NewLimits(policy.Policy{Version: 2, Capacity: 20, TokensPerSecond: 4}), &msg.Prepare{Done: make(chan error, 1)})
		}()
		clk <- 1
		require.NoError(t, <-prep)

		ctx, cancel := context.WithCancel(context.Background())
		m := &countMsg{Done: make(chan countReply, 1)}
		sent := make(chan error, 1)
		go func() { sent <- l.mb.send(ctx, countCtl{m}) }()
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-sent, context.Canceled)
		assert.Zero(t, l.mb.control.Load(), "the sender uncounted itself")

		require.True(t, l.mb.Abort())
		r := allowAsync(t, l.mb, "a", 1)
		clk <- 2
		assert.NoError(t, (<-r).Err)
		assert.Empty(t, m.Done, "the message was never taken")
	})
}
