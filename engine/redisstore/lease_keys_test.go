package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine/redisstore"
	"github.com/tokenshard/tokenshard/policy"
)

// TestLeaseNoEntryForUnleasedKeys: a Charge, Peek or Refund on a key this
// process holds no lease for leaves no entry in the lease shards' tables,
// so a stream of them on distinct keys grows nothing until the idle sweep;
// only the key Allow leased keeps one.
func TestLeaseNoEntryForUnleasedKeys(t *testing.T) {
	ctx := context.Background()
	s := leased(t, policy.Policy{Version: 1, Capacity: 100, TokensPerSecond: 1}, clock.NewManual(0), prefix(t))
	warm(t, s, "leased")
	for i := range 100 {
		for _, do := range []func(string) error{
			func(k string) error { _, err := s.Charge(ctx, k, 3); return err },
			func(k string) error { _, err := s.Peek(ctx, k); return err },
			func(k string) error { _, err := s.Refund(ctx, k, 1); return err },
		} {
			require.NoError(t, do(fmt.Sprint("unleased", i)))
		}
	}
	require.NoError(t, s.Close())
	require.Equal(t, 1, redisstore.LeaseKeys(s), "only the leased key has an entry")
}
