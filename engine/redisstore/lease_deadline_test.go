package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/internal/redistest"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseCallEndsByItsDeadline: a leased store whose lease on a key was
// taken before another process's cutover gives it back before it asks Redis
// for the key's next decision (or charge). With Redis stalled (CLIENT
// PAUSE), that give-back and the decision share the call's deadline: Allow,
// AllowBatch and Charge end by it (the context's, or Config.Timeout if
// sooner) with the failure rule's Degraded answer and a nil error, as
// without leases, never with the context's error. On a server of its own:
// the pause would stall every test on a shared one.
func TestLeaseCallEndsByItsDeadline(t *testing.T) {
	t.Parallel() // waits on deadlines and outages; on a server of its own
	addr := redistest.Start(t).Addr()
	admin := client(t, addr)
	needPauseWrite(t, admin)
	ctx := context.Background()
	// A timeout long enough that half of it is slack for a loaded machine,
	// and still below the two timeouts a call without the shared deadline
	// takes.
	const timeout = time.Second
	for _, c := range []struct {
		name     string
		deadline time.Duration // the caller's, 0 for none
		call     string
	}{
		{"Allow, no deadline", 0, "allow"},
		{"Allow, deadline", 150 * time.Millisecond, "allow"},
		{"AllowBatch, deadline", 150 * time.Millisecond, "batch"},
		{"Charge, no deadline", 0, "charge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pol := policy.Policy{Version: 1, Capacity: 320, TokensPerSecond: 10}
			p := prefix(t)
			leased := realStores(t, addr, 1, redisstore.Config{Policy: pol, Prefix: p, Timeout: timeout,
				Leases: &redisstore.Leases{Horizon: time.Minute, MaxAge: time.Hour}})[0]
			other := realStores(t, addr, 1, redisstore.Config{Policy: pol, Prefix: p})[0]
			for range 40 {
				_, err := leased.Allow(ctx, "hot", 1)
				require.NoError(t, err)
			}
			require.NotZero(t, leased.Stats().LeasedTokens, "no lease taken on hot")
			require.NoError(t, other.ReplacePolicy(ctx, policy.Policy{Version: 2, Capacity: 320, TokensPerSecond: 20}, 1))
			_, err := leased.Allow(ctx, "other", 1) // the leased store meets version 2
			require.NoError(t, err)
			require.EqualValues(t, 2, leased.Policy().Version)

			unpause, err := pauseWrites(t, admin)
			require.NoError(t, err)
			cctx, cancel := ctx, context.CancelFunc(func() {})
			bound := timeout
			if c.deadline > 0 {
				cctx, cancel = context.WithTimeout(ctx, c.deadline)
				bound = c.deadline
			}
			defer cancel()
			start := time.Now()
			var d engine.Decision
			switch c.call {
			case "batch":
				out := make([]engine.Result, 2)
				err = leased.AllowBatch(cctx, []engine.Request{{Key: "hot", Cost: 1}, {Key: "hot", Cost: 1}}, out)
				require.NoError(t, err)
				require.NoError(t, out[1].Err, "the batch's second request")
				require.True(t, out[1].Decision.Degraded, "the batch's second request: %+v", out[1].Decision)
				d, err = out[0].Decision, out[0].Err
			case "charge":
				d, err = leased.Charge(cctx, "hot", 1)
			default:
				d, err = leased.Allow(cctx, "hot", 1)
			}
			took := time.Since(start)
			unpause() // Close gives the lease back
			require.NoError(t, err, "a deadline that passed during the call is the failure rule's, not the caller's error")
			require.True(t, d.Degraded, "%+v", d)
			// The bound plus half a timeout's slack for the race detector
			// and a loaded machine: without the shared deadline the call
			// took two timeouts.
			require.Less(t, took, bound+timeout/2, "the call took %v, its deadline %v", took, bound)
		})
	}
}
