package engine_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/engine/admissiontest"
)

// TestAdmission runs the behaviour suite every Admitter passes over the
// engine with one shard, a pair, and more shards than keys in most tests
// (16, and 64 as the engine's other tests use), so every routing shape (all
// keys together, split, scattered) is held to the same answers. Under the
// race detector only its Concurrent behaviours run (admissiontest.Concurrent).
func TestAdmission(t *testing.T) {
	for _, shards := range []int{1, 2, 16, 64} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			admissiontest.Run(t, func(t *testing.T, s admissiontest.Setup) engine.Admitter {
				if !admissiontest.Concurrent(t) {
					skipUnderRace(t)
				}
				e, err := engine.New(engine.Config{Policy: s.Policy, Clock: s.Clock, Shards: shards})
				require.NoError(t, err, "engine.New with %+v", s.Policy)
				t.Cleanup(func() { require.NoError(t, e.Close(), "Close in cleanup") })
				return e
			})
		})
	}
}
