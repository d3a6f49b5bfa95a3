package engine_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tokenshard/tokenshard/clock"
	"github.com/tokenshard/tokenshard/engine"
	"github.com/tokenshard/tokenshard/policy"
)

// TestMain fails the package if any test leaves a goroutine behind; there
// are no ignores, because an engine that has been closed owns none.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// skipUnderRace skips a sequential check against the math/big model under
// the race detector: one caller drives the engine, so the detector watches
// only the hand-offs to the shards, which the concurrent tests run under
// it, and these checks took a third of the package's race run. `go test
// work` without -race runs them, and so does CI, after the race step.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("a sequential check against the model: `go test work` without -race runs it")
	}
}

// shardCounts is the table every behaviour test runs over: one shard, a
// pair, more shards than cores, and many.
var shardCounts = []int{1, 2, 16, 64}

// pol builds a policy without field names cluttering every table row.
func pol(version, capacity, rate int64) policy.Policy {
	return policy.Policy{Version: version, Capacity: capacity, TokensPerSecond: rate}
}

// newEngine starts an engine for one test and closes it when the test ends.
// A nil Clock is replaced by a Manual clock at 0, returned for the test to
// drive.
func newEngine(t testing.TB, cfg engine.Config) (*engine.Engine, *clock.Manual) {
	t.Helper()
	var clk *clock.Manual
	if cfg.Clock == nil {
		clk = clock.NewManual(0)
		cfg.Clock = clk
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatalf("engine.New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, clk
}

// doneContexts are the two ways a context is already done when a call
// starts: canceled, and past its deadline, with the error each must yield.
var doneContexts = []struct {
	name string
	ctx  func() (context.Context, context.CancelFunc)
	want error
}{
	{"canceled", func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}, context.Canceled},
	{"deadline", func() (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(-time.Hour))
	}, context.DeadlineExceeded},
}
